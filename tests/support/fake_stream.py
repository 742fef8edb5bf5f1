"""Streamed replies for the fake provider server (``tests.support.fakes.FakeProvider``): server-sent
events over chunked HTTP, as the OpenAI and Anthropic APIs send them with ``stream: true``,
and the ways a stream goes wrong.

``streaming(events, ...)`` is a behaviour for ``FakeProvider.add``. It records on the fake
when each event left (``fake.sent_at``) and when the client closed the connection
(``fake.closed_at``), so tests can time what the turn did with them.
"""

import itertools
import json
import select
import socket
import time

from tests.support.fakes import Reply


def openai_stream(text="", *, calls=(), pieces=None, finish=None, prompt_tokens=11, completion_tokens=7,
                  done=True):
    """The events of a streamed Chat Completion: ``text`` in ``pieces`` (default: word by word), then
    each call ``(id, name, arguments)`` with its arguments in fragments of 7 characters, the
    finish reason, the usage chunk and ``[DONE]``."""
    def chunk(delta=None, finish_reason=None, usage=None, choices=True):
        body = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake-model",
                "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}] if choices else [],
                "usage": usage}
        return json.dumps(body)

    events = [chunk({"role": "assistant", "content": ""})]
    for piece in (pieces if pieces is not None else words(text)):
        events.append(chunk({"content": piece}))
    for index, (call_id, name, arguments) in enumerate(calls):
        raw = json.dumps(arguments)
        events.append(chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                             "function": {"name": name, "arguments": ""}}]}))
        for start in range(0, len(raw), 7):
            events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": raw[start:start + 7]}}]}))
    events.append(chunk(finish_reason=finish or ("tool_calls" if calls else "stop")))
    events.append(chunk(usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                               "total_tokens": prompt_tokens + completion_tokens}, choices=False))
    if done:
        events.append("[DONE]")
    return [(None, data) for data in events]


def anthropic_stream(text="", *, calls=(), pieces=None, stop_reason=None, input_tokens=21, output_tokens=9,
                     done=True):
    """The events of a streamed Messages reply: a text block in ``pieces`` (default: word by word),
    then a ``tool_use`` block per call ``(id, name, arguments)`` with its input in fragments."""
    def event(name, **body):
        return name, json.dumps({"type": name, **body})

    events = [event("message_start", message={
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "claude-fake", "content": [],
        "stop_reason": None, "usage": {"input_tokens": input_tokens, "output_tokens": 1}}), event("ping")]
    index = 0
    if text or pieces:
        events.append(event("content_block_start", index=0, content_block={"type": "text", "text": ""}))
        for piece in (pieces if pieces is not None else words(text)):
            events.append(event("content_block_delta", index=0, delta={"type": "text_delta", "text": piece}))
        events.append(event("content_block_stop", index=0))
        index = 1
    for offset, (call_id, name, arguments) in enumerate(calls):
        block = index + offset
        events.append(event("content_block_start", index=block,
                            content_block={"type": "tool_use", "id": call_id, "name": name, "input": {}}))
        raw = json.dumps(arguments)
        for start in range(0, len(raw), 7):
            events.append(event("content_block_delta", index=block,
                                delta={"type": "input_json_delta", "partial_json": raw[start:start + 7]}))
        events.append(event("content_block_stop", index=block))
    events.append(event("message_delta", delta={"stop_reason": stop_reason or ("tool_use" if calls else "end_turn"),
                                                "stop_sequence": None}, usage={"output_tokens": output_tokens}))
    if done:
        events.append(event("message_stop"))
    return events


def anthropic_error_event(kind="overloaded_error", message="Overloaded"):
    return "error", json.dumps({"type": "error", "error": {"type": kind, "message": message}})


def words(text):
    """``text`` cut after each space, as a model's tokens arrive."""
    pieces, current = [], ""
    for char in text:
        current += char
        if char == " ":
            pieces.append(current)
            current = ""
    return pieces + ([current] if current else [])


def encode(event):
    """One ``(name, data)`` pair as SSE bytes; raw ``bytes`` are sent as they are."""
    if isinstance(event, bytes):
        return event
    name, data = event
    head = f"event: {name}\n" if name else ""
    return (head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n").encode()


def streaming(events, *, interval=0.0, then="end", first_delay=0.0):
    """A behaviour: 200 ``text/event-stream`` sent chunked, one event per chunk, ``interval``
    seconds apart; afterwards ``then``: ``"end"`` (the last chunk, connection kept), ``"hang"``
    (silence until the client leaves) or ``"reset"`` (an RST)."""
    def behaviour(handler):
        fake = handler.server.fake
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        handler.wfile.flush()
        if first_delay and _client_left(handler, first_delay):
            return
        for number, event in enumerate(events):
            if number and interval and _client_left(handler, interval):
                return
            data = encode(event)
            try:
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
            except OSError:
                fake.closed_at = time.monotonic()
                return
            fake.sent_at.append(time.monotonic())
        if then == "end":
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        elif then == "reset":
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            handler.connection.close()
            handler.close_connection = True
        else:
            _client_left(handler, 3600)
            handler.close_connection = True
    return behaviour


def _client_left(handler, seconds):
    """Wait ``seconds``, watching the connection; True (and ``fake.closed_at`` set) if the client
    closed or reset it meanwhile, or the test ended."""
    fake = handler.server.fake
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not fake.stop_event.is_set():
        readable, _, _ = select.select([handler.connection], [], [], min(0.01, max(0.0, deadline - time.monotonic())))
        if readable:
            try:
                gone = handler.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                gone = True
            if gone:
                fake.closed_at = time.monotonic()
                handler.close_connection = True
                return True
    return fake.stop_event.is_set()


def refuses_streaming(status=400):
    """What an endpoint without streaming answers to ``stream: true`` (e.g. an old local server)."""
    return Reply(status, {"error": {"message": "stream is not supported", "type": "invalid_request_error",
                                    "param": "stream"}})


def endless(first, again):
    """Events for ``streaming()`` that never end: the events ``first``, then the event ``again``
    over and over (a hostile or runaway endpoint); the server stops when the client leaves."""
    return itertools.chain(first, itertools.repeat(again))
