"""Stream parser benchmark: how fast ``streaming.EventDecoder`` reads what a hostile or chatty
endpoint sends, in bytes per second of one worker core.

    .venv/bin/python -m bench.sse_parser [--megabytes 4] [--runs 3]

Bodies, each fed in 64 KiB reads as ``http.BudgetedHTTP`` does (``read1(65536)``):

- comments: ``: keep-alive`` lines only (a flood that carries no event);
- blank lines: ``\\n`` only;
- text events: an OpenAI-style chunk of one word per event, the ordinary case.

``before`` is the parser as it was until the linear rewrite (kept below only to compare, in the
same run on the same machine): it looked for each line end by walking the buffer from its start
and sliced the buffer after every line, so a 64 KiB read of short lines cost a copy of the rest
of the read per line.
"""

import argparse
import time

from bench.common import machine, median, table
from conversations.core.streaming import MAX_EVENT_BYTES, EventDecoder

READ = 65536


class QuadraticDecoder(EventDecoder):
    """The decoder before the rewrite (same events, quadratic in the lines of one read)."""

    def __init__(self, max_event_bytes=MAX_EVENT_BYTES):
        super().__init__(max_event_bytes)
        self._buffer = b""

    def feed(self, chunk):
        self._buffer += chunk
        events = []
        while True:
            end = self._line_end()
            if end is None:
                break
            stop, skip = end
            line = self._buffer[:stop].decode("utf-8", "replace")
            self._buffer = self._buffer[stop + skip:]
            if line == "":
                event, data = self._event or "message", self._data
                self._event, self._data, self._size = "", [], 0
                if data:
                    events.append((event, "\n".join(data)))
            elif not line.startswith(":"):
                self._field(line)
        self._check_size(len(self._buffer))
        return events

    def _line_end(self):
        for index, byte in enumerate(self._buffer):
            if byte == 0x0A:
                return index, 1
            if byte == 0x0D:
                if index + 1 == len(self._buffer):
                    return None
                return index, 2 if self._buffer[index + 1] == 0x0A else 1
        return None


def bodies(size):
    chunk = b'data: {"choices": [{"index": 0, "delta": {"content": "word "}}]}\n\n'
    return {
        "comments": b": keep-alive\n" * (size // 13),
        "blank lines": b"\n" * size,
        "text events": chunk * (size // len(chunk)),
    }


def rate(decoder_class, body):
    """Bytes per second for feeding ``body`` in 64 KiB reads; the number of events, to check both agree."""
    decoder = decoder_class()
    started = time.perf_counter()
    events = 0
    for start in range(0, len(body), READ):
        events += len(decoder.feed(body[start:start + READ]))
    return len(body) / (time.perf_counter() - started), events


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=4)
    parser.add_argument("--before-megabytes", type=float, default=0.5,
                        help="body size for the old parser (it is too slow for the full size)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(machine())
    rows = []
    after = bodies(int(args.megabytes * 1024 * 1024))
    before = bodies(int(args.before_megabytes * 1024 * 1024))
    for name in after:
        old = [rate(QuadraticDecoder, before[name]) for _ in range(args.runs)]
        new = [rate(EventDecoder, after[name]) for _ in range(args.runs)]
        # Same body, both parsers: the same events.
        assert rate(QuadraticDecoder, before[name])[1] == rate(EventDecoder, before[name])[1]
        old_rate, new_rate = median([r for r, _ in old]), median([r for r, _ in new])
        rows.append((name, f"{old_rate / 1024:,.0f} KiB/s", f"{new_rate / 1024:,.0f} KiB/s",
                     f"{new_rate / old_rate:,.0f}×"))
    table(["body", "before", "after", "speed-up"], rows)


if __name__ == "__main__":
    main()
