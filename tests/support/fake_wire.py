"""Reply builders for the fake provider server (``tests.support.fakes.FakeProvider``) in other wire
formats: Anthropic Messages replies and errors, and OpenAI-style error bodies.

Each builder returns what the real API sends, field for field, so that the official clients
parse it (``tests/providers/test_official_clients.py`` checks that).
"""

from tests.support.fakes import Reply


def anthropic_message(content, *, stop_reason="end_turn", input_tokens=21, output_tokens=9,
                      model="claude-fake", cache_read_input_tokens=0):
    """A Messages reply; ``content`` is a list of blocks (see ``text_block``/``tool_use_block``) or a text."""
    if isinstance(content, str):
        content = [text_block(content)]
    return {
        "id": "msg_fake01", "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": cache_read_input_tokens},
    }


def text_block(text):
    return {"type": "text", "text": text}


def tool_use_block(name, arguments, id="toolu_01"):
    return {"type": "tool_use", "id": id, "name": name, "input": arguments}


def anthropic_tool_use(*calls, text="", **kwargs):
    """A Messages reply asking for tools: each call is ``(name, arguments)`` or ``(id, name, arguments)``."""
    blocks = [text_block(text)] if text else []
    for number, call in enumerate(calls, start=1):
        call_id, name, arguments = call if len(call) == 3 else (f"toolu_{number:02d}", *call)
        blocks.append(tool_use_block(name, arguments, id=call_id))
    return anthropic_message(blocks, stop_reason="tool_use", **kwargs)


def anthropic_error(status, kind, message):
    """An Anthropic error reply: ``{"type": "error", "error": {"type", "message"}}``."""
    return Reply(status, {"type": "error", "error": {"type": kind, "message": message},
                          "request_id": "req_fake"}, {"request-id": "req_fake"})


def openai_error(status, message, *, type="invalid_request_error", code=None, param=None):
    """An OpenAI error reply: ``{"error": {"message", "type", "param", "code"}}``."""
    return Reply(status, {"error": {"message": message, "type": type, "param": param, "code": code}})


def run_turn_here(content, *, conversation=None, tools=None):
    """Save ``content`` as a visitor's message and run its turn in this process (the runner
    itself, no RQ) under the test's settings; return the turn, refreshed from the database.

    For tests of what a provider sends and receives; tests that need the real forking worker
    post through the API and call the ``worker`` fixture instead.
    """
    from conversations.core.budget import TurnClock
    from conversations.conf import get_config
    from conversations.models import Conversation, Message, Turn
    from conversations.engine.runner import TurnRunner

    cfg = get_config()
    conversation = conversation or Conversation.objects.create(owner_token="visitor-token")
    turn = Turn.objects.create(conversation=conversation)
    Message.objects.create(conversation=conversation, turn=turn, role="user", content=content)
    TurnRunner(turn, clock=TurnClock(cfg["JOB_TIMEOUT"], cfg["DEADLINE_MARGIN"]), config=cfg, tools=tools).run()
    turn.refresh_from_db()
    return turn


def run_error_cases(fake, cases, *, secret):
    """Run one turn per case of ``cases`` (``{case: (behaviour, words)}``) against ``fake`` and
    check that each makes one call (run it with ``MAX_ATTEMPTS`` 1) and fails with ``words`` in
    its error and ``secret`` in neither its error nor its call records.

    Returns ``{case: the turn's error}``."""
    from conversations.models import CallRecord

    errors = {}
    for case, (behaviour, words) in cases.items():
        fake.add(behaviour)
        sent = len(fake.requests)
        turn = run_turn_here(f"question for {case}")
        assert len(fake.requests) == sent + 1, case  # the error is the scripted reply's, not a retry's
        assert turn.status == "failed", case
        assert words in turn.error, (case, turn.error)
        errors[case] = turn.error
        details = " ".join(CallRecord.objects.filter(turn=turn).values_list("detail", flat=True))
        assert secret not in turn.error + details, case
    return errors
