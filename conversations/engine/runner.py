"""The model/tool loop of one turn, free of RQ and of HTTP views.

``TurnRunner.run()`` calls the model, runs the tools it asks for, and after every model or
tool round-trip saves the new transcript rows and publishes the turn's state (``done:
false``); ``finish()`` writes the final state (``done: true``) to the database and the cache.
While a reply streams, its growing text is published at most every ``PUBLISH_INTERVAL``, to
the cache only, as a last message marked ``"streaming": true`` (no id yet); the row is saved
when the call ends. A Stop shuts the call in flight (see ``watchdog.Watchdog``); the text
shown so far is kept.
"""

import contextlib
import dataclasses
import json
import logging
import time

from django.db import DatabaseError, DataError, transaction
from django.utils import timezone
from redis.exceptions import RedisError

from .. import assistants
from ..core import pricing
from ..infra import dbconn, lease, state, telemetry
from ..infra.state import Stop
from ..infra.breaker import owner_key
from ..core.budget import BudgetExhausted
from ..core.sentences import (
    cut_short_message,
    deadline_message,
    empty_reply_message,
    length_message,
    step_limit_message,
)
from ..providers.chain import build_provider
from ..infra.http import CallCancelled, ensure_call_budget
from ..models import CallRecord, Message, Turn
from ..redaction import Scrubber
from ..providers import ProviderError, call_complete
from ..core.history import chat_message, message_size, trim_history, unfinished_step
from ..tools import ToolContext, arguments_hash, interrupted_result, load_tools, run_tool, too_many_calls_message
from ..core.types import ChatMessage, ErrorCode, Finish, Outcome, ToolResult, record_call
from . import approvals, statements
from .handoff import hands_over
from .lifecycle import assistant_label, claim, ended, unended, update_unended_statement
from .limits import turn_address
from .recovery import can_hand_over, continue_turn

logger = logging.getLogger("conversations.runner")


