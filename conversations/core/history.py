"""What the model is sent: transcript rows as ``ChatMessage``s, and the history trimmed to fit.

Called by the runner before each model call; no database or network access here.
"""

from .types import ChatMessage, ToolCall


def staff_reply(content):
    """A staff member's reply as the model reads it (see ``chat_message``)."""
    return f"[A person from the site's staff wrote to the visitor:] {content}"


def chat_message(row):
    """A ``Message`` row as a ``ChatMessage`` for a provider.

    A staff message (a person answered while the conversation was handed to them) goes as
    assistant-role text, marked: the visitor read it as the site's side of the conversation, so as
    a user message it would put the staff's words in the visitor's mouth, and neither API takes a
    system message in the middle of a history. The mark keeps the model from taking them for
    its own promises.
    """
    if row.role == "staff":
        return ChatMessage(role="assistant", content=staff_reply(row.content))
    return ChatMessage(
        role=row.role,
        content=row.content,
        tool_calls=[ToolCall(c["id"], c["name"], c.get("arguments") or {}) for c in (row.tool_calls or [])],
        tool_call_id=row.tool_call_id,
        name=row.tool_name,
        is_error=row.is_error,
    )


def message_size(message):
    """The characters of ``message`` that go to the model (its text and its tool calls)."""
    return len(message.content or "") + sum(len(str(c.arguments)) + len(c.name) for c in message.tool_calls)


def interrupted_message():
    return "Error: this tool call was not run (the turn ended first)."


def _paired(messages):
    """``messages`` with every tool call answered by exactly one result right after it.

    A turn that was cancelled or ran out of time between a tool call and its result leaves a
    call without a result (or, rarer, a result without its call) in the transcript; both APIs
    refuse such a history, so a missing result becomes an error result and a stray one goes.
    """
    paired, pending = [], {}
    for message in messages:
        if message.role == "tool":
            if message.tool_call_id in pending:
                pending.pop(message.tool_call_id)
                paired.append(message)
            continue
        paired += _answer(pending)
        pending = {}
        paired.append(message)
        if message.role == "assistant":
            pending = {c.id: c for c in message.tool_calls}
    return paired + _answer(pending)


def _answer(pending):
    return [ChatMessage(role="tool", content=interrupted_message(), tool_call_id=c.id, name=c.name, is_error=True)
            for c in pending.values()]


def trim_history(messages, max_chars):
    """Called before each model call: the newest ``messages`` that fit in ``max_chars``.

    Leading system messages are always kept and count against ``max_chars``. The rest is cut
    into exchanges, each a user message with the assistant messages and tool results that
    followed it, and the oldest exchanges are dropped first: a tool call and its result always
    go (or stay) together, and the conversation always starts with a user message (Anthropic
    requires it). The last exchange — the question being answered and the steps taken for it
    so far — is always kept whole, even when it alone is larger than the budget.
    """
    head = 0
    while head < len(messages) and messages[head].role == "system":
        head += 1
    system, messages = list(messages[:head]), messages[head:]
    max_chars -= sum(message_size(m) for m in system)
    exchanges = []
    for message in _paired(messages):
        if message.role == "user" or not exchanges:
            exchanges.append([message])
        else:
            exchanges[-1].append(message)
    sizes = [sum(message_size(m) for m in exchange) for exchange in exchanges]
    total, start = sum(sizes), 0
    while start < len(exchanges) - 1 and total > max_chars:
        total -= sizes[start]
        start += 1
    kept = [m for exchange in exchanges[start:] for m in exchange]
    while kept and kept[0].role != "user" and any(m.role == "user" for m in kept):
        kept.pop(0)  # only an unanswerable transcript (no user message at all) keeps its head
    return system + kept


def unfinished_step(rows):
    """What a job that died left of its turn (``rows``: the turn's transcript, in order): returns
    ``(answered, calls)``. ``answered``: its last message is the model's final answer (only the
    final write was missing). ``calls``: the ``ToolCall``s of the last model reply that have no
    result yet, in order; the first may have been running when the job died."""
    for index in range(len(rows) - 1, -1, -1):
        row = rows[index]
        if row.role != "assistant":
            continue
        if not row.tool_calls:
            return index == len(rows) - 1, []
        done = {r.tool_call_id for r in rows[index + 1:] if r.role == "tool"}
        return False, [c for c in chat_message(row).tool_calls if c.id not in done]
    return False, []
