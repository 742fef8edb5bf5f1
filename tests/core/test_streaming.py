"""Reading streamed replies: server-sent events split anywhere, and both wire formats added up
into the reply the same API sends unstreamed (so each provider parses one shape)."""

import json

import pytest

from conversations.providers.anthropic import AnthropicProvider
from conversations.providers.openai import OpenAIProvider
from conversations.core.streaming import AnthropicStream, EventDecoder, OpenAIStream, StreamError


def decode_in_pieces(body, size):
    decoder = EventDecoder()
    events = []
    for start in range(0, len(body), size):
        events += decoder.feed(body[start:start + size])
    return events


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_events_are_decoded_however_the_body_is_cut_and_whatever_its_line_ends(size, newline):
    lines = [b": keep-alive", b"", b"event: message_start", b"data: {\"a\":", b"data:  1}", b"", b"data:x",
             b"id: 7", b"retry: 10", b"", b"event: empty", b"", b"data: \xc3\xa9t\xc3\xa9", b"", b"", b""]
    body = newline.join(lines)
    assert decode_in_pieces(body, size) == [("message_start", '{"a":\n 1}'), ("message", "x"), ("message", "été")]


def test_an_event_without_its_blank_line_is_not_dispatched():
    assert EventDecoder().feed(b"data: half") == []


def test_an_oversized_event_is_refused_before_it_fills_memory():
    decoder = EventDecoder(max_event_bytes=100)
    with pytest.raises(StreamError) as raised:
        for _ in range(20):
            decoder.feed(b"data: " + b"x" * 10 + b"\n")
    assert raised.value.code == "bad_response"
    with pytest.raises(StreamError):
        EventDecoder(max_event_bytes=100).feed(b"data: " + b"y" * 200)  # no line end yet


def openai_chunk(delta=None, finish=None, usage=None, choices=True):
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    if choices:
        chunk["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    return json.dumps(chunk)


def test_openai_chunks_add_up_to_a_completion_with_text_tool_calls_and_usage():
    stream = OpenAIStream()
    added = [stream.feed("message", openai_chunk({"role": "assistant", "content": ""})),
             stream.feed("message", openai_chunk({"content": "Let me "})),
             stream.feed("message", openai_chunk({"content": "check."}))]
    pieces = [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "search_faq", "arguments": ""}},
              {"index": 0, "function": {"arguments": '{"que'}}, {"index": 0, "function": {"arguments": 'ry": "re'}},
              {"index": 1, "id": "call_2", "function": {"name": "current_time", "arguments": '{"city":'}},
              {"index": 0, "function": {"arguments": 'funds"}'}}, {"index": 1, "function": {"arguments": '"Tokyo"}'}}]
    for piece in pieces:
        stream.feed("message", openai_chunk({"tool_calls": [piece]}))
    stream.feed("message", openai_chunk(finish="tool_calls"))
    stream.feed("message", openai_chunk(usage={"prompt_tokens": 30, "completion_tokens": 12}, choices=False))
    assert not stream.done
    stream.feed("message", "[DONE]")

    assert stream.done and added == ["", "Let me ", "check."]
    reply = OpenAIProvider({}).parse(stream.reply())
    assert reply.text == "Let me check." and reply.finish == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_1", "search_faq", {"query": "refunds"}), ("call_2", "current_time", {"city": "Tokyo"})]
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (30, 12)


def test_an_openai_stream_cut_short_still_gives_the_text_so_far():
    stream = OpenAIStream()
    stream.feed("message", openai_chunk({"content": "Half an "}))
    stream.feed("message", openai_chunk({"content": "answer"}))
    reply = OpenAIProvider({}).parse(stream.reply())
    assert not stream.done and reply.text == "Half an answer" and reply.usage is None


@pytest.mark.parametrize("data, code", [
    ("{not json", "bad_response"),
    ("[1, 2]", "bad_response"),
    # An error chunk is handed on whole, for the provider to read like an HTTP error body.
    (json.dumps({"error": {"message": "The server had an error", "type": "server_error"}}), ""),
])
def test_a_malformed_or_error_chunk_ends_an_openai_stream(data, code):
    with pytest.raises(StreamError) as raised:
        OpenAIStream().feed("message", data)
    assert raised.value.code == code
    assert raised.value.body == (json.loads(data) if code == "" else None)


def anthropic_events(*events):
    return [(name, json.dumps({"type": name, **body})) for name, body in events]


def test_anthropic_events_add_up_to_a_message_with_text_tool_input_and_usage():
    stream = AnthropicStream()
    events = anthropic_events(
        ("message_start", {"message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                                       "usage": {"input_tokens": 40, "cache_read_input_tokens": 10,
                                                 "output_tokens": 1}}}),
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        ("ping", {}),
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Looking "}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "it up."}}),
        ("content_block_stop", {"index": 0}),
        ("content_block_start", {"index": 1, "content_block": {"type": "tool_use", "id": "toolu_1",
                                                               "name": "search_faq", "input": {}}}),
        ("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        ("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"query": "ref'}}),
        ("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": 'unds"}'}}),
        ("content_block_stop", {"index": 1}),
        ("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 25}}),
    )
    added = [stream.feed(name, data) for name, data in events]
    assert not stream.done
    stream.feed("message_stop", json.dumps({"type": "message_stop"}))

    assert stream.done and "".join(added) == "Looking it up."
    reply = AnthropicProvider({}).parse(stream.reply())
    assert reply.text == "Looking it up." and reply.finish == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [("toolu_1", "search_faq", {"query": "refunds"})]
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (50, 25)


def test_an_anthropic_error_event_ends_the_stream_and_is_handed_on_whole():
    stream = AnthropicStream()
    stream.feed("content_block_delta", json.dumps({"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "text_delta", "text": "Part"}}))
    with pytest.raises(StreamError) as raised:
        stream.feed("error", json.dumps({"type": "error", "error": {"type": "overloaded_error",
                                                                    "message": "Overloaded"}}))
    assert raised.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert AnthropicProvider({}).parse(stream.reply()).text == "Part"


@pytest.mark.parametrize("flood", [b": keep-alive\n", b"\n", b"\r\n"])
def test_a_flood_of_comments_or_blank_lines_is_read_in_linear_time(flood):
    # 4 MiB in the 64 KiB reads the HTTP client makes: well under a second when linear; the
    # quadratic parser took 10 s and more (about 400 KiB/s), a worker core busy all along.
    import time

    body = flood * (4 * 1024 * 1024 // len(flood)) + b"data: end\n\n"
    started = time.perf_counter()
    assert decode_in_pieces(body, 65536) == [("message", "end")]
    assert time.perf_counter() - started < 3
