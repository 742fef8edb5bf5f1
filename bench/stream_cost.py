"""Stream cost: the CPU one process spends per streamed word, with many streams read at once in
its threads, as a ``ConcurrentWorker``'s turns read them.

    .venv/bin/python -m bench.stream_cost [--streams 200] [--words 100] [--runs 3]

The fake provider of ``bench.crowd`` (a process of its own) streams ``--words`` words to each of
``--streams`` threads, one word every 0.1 s. Each thread reads its stream as
``http.BudgetedHTTP`` does (``read1(65536)``, ``EventDecoder``, ``OpenAIStream``), through a
session of ``watchdog.new_session()``, in two ways, in turn:

- ``read only`` (the baseline): no watchdog;
- ``read under a watchdog``: inside a ``Watchdog`` that looks at a stop flag every 0.1 s, as every
  provider call does.

CPU is this process's (``time.process_time``), divided by the words read.
"""

import argparse
import json
import threading
import time

from bench.common import machine, median, table


def read_streams(url, streams, watched):
    """Read ``streams`` streams at once in as many threads; returns (words read, CPU seconds, wall seconds)."""
    from conversations.core.streaming import EventDecoder, OpenAIStream
    from conversations.infra.watchdog import Watchdog, new_session

    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "q"}]}).encode()
    words, lock = [0], threading.Lock()

    def read():
        reply = new_session().post(url + "/chat/completions", data=body, stream=True, timeout=(10, 60),
                                   headers={"Content-Type": "application/json"})
        decoder, stream, count = EventDecoder(), OpenAIStream(), 0
        while not stream.done:
            chunk = reply.raw.read1(65536)
            if not chunk:
                break
            for event, data in decoder.feed(chunk):
                count += bool(stream.feed(event, data))
        reply.close()
        with lock:
            words[0] += count

    def one():
        if watched:
            with Watchdog(60, cancelled=lambda: False):
                read()
        else:
            read()

    threads = [threading.Thread(target=one) for _ in range(streams)]
    cpu, wall = time.process_time(), time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return words[0], time.process_time() - cpu, time.monotonic() - wall


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--words", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatproject.settings")
    from bench.crowd import ProviderProcess

    print(machine())
    provider = ProviderProcess(args.words)  # before Django is set up: a plain fork
    import django

    django.setup()
    try:
        results = {False: [], True: []}
        for _ in range(args.runs):  # in turn, so that drift in the machine's load hits both alike
            for watched in (False, True):
                words, cpu, _ = read_streams(provider.url, args.streams, watched)
                results[watched].append(cpu / words * 1e6)
    finally:
        provider.close()
    base = median(results[False])
    print(f"\n{args.streams} streams at once, {args.words} words each one every 0.1 s; median of {args.runs} runs\n")
    table(["reading", "CPU µs per word", "per run", "vs read only"],
          [[name, f"{median(results[watched]):.0f}", ", ".join(f"{v:.0f}" for v in results[watched]),
            f"{median(results[watched]) / base:.2f}"]
           for name, watched in (("read only", False), ("read under a watchdog", True))])


if __name__ == "__main__":
    main()
