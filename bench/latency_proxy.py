"""A TCP proxy that delays every chunk it forwards by a fixed time, each way: a database server on
another host, for a benchmark on one machine (no ``tc netem`` needed, which a container may lack).

    .venv/bin/python -m bench.latency_proxy --to 127.0.0.1:5432 --delay-ms 0.25 [--port 0]

Prints the port it listens on (on 127.0.0.1), then forwards each connection to ``--to``, each chunk
written ``--delay-ms`` after it was read, in order: a request and its answer take twice that more
than they would directly. Threads, not an event loop: ``time.sleep`` keeps sub-millisecond delays,
where asyncio's epoll waits round up to whole milliseconds. ``bench.common.Stack`` starts it when
``BENCH_DB_LATENCY_MS`` is set.
"""

import argparse
import queue
import socket
import subprocess
import sys
import threading
import time


def pump(source, target, delay):
    """Forward what ``source`` sends to ``target``, each chunk ``delay`` seconds after it arrived."""
    chunks = queue.SimpleQueue()

    def write():
        while (item := chunks.get()) is not None:
            due, data = item
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            try:
                target.sendall(data)
            except OSError:
                break
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        while data := source.recv(65536):
            chunks.put((time.monotonic() + delay, data))
    except OSError:
        pass
    chunks.put(None)
    writer.join()


def start(delay_ms, to="127.0.0.1:5432"):
    """Start this proxy in a process of its own in front of ``to``; returns ``(process, port)``."""
    from bench.common import PYTHON, ROOT

    process = subprocess.Popen([PYTHON, "-m", "bench.latency_proxy", "--to", to, "--delay-ms", str(delay_ms)],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    return process, int(process.stdout.readline())


def serve(listener, host, port, delay):
    while True:
        client, _ = listener.accept()
        server = socket.create_connection((host, port))
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for source, target in ((client, server), (server, client)):
            threading.Thread(target=pump, args=(source, target, delay), daemon=True).start()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", required=True, help="host:port to forward to")
    parser.add_argument("--delay-ms", type=float, required=True, help="added to each chunk, each way")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free one)")
    args = parser.parse_args()
    host, port = args.to.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", args.port), backlog=128)
    print(listener.getsockname()[1], flush=True)
    try:
        serve(listener, host, int(port), args.delay_ms / 1000)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