class TurnRunner:
    """Runs one turn. Collaborators are injectable for tests:

    ``clock`` a ``TurnClock``; ``provider`` a ``BaseProvider`` (built from the config when
    None); ``tools`` {name: Tool}; ``publisher`` the function that writes the live state (and its
    growing answers, which otherwise go through ``state.publish_board``), instead of
    ``state.publish_step``; ``trace`` the job's ``telemetry.JobTrace`` (None: no spans), which gets
    one span for each call record saved; ``transcript`` the turn's messages as
    ``statements.transcript`` reads them, when the job read them with the turn (None: read here).
    """

    publisher = None
    stream_publisher = staticmethod(state.publish_board.offer)

    def __init__(self, turn, *, clock, config, provider=None, tools=None, publisher=None, trace=None,
                 transcript=None):
        self.turn = turn
        self.trace = trace
        if trace is not None:  # the records' offset 0 is the budget's start
            trace.anchor(clock.budget.elapsed())
        self.saved_records = []  # saved in the transaction being made, for their spans once it commits
        self.first_word_seen = False
        self.job_id = turn.job_id  # the job running it; the final write is this job's only while it still is
        self.clock = clock
        self.budget = clock.budget
        self.config = config
        self.scrub = Scrubber(config)  # the site's rules built once for all the turn's text (REDACT)
        if publisher is not None:
            self.publisher = self.stream_publisher = publisher
        self.tools = load_tools(config["TOOLS"]) if tools is None else tools
        self.https = []
        if provider is None:
            provider, self.https = build_provider(config, self.budget, recorder=self.record,
                                                  cancelled=self.cancelled, turn_id=str(turn.id),
                                                  # only a chain has breakers, which count by owner
                                                  owner=owner_key(turn.conversation, turn_address(turn))
                                                  if config["FALLBACKS"] else "")
        self.http = self.https[0] if self.https else None
        self.provider = provider
        # Every model call of the turn, attempted or skipped, is recorded under this one name.
        self.model_name = getattr(provider, "model", "") or provider.name
        self.earlier, self.rows = self.transcript(transcript)
        self.pending_records = []
        self.last_reply = None  # the reply that ended the turn, until the final write saves it
        self.finished = False
        self.streamed = None  # the pieces of the reply streaming now, or None between calls
        self.streamed_at = 0.0  # when its growing text was last published (time.monotonic)
        self.streamed_shown = 0  # how many of its pieces that publish held
        self.prompt_chars = 0  # the size of the last call's messages, for a usage estimate
        self.published = None  # what its last publish wrote and read (``state.publish_step``)
        self.stop_known = False  # whether ``published.stop`` is still what a look at the flags would read

    # -- records -------------------------------------------------------------------------

    def record(self, **fields):
        """Keep one ``CallRecord`` (a provider attempt or a tool run); it is saved with the
        round-trip's other rows (``save_step``) or at the final write. Its text fields are cut
        to their columns' lengths here, so that saving it cannot fail on them."""
        for name in ("name", "detail"):
            fields[name] = str(fields.get(name) or "")[:CallRecord._meta.get_field(name).max_length]
        record = CallRecord(turn=self.turn, **fields)
        if self.trace is not None and record.kind == CallRecord.Kind.MODEL:
            record.telemetry = self.link_info()
        self.pending_records.append(record)

    def link_info(self):
        """For a model call's span: the provider making it, its place in the chain (0: the first,
        not a fallback) and its breaker's state when the chain asked it."""
        link = getattr(self.provider, "current", None)
        if link is None:
            return {"provider": self.provider.name, "fallback": 0}
        return {"provider": link.provider.name, "fallback": self.provider.links.index(link),
                "breaker": getattr(link, "breaker_state", None)}

    @property
    def mine(self):
        """Its row while still this job's to write (``lifecycle.unended``), as a queryset."""
        return unended(self.turn.pk, job_id=self.job_id)

    def mine_statements(self, fields, *rows):
        """The statements that save a round trip (``save_mine`` sends them): the kept ``CallRecord``
        rows and the new ``rows``, then the turn's ``fields`` (as they are on ``self.turn``) while it
        is still this job's (the fence, ``lifecycle.update_unended``).
        Built before the transaction begins: on SQLite, whose transactions take the database's one
        write lock at their ``BEGIN`` (the demo's ``IMMEDIATE``), each value's preparation and each
        statement's building would otherwise be done while every other writer waits."""
        turn = self.turn
        return [*statements.insert_statements(self.pending_records),
                *(statements.insert_statement(row) for row in rows),
                update_unended_statement(turn.pk, {f: getattr(turn, f) for f in fields}, job_id=self.job_id)]

    def save_mine(self, built):
        """In the caller's transaction, in one round trip where the database allows
        (``statements.send``): send ``built`` (``mine_statements``). Raises ``_Superseded`` when the
        turn is no longer this job's (the caller's transaction then rolls all of it back)."""
        sent = statements.send(*built)
        self.saved_records += self.pending_records
        self.pending_records = []
        if not sent[-1]:
            raise _Superseded()

    def commit_mine(self, built, *, asynchronous):
        """Send ``built`` (``mine_statements``) as one transaction, committed only while the turn is
        still this job's (``save_mine``); its commit does not wait for the disk when ``asynchronous``
        (a step's: ``dbconn.step``). Where statements sent as one string are a transaction of their
        own (``dbconn.one_string_transaction``: PostgreSQL), they go so, in one round trip instead of
        three (``BEGIN``, the string, ``COMMIT``), the fence written to fail when it matches no row
        (``statements.or_fail``), which rolls the whole string back; elsewhere in a transaction."""
        connection = built[-1].connection
        if dbconn.one_string_transaction(connection) and statements.one_string(built):
            try:
                with dbconn.lone_step() if asynchronous else contextlib.nullcontext():
                    self.save_mine([*built[:-1], statements.or_fail(built[-1])])
            except DataError as exc:
                if statements.failed_fence(exc):
                    raise _Superseded() from None
                raise
            return
        with dbconn.step() if asynchronous else transaction.atomic():
            self.save_mine(built)

    def save_records(self):
        """Insert the kept ``CallRecord`` rows; call inside the transaction that saves the rest."""
        statements.insert_many(self.pending_records)
        self.saved_records += self.pending_records
        self.pending_records = []

    def trace_saved(self, committed=True):
        """One span for each call record saved by the transaction that has just ended (none when it
        rolled back: the trace shows what the timeline shows). Never raises."""
        saved, self.saved_records = self.saved_records, []
        if not committed or self.trace is None:
            return
        for record in saved:
            try:
                self.trace.record(record, getattr(record, "telemetry", None))
            except Exception:  # noqa: BLE001 - telemetry never stops a turn
                logger.warning("Could not trace a call of turn %s", self.turn.id, exc_info=True)

    def save_step(self, turn_fields, **message_fields):
        """Save one round-trip in one transaction (one commit): its call records, the turn's
        counters (``turn_fields``) and its new transcript row. Returns the ``Message``; raises
        ``_Superseded`` (nothing saved) when the turn is no longer this job's: another job continued
        it while this one was frozen or taken for dead (the first writer wins)."""
        if not lease.fence():
            raise _Superseded()
        self.stop_known = False
        row = Message(conversation_id=self.turn.conversation_id, turn=self.turn, **self.scrubbed(message_fields))
        built = self.mine_statements(turn_fields, row)  # before the transaction: see mine_statements
        try:
            self.commit_mine(built, asynchronous=True)
        except BaseException:
            self.trace_saved(committed=False)
            raise
        self.trace_saved()
        self.rows.append(row)
        return row

    def scrubbed(self, fields):
        """A message's ``fields`` with what must not be stored replaced (``REDACT``): its text and
        its tool calls' arguments; the model and the tools had the originals."""
        fields = dict(fields)
        if "content" in fields:
            fields["content"] = self.scrub.text(fields["content"])
        if fields.get("tool_calls"):
            fields["tool_calls"] = [{**call, "arguments": self.scrub.value(call.get("arguments"))}
                                    for call in fields["tool_calls"]]
        return fields

    def publish(self, *, done=False, unsaved=None):
        """Publish the turn's state from its rows, and ``unsaved`` (a ``Message`` not saved) after
        them if given (naming the conversation's owner as the cache knows it: see ``state.publish``)."""
        data = state.state_from_db(self.turn, self.rows if unsaved is None else [*self.rows, unsaved])
        data["done"] = done
        if not self.first_word_seen and data["messages"] and data["messages"][-1]["role"] == Message.Role.ASSISTANT \
                and data["messages"][-1]["content"]:
            self.note_first_word()
        if self.publisher is not None:
            return self.publisher(data)
        self.published = state.publish_step(data, self.published)
        self.stop_known = not done
        return self.published.state

    def stop_requested(self):
        """The ``Stop`` asked of this turn's job (``state.stop_requested``): as its last publish read
        it in the same round trip when nothing was saved since (the look would be the same moment),
        else read now."""
        if self.stop_known:
            self.stop_known = False
            return self.published.stop
        return state.stop_requested(self.turn.id)

    def note_first_word(self):
        """The visitor sees the answer's first word now: measure the time since they sent their message."""
        self.first_word_seen = True
        if self.turn.enqueued_at is not None:
            telemetry.first_word(assistant_label(self.turn), (timezone.now() - self.turn.enqueued_at).total_seconds())

    def on_text(self, piece):
        """Called with each piece of a streamed reply's text: publish the growing answer, at most
        every ``PUBLISH_INTERVAL`` seconds. Cache only; a failed publish never stops the stream."""
        self.streamed.append(piece)
        now = time.monotonic()
        if now - self.streamed_at < self.config["PUBLISH_INTERVAL"]:
            return
        self.streamed_at = now
        self.publish_streamed()

    def publish_streamed(self):
        """Publish the streamed text so far as the growing answer (cache only, through the
        process's ``state.publish_board`` when it runs; never raises)."""
        self.streamed_shown = len(self.streamed)
        if not self.first_word_seen and any(self.streamed):
            self.note_first_word()
        data = state.state_from_db(self.turn, self.rows)
        data["messages"].append({"id": None, "role": Message.Role.ASSISTANT,
                                 "content": self.scrub.growing("".join(self.streamed)), "streaming": True})
        try:
            self.stream_publisher(data)
        except (RedisError, OSError):
            logger.warning("Could not publish the growing answer of turn %s", self.turn.id, exc_info=True)

    def call_model(self, messages, tools):
        """One model call, its text streamed to ``on_text`` as it is written. Returns the
        ``ModelReply``; ``CallCancelled`` (its ``reply`` the text so far, or None) on a Stop.

        An empty reply (``ModelReply.empty``) is never an answer: it is counted and recorded as
        what it was, and asked for once more while the budget allows a call, without a stream (a
        gateway whose upstream answered a stream request with plain JSON forwards an empty stream,
        and passes the same upstream's unstreamed answer on whole); a second one is returned for
        the loop to end the turn with."""
        self.streamed, self.streamed_at, self.streamed_shown = [], time.monotonic(), 0
        self.prompt_chars = sum(message_size(m) for m in messages)
        with dbconn.waiting():  # the call takes seconds; the turn needs no database until it returns
            reply = call_complete(self.provider, messages, tools, self.on_text)
        if len(self.streamed) > self.streamed_shown and not reply.empty:
            # The words after the last publish are shown now, not after the reply's row is saved: that
            # write may wait for a database connection behind other turns' (a ConcurrentWorker's pool).
            self.publish_streamed()
        if reply.empty:
            self.note_empty(reply)
            if self.budget.can_start(self.config["MIN_CALL_BUDGET"]):
                with dbconn.waiting():
                    reply = call_complete(self.provider, messages, tools)
                if reply.empty:
                    self.note_empty(reply)
        self.streamed = None  # left set when the call raised: finish() keeps the text shown
        return reply

    def note_empty(self, reply):
        """Count an empty reply's call and usage, and mark its attempt in the timeline (the
        HTTP layer recorded it as ``ok``: it was a well-formed reply)."""
        self.count_model_call(reply)
        detail = "empty reply: no text and no tool calls"
        logger.warning("Turn %s: %s from %s", self.turn.id, detail, self.model_name)
        for record in reversed(self.pending_records):
            if record.kind == "model":
                if record.outcome == Outcome.OK:
                    record.outcome, record.detail = Outcome.BAD_RESPONSE, detail
                    return
                break
        # A provider that makes no recorded HTTP call (its own transport): a record of its own.
        record_call(self.record, "model", self.model_name, Outcome.BAD_RESPONSE, started_offset=self.budget.elapsed(),
                    remaining_before=self.budget.remaining(), detail=detail)

    def save_reply(self, reply):
        """Count the call and save its reply as this round-trip's assistant message; returns the row."""
        fields = self.count_reply(reply)
        return self.save_step(fields, role=Message.Role.ASSISTANT, content=reply.text,
                              tool_calls=[c.as_dict() for c in reply.tool_calls])

    def count_reply(self, reply):
        """Count the call of ``reply`` on the turn (not saved); returns the turn's fields it changed.
        Through a chain of providers, the turn records the one that answered."""
        self.count_model_call(reply)
        fields = ["model_calls", "input_tokens", "output_tokens", "usage_estimated"]
        answered = self.provider.answered_by
        if (answered.name, getattr(answered, "model", "") or "") != (self.turn.provider, self.turn.model):
            self.turn.provider, self.turn.model = answered.name, getattr(answered, "model", "") or ""
            fields += ["provider", "model"]
        return fields

    def last_reply_row(self):
        """The assistant message (unsaved) of the reply that ended the turn (``loop``), which the final
        write saves in its own transaction: that round-trip costs one commit and one state, not two
        of each. None when the turn ended another way."""
        reply = self.last_reply
        if reply is None:
            return None
        return Message(conversation_id=self.turn.conversation_id, turn=self.turn, role=Message.Role.ASSISTANT,
                       **self.scrubbed({"content": reply.text, "tool_calls": [c.as_dict() for c in reply.tool_calls]}))

    def streamed_row(self):
        """The text of a reply that was streaming when the turn ended another way (a job timeout,
        an unreadable reply), as its assistant message (unsaved; the final write saves it), so the
        visitor keeps what they saw; None when nothing was streaming. Counts that call on the turn."""
        if not self.streamed:
            return None
        self.turn.model_calls += 1
        self.count_estimate("".join(self.streamed))
        return Message(conversation_id=self.turn.conversation_id, turn=self.turn, role=Message.Role.ASSISTANT,
                       content=self.scrub.text("".join(self.streamed)))

    def cancelled(self):
        """Whether a call in flight must be shut (checked by its watchdog): on a Stop, or when the
        worker shuts down and the turn can be handed over (else the call is let finish here).
        From ``state.stop_board``: in a ``ConcurrentWorker`` one read serves every turn in flight."""
        if lease.lost.is_set():  # this process was taken for dead: its turns go on elsewhere
            return True
        asked = state.stop_board.stop_requested(self.turn.id)
        return asked == Stop.CANCEL or (asked == Stop.HANDOFF and can_hand_over(self.turn, self.config))

    # -- the loop ------------------------------------------------------------------------

    def transcript(self, messages=None):
        """``(earlier, rows)``: the conversation's messages from its earlier finished turns, and
        this turn's own, each in order, read in one query (``messages``: what it read, when the job
        read it with the turn)."""
        if messages is None:
            messages = statements.transcript(self.turn.conversation_id, self.turn.id)
        earlier, rows = [], []
        for message in messages:
            if message.turn_id == self.turn.id:
                rows.append(message)
            elif not rows:  # a later turn's messages are never part of this one's history
                earlier.append(message)
        return earlier, rows

    def history(self):
        """The messages for the model: the system prompt, then the conversation's earlier finished
        turns and this turn's rows, whole (``loop`` trims them before every call)."""
        system = self.config["SYSTEM_PROMPT"]
        messages = ([ChatMessage(role="system", content=system)] if system else [])
        own = [chat_message(m) for m in self.rows]
        original = self.original()
        if original is not None and own and own[0].role == Message.Role.USER:
            own[0] = dataclasses.replace(own[0], content=original)  # REDACT_ORIGINAL_TO_MODEL: this turn only
        return messages + [chat_message(m) for m in self.earlier] + own

    def original(self):
        """What the visitor wrote before redaction, when the site lets the model read it
        (``REDACT_ORIGINAL_TO_MODEL``) and it is still kept; else None."""
        if not self.config["REDACT_ORIGINAL_TO_MODEL"]:
            return None
        try:
            return state.read_original(self.turn.id)
        except RedisError:
            return None

    def start(self):
        """Claim the turn (``lifecycle.claim``: marked running with its clocks in one UPDATE, if it is
        still queued), then publish a first ``done: false`` state. Returns whether it was claimed
        (False: it was stopped or ended while it waited; nothing is written)."""
        now = timezone.now()
        first = self.provider.first
        if not claim(self.turn, started_at=now, job_timeout=self.clock.job_timeout, deadline_margin=self.clock.margin,
                     deadline_at=now + timezone.timedelta(seconds=self.budget.seconds), provider=first.name,
                     model=getattr(first, "model", "") or "", assistant_version=self.turn.assistant_version):
            return False
        if self.turn.enqueued_at is not None:
            telemetry.queue_wait((now - self.turn.enqueued_at).total_seconds(), assistant_label(self.turn))
        self.publish()
        return True

    def run(self, *, resuming=False):
        """Run the loop to its end and write the final state. Returns the turn. ``resuming``: this
        job continues a turn another job began (``recovery``), from its saved transcript."""
        if resuming:
            self.publish()  # running again; the widget keeps what it showed
        elif not self.start():
            for http in self.https:
                http.close()
            self.turn.refresh_from_db()
            return self.turn
        try:
            status, error = self.loop(resuming=resuming)
            if status is None:  # handed over to another worker: it writes the final state
                return self.turn
        except _Superseded:
            logger.warning("Turn %s is run by another job now: job %s stops without writing", self.turn.id,
                           self.job_id)
            return self.turn
        except BudgetExhausted:
            status, error = Turn.Status.INCOMPLETE, deadline_message()
        except ProviderError as exc:
            logger.error("Turn %s failed: %s", self.turn.id, exc)
            status, error = Turn.Status.FAILED, assistants.provider_error_message(self.turn, exc)
        finally:
            for http in self.https:
                http.close()
        self.finish(status, error)
        return self.turn

    def loop(self, *, resuming=False):
        """The model/tool round-trips. Returns ``(status, error)`` for the final write, or
        ``(None, None)`` when another job continues the turn (its worker is shutting down).

        Before every model call and every tool: ``state.stop_requested`` (a Stop, or a hand-over; see
        ``stop_for``). Then, for a model call, the budget (one that could not get ``MIN_CALL_BUDGET``
        seconds is skipped, raising ``BudgetExhausted``); during it, ``cancelled()`` shuts the call.
        After every round-trip: the new rows are published.
        """
        cfg = self.config
        history = self.history()
        tools = list(self.tools.values())
        if resuming:
            answered, calls = unfinished_step(self.rows)
            if answered:  # the dead job had saved the answer but not the final state
                return Turn.Status.COMPLETED, None
            if any(hands_over(row) for row in self.rows):  # it had handed the conversation to a person
                return self.handed_over(calls)
            # The calls already answered came first in their reply: the step's limit counts from there.
            asked = next((len(r.tool_calls or []) for r in reversed(self.rows) if r.role == Message.Role.ASSISTANT), 0)
            ended = self.run_calls(calls, history, interrupted_first=True, position=asked - len(calls))
            if ended:
                return ended
        for _step in range(cfg["MAX_STEPS"] - self.turn.model_calls):
            ended = self.stop_for(self.stop_requested())
            if ended:
                return ended
            ensure_call_budget(self.budget, cfg["MIN_CALL_BUDGET"], turn_id=str(self.turn.id), name=self.model_name,
                               recorder=self.record)
            try:
                reply = self.call_model(trim_history(history, cfg["HISTORY_MAX_CHARS"]), tools)
            except CallCancelled as stop:
                self.streamed = None
                if lease.lost.is_set():
                    raise _Superseded() from None
                asked = state.stop_requested(self.turn.id) or Stop.CANCEL
                if asked == Stop.CANCEL and stop.reply is not None and stop.reply.text:
                    self.save_reply(stop.reply)  # what the visitor saw stays
                elif asked == "cancel":
                    self.count_estimate("")  # the prompt was sent, and is billed (saved by the final write)
                ended = self.stop_for(asked)
                if ended:
                    return ended
                continue  # the hand-over could not be made: ask again here
            if reply.empty:  # twice, or no time to ask again (call_model); counted already
                return Turn.Status.FAILED, empty_reply_message()
            ended = self.ends_turn(reply)
            if ended:
                self.count_reply(reply)
                self.last_reply = reply  # saved and published by the final write (``last_reply_row``)
                return ended
            row = self.save_reply(reply)
            history.append(chat_message(row))
            self.publish()
            ended = self.run_calls(reply.tool_calls, history)
            if ended:
                return ended
        return Turn.Status.INCOMPLETE, step_limit_message(cfg["MAX_STEPS"])

    def run_calls(self, calls, history, *, interrupted_first=False, position=0):
        """Run ``calls`` in order, saving each result; returns ``(status, error)`` when the turn
        must stop first (or ends: the conversation was handed to a person), else None.
        ``interrupted_first``: the first was running when the previous job died; it runs again
        only if its tool is idempotent. ``position``: how many calls of
        the same reply came before ``calls``.

        At most ``MAX_TOOL_CALLS_PER_STEP`` calls of one reply run; the model gets an error result
        for each one past that (a prompt-injected reply may ask for thousands, and a tool may have
        side effects). Before each call the time left is checked: when no tool could start, the
        turn stops with one record naming the calls not run, not a row and a publish for each.
        The growing transcript is published at most every ``PUBLISH_INTERVAL`` during the batch,
        and once at its end.
        """
        cfg = self.config
        allowed = max(0, cfg["MAX_TOOL_CALLS_PER_STEP"] - position) if cfg["MAX_TOOL_CALLS_PER_STEP"] else len(calls)
        calls, extra = calls[:allowed], calls[allowed:]
        published_at, unpublished = time.monotonic(), False
        waiting = []  # the calls that wait for a person's approval
        try:
            for number, call in enumerate(calls):
                ended = self.stop_for(self.stop_requested())
                if ended:
                    return ended
                tool = self.tools.get(call.name)
                approval = self.approval_for(tool, call)
                if approval is not None and approval.status == approvals.Status.PENDING:
                    waiting.append(call)  # the step's other calls still run
                    continue
                if approval is not None and approval.status == approvals.Status.APPROVED and \
                        approval.run_started_at is None and self.tool_time(call) <= 0:
                    self.record_not_run(calls[number:] + extra, "no time left for a tool")
                    return Turn.Status.INCOMPLETE, deadline_message()
                if approval is not None:
                    result = self.run_approved(tool, call, approval)
                elif interrupted_first and number == 0 and tool is not None and not tool.idempotent:
                    result = interrupted_result(call)
                    record_call(self.record, "tool", call.name, result.outcome, started_offset=self.budget.elapsed(),
                                remaining_before=self.budget.remaining(), detail=result.detail)
                elif tool is not None and self.tool_time(call) <= 0:
                    # Never start what cannot finish (a tool thread cannot be stopped once started);
                    # a name with no tool needs no time: its error result is immediate.
                    self.record_not_run(calls[number:] + extra, "no time left for a tool")
                    return Turn.Status.INCOMPLETE, deadline_message()
                else:
                    result = self.run_tool(call)
                row = self.save_step(["tool_calls"], role=Message.Role.TOOL, content=result.output,
                                     tool_call_id=call.id, tool_name=call.name, is_error=result.is_error)
                history.append(chat_message(row))
                unpublished = True
                if hands_over(row):  # staff answer from now on: the model does nothing more
                    return self.handed_over(calls[number + 1:] + extra)
                if time.monotonic() - published_at >= cfg["PUBLISH_INTERVAL"]:
                    self.publish()
                    published_at, unpublished = time.monotonic(), False
            if extra:
                # Error results for the model only (no rows): a history read back later answers
                # the same calls with ``history.interrupted_message()``.
                self.record_not_run(extra, f"over the limit of {cfg['MAX_TOOL_CALLS_PER_STEP']} tool calls per reply")
                history += [ChatMessage(role="tool", content=too_many_calls_message(cfg["MAX_TOOL_CALLS_PER_STEP"]),
                                        tool_call_id=call.id, name=call.name, is_error=True) for call in extra]
            if waiting:
                unpublished = False  # wait_for_approval publishes the waiting state
                return self.wait_for_approval(waiting)
        except _Superseded:
            unpublished = False  # what it saved is the other job's to show now
            raise
        finally:
            if unpublished:
                self.publish()
        return None

    def approval_for(self, tool, call):
        """The ``ToolApproval`` of ``call`` when it must wait for a person (saved pending the first
        time it is asked for), else None."""
        if not approvals.needs_approval(tool, call, self.turn, self.config):
            return None
        return approvals.request(self.turn, call, tool)

    def run_approved(self, tool, call, approval):
        """The result of ``call``, decided by ``approval``: run once when approved (a job that died
        after starting it leaves it unrun unless its tool is idempotent); declined or expired, not run."""
        if approval.status != approvals.Status.APPROVED:
            result = approvals.not_run_result(call, approval)
        elif approval.arguments_sha256 != arguments_hash(call.arguments):
            result = approvals.mismatch_result(call)
        elif not approvals.start_run(approval) and not tool.idempotent:
            result = interrupted_result(call)
        else:
            result = self.run_tool(call)
            approvals.save_result(approval, result)
            return result
        record_call(self.record, "tool", call.name, result.outcome, started_offset=self.budget.elapsed(),
                    remaining_before=self.budget.remaining(), detail=result.detail)
        return result

    def wait_for_approval(self, calls):
        """End this job with the turn waiting for a person to approve ``calls``: its records saved,
        the turn ``waiting_approval`` (while it is still this job's) and that state published.
        Returns ``(None, None)``: no final write; a continuation job goes on once they are decided."""
        if not lease.fence():
            raise _Superseded()
        if state.stop_requested(self.turn.id) == Stop.CANCEL:  # Stop pressed meanwhile: nothing waits
            approvals.refuse_pending(self.turn)
            return Turn.Status.CANCELLED, None
        with transaction.atomic():
            self.save_records()
            paused = self.mine.filter(cancel_requested=False).update(
                status=Turn.Status.WAITING, tool_calls=self.turn.tool_calls)
        if not paused:
            if self.mine.filter(cancel_requested=True).exists():
                approvals.refuse_pending(self.turn)
                return Turn.Status.CANCELLED, None
            raise _Superseded()
        self.turn.status = Turn.Status.WAITING
        try:
            self.publish()
        except (RedisError, OSError):  # the row says it; the poll view rebuilds the state from it
            logger.exception("Could not publish that turn %s waits for an approval", self.turn.id)
        logger.info("turn %s waits for approval of %s", self.turn.id, ", ".join(c.name for c in calls),
                    extra={"turn_id": str(self.turn.id)})
        return None, None

    @staticmethod
    def ends_turn(reply):
        """``(status, error)`` when ``reply`` is the turn's last (an answer, or a reply cut short), else None."""
        if reply.finish == Finish.CUT:  # an error event after some text reads as that error
            return Turn.Status.INCOMPLETE, (str(ProviderError(reply.cut_code).message) if reply.cut_code
                                            else cut_short_message())
        if reply.finish == Finish.LENGTH:
            return Turn.Status.INCOMPLETE, length_message()
        if reply.finish == Finish.REFUSED:
            return Turn.Status.INCOMPLETE, str(ProviderError(ErrorCode.REFUSED).message)
        if not reply.tool_calls:
            return Turn.Status.COMPLETED, None
        return None

    def handed_over(self, left):
        """The end of a turn whose conversation was handed to a person: the tool calls ``left`` of
        its reply are recorded as not run, and the model is not called again."""
        if left:
            self.record_not_run(left, "the conversation was handed to a person")
        return Turn.Status.COMPLETED, None

    def record_not_run(self, calls, why):
        """One ``CallRecord`` for ``calls`` left unrun, naming them (cut to the column's length)."""
        names = ", ".join(call.name for call in calls)
        record_call(self.record, "tool", f"{len(calls)} tool calls", Outcome.SKIPPED,
                    started_offset=self.budget.elapsed(), remaining_before=self.budget.remaining(),
                    detail=f"not run, {why}: {names}")

    def tool_time(self, call):
        """Seconds ``call``'s tool may run: ``min(its timeout or TOOL_TIMEOUT, remaining − TOOL_RESERVE)``."""
        cfg = self.config
        t = self.tools.get(call.name)
        cap = t.timeout if t is not None and t.timeout else cfg["TOOL_TIMEOUT"]
        return max(0.0, min(float(cap), self.budget.remaining() - cfg["TOOL_RESERVE"]))

    def stop_for(self, asked):
        """``(status, error)`` for a stop request (``state.stop_requested``): ``cancelled``; or, for a
        worker shutting down, ``(None, None)`` once another job continues the turn (``recovery``).
        None to go on: nothing was asked, or the turn cannot be handed over."""
        if lease.lost.is_set():
            raise _Superseded()
        if not asked:
            return None
        if asked == Stop.CANCEL:
            return Turn.Status.CANCELLED, None

        if continue_turn(self.turn, "its worker shut down", from_job_id=self.turn.job_id, died=False):
            return None, None
        state.clear_handoff(self.turn.id)  # no time left to hand over: finish here
        return None

    def count_model_call(self, reply):
        """Add one model call and its usage to the turn (saved by the round-trip's ``save_step``);
        an estimate when the call ended without the provider's usage (see ``count_estimate``)."""
        turn = self.turn
        turn.model_calls += 1
        if self.trace is not None:
            self.trace_reply(reply)
        if reply.usage is None:
            self.count_estimate(reply.text + "".join(json.dumps(c.arguments) for c in reply.tool_calls))
            return
        turn.input_tokens = (turn.input_tokens or 0) + reply.usage.input_tokens
        turn.output_tokens = (turn.output_tokens or 0) + reply.usage.output_tokens

    def trace_reply(self, reply):
        """Attach what ``reply`` says (its model, usage, finish) to its call's record, for the span."""
        for record in reversed(self.pending_records):
            if record.kind == CallRecord.Kind.MODEL:
                if record.outcome == Outcome.OK and getattr(record, "telemetry", None) is not None:
                    answered = getattr(self.provider, "answered_by", self.provider)
                    record.telemetry["reply"] = {
                        "model": reply.model or getattr(answered, "model", "") or record.name,
                        "finish": str(reply.finish), "text": reply.text,
                        "input_tokens": reply.usage.input_tokens if reply.usage is not None else None,
                        "output_tokens": reply.usage.output_tokens if reply.usage is not None else None}
                return

    def count_estimate(self, written):
        """Add an estimate of the last call's tokens to the turn: its prompt and ``written``, the text
        received. A call stopped, cut off or timed out mid-stream has no usage (OpenAI-compatible
        APIs send it in the last chunk), yet was billed: without this, Stop would bypass the daily
        token budget and the cost. The turn is marked ``usage_estimated`` for the admin."""
        turn = self.turn
        turn.input_tokens = (turn.input_tokens or 0) + pricing.estimate_tokens(self.prompt_chars)
        turn.output_tokens = (turn.output_tokens or 0) + pricing.estimate_tokens(len(written))
        turn.usage_estimated = True

    def run_tool(self, call):
        """Run one tool call within ``min(TOOL_TIMEOUT, remaining − TOOL_RESERVE)``, record it, and
        return its ``ToolResult`` (an error result when it raised, timed out or had no time at all)."""
        cfg = self.config
        t = self.tools.get(call.name)
        remaining = self.budget.remaining()
        limit = self.tool_time(call)
        if limit <= 0:  # never start what cannot finish: a tool thread cannot be stopped once started
            result = ToolResult(call.id, call.name, "Error: the tool was not run because the time for this answer "
                                "ran out.", outcome=Outcome.SKIPPED)
            record_call(self.record, "tool", call.name, result.outcome, started_offset=self.budget.elapsed(),
                        remaining_before=remaining, detail="no time left")
            return result
        conversation = self.turn.conversation
        context = ToolContext(
            conversation=conversation, turn=self.turn, user=conversation.user,
            owner_token=conversation.owner_token, deadline=self.budget.clock() + limit, clock=self.budget.clock,
        )
        started_offset = self.budget.elapsed()
        with dbconn.waiting():  # the tool runs in a thread with a connection of its own
            result = run_tool(t, call, context, limit, cfg["TOOL_RESULT_MAX_CHARS"])
        duration = self.budget.elapsed() - started_offset
        self.turn.tool_calls += 1
        record_call(self.record, "tool", call.name, result.outcome, started_offset=started_offset, timeout=limit,
                    remaining_before=remaining, duration=duration, detail=result.detail or result.output)
        return result

    # -- the final write -----------------------------------------------------------------

    FINAL_FIELDS = ("status", "error", "finished_at", "margin_left", "model_calls", "tool_calls", "input_tokens",
                    "output_tokens", "usage_estimated", "cost", "provider", "model")

    def finish(self, status, error=None):
        """Write the final state: the database row first, then the cache (``done: true``).

        Safe to call from an ``except`` block after RQ's timeout: each half is attempted even
        if the other fails.
        """
        if self.finished:
            return
        turn = self.turn
        turn.status = status
        turn.error = error or ""
        turn.finished_at = timezone.now()
        turn.margin_left = self.clock.margin_left()
        # RQ's job timeout may interrupt either half; the other half is still attempted, then the
        # interruption is re-raised and the caller's handler runs finish() again (hence no
        # ``finished`` flag until both halves have landed).
        interrupted, committed = None, False
        try:
            last = self.last_reply_row()
            shown = self.streamed_row()
            turn.cost = pricing.turn_cost(turn.model, turn.input_tokens, turn.output_tokens, self.config["PRICES"])
            # Every statement built before the transaction, which then only sends them (``mine_statements``).
            built = self.mine_statements(self.FINAL_FIELDS, *(row for row in (last, shown) if row is not None))
            # Only while the turn is still this job's to end: a thread given up past its job
            # timeout comes back later, when the worker has ended the turn or another job runs it.
            self.commit_mine(built, asynchronous=False)
            committed = True
            if last is not None:
                self.rows.append(last)
                self.last_reply = None
            if shown is not None:
                self.rows.append(shown)
                self.streamed = None
        except _Superseded:
            self.trace_saved(committed=False)
            logger.warning("Turn %s was ended or continued without its job %s meanwhile: its final write is not made",
                           turn.id, self.job_id)
            self.finished = True
            return
        except DatabaseError:
            logger.exception("Could not save the final state of turn %s", turn.id)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            interrupted = exc
        try:
            # An answer whose row could not be saved is still shown (the next final write saves it).
            self.publish(done=True, unsaved=self.last_reply_row())
        except (RedisError, OSError):  # the row is saved; the poll view rebuilds the state from it
            logger.exception("Could not publish the final state of turn %s", turn.id)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            interrupted = interrupted or exc
        # After the visitor has the answer: the spans cost them no wait (none when it rolled back).
        self.trace_saved(committed)
        if committed:
            ended(turn, margin=turn.margin_left)
        if interrupted is not None:
            raise interrupted
        self.finished = True
        self.report(status)
        if self.config["REDACT_ORIGINAL_TO_MODEL"]:
            try:
                state.forget_original(turn.id)
            except RedisError:
                pass  # it expires with the turn's job timeout
        logger.info("turn %s ended %s with %.1fs of margin left", turn.id, status, turn.margin_left,
                    extra={"turn_id": str(turn.id), "status": status, "margin_left": round(turn.margin_left, 3)})


    def report(self, status):
        """The turn's outcome and its margin at the final write, on the job's span (its count is made by
        ``ended``, as every ending's is)."""
        turn = self.turn
        if self.trace is not None:
            self.trace.outcome(status, turn.margin_left, **{
                "conversations.turn.model_calls": turn.model_calls, "conversations.turn.tool_calls": turn.tool_calls,
                "conversations.turn.resumes": turn.resumes, "gen_ai.usage.input_tokens": turn.input_tokens,
                "gen_ai.usage.output_tokens": turn.output_tokens})


class _Superseded(Exception):
    """A write found its turn ended, or continued by another job (or this process lost its lease):
    nothing of it is kept, and the job stops quietly."""
