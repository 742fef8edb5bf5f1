"""A conversation handed to a person: asked for (the widget's button or the assistant's
``hand_to_person`` tool), taken by one staff member, answered, handed back to the assistant or
closed.

The state lives on the conversation's row (``Conversation.handoff``); every change is one
conditional UPDATE of it, so two staff members cannot both take a conversation, and a request
cannot be made twice. While staff hold it (waiting or taken) ``lifecycle.start`` is never
called for it: the API's ``admit`` raises ``Held`` in the same row lock, and the visitor's
message is saved by ``keep`` with no turn and no job. Every change counts itself on the row
(``handoff_version``) and is published after its commit as the conversation's handoff state in the
cache (``infra.state.publish_person``, which keeps the highest version), which the widget polls;
the signals go out once, after the commit that made the change.

The API and the admin go through these functions only: each rule is written here once.
"""

import logging
import string

from django.db import transaction
from django.db.models import F, Q
from django.dispatch import Signal
from django.utils import timezone
from django.utils.translation import gettext as _
from redis.exceptions import RedisError

from .. import assistants
from ..conf import get_config
from ..infra import state
from ..models import Conversation, Message, Turn
from ..redaction import Scrubber
from ..tools import ToolError, tool
from . import lifecycle

logger = logging.getLogger("conversations.handoff")

# ``sender`` is ``Conversation``; ``conversation`` the one asked for; ``how`` "button" or "tool";
# ``reason`` what the assistant told staff ("" for the button).
handoff_requested = Signal()
# ``sender`` is ``Conversation``; ``conversation`` the one taken; ``user`` the staff member.
handoff_taken = Signal()

# The newest handoff messages a state carries (the visitor's rate limit keeps them few).
STATE_MESSAGES = 200

Handoff = Conversation.Handoff


class Refused(Exception):
    """What was asked cannot be done now; ``message`` says why, for the visitor or the staff member."""

    status = 409

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class NotOffered(Refused):
    """This conversation's assistant does not let it be handed to a person this way."""

    status = 403


class AlreadyAsked(Refused):
    """A person was asked for already: staff hold the conversation (waiting or taken)."""


class Held(Exception):
    """``ensure_with_assistant`` refused: staff hold the conversation, so no turn may start."""


def closed_message():
    return _("This conversation was closed by our staff. Please start a new one to write again.")


def ensure_with_assistant(conversation):
    """For ``lifecycle.start``'s ``admit``, with the row locked: raise ``Held`` while staff hold
    ``conversation``, ``Refused`` once it is closed; else nothing (the assistant answers)."""
    if conversation.handoff in Conversation.HELD:
        raise Held()
    if conversation.handoff == Handoff.CLOSED:
        raise Refused(closed_message())


NAME_FIELDS = ("first_name", "last_name", "username")


def staff_name_problem(template):
    """Why ``template`` (``HANDOFF_STAFF_NAME``) cannot name staff, or None (the system check's rule)."""
    try:
        fields = {field for _text, field, _spec, _conversion in string.Formatter().parse(template) if field is not None}
    except ValueError as exc:
        return str(exc)
    unknown = sorted(fields - set(NAME_FIELDS))
    return f"names {', '.join(repr(f) for f in unknown)}, which is not {{first_name}}, {{last_name}} or {{username}}" \
        if unknown else None


def staff_name(user):
    """``user`` as the visitor reads it (``HANDOFF_STAFF_NAME``). Their login name only where the
    site's template asks for ``{username}``: a login is often an e-mail address, and the visitor
    may be anyone. A template the check refuses, or a first name (or login) it needs that the
    user has not filled in, gives the neutral "Our staff"."""
    if user is None:
        return _("Our staff")
    names = {"username": user.get_username(), "first_name": getattr(user, "first_name", "") or "",
             "last_name": getattr(user, "last_name", "") or ""}
    template = get_config()["HANDOFF_STAFF_NAME"]
    if staff_name_problem(template):  # conversations.E044 says so at start-up
        return _("Our staff")
    used = {field for _text, field, _spec, _conversion in string.Formatter().parse(template) if field}
    if any(not names[field] for field in used & {"first_name", "username"}):
        return _("Our staff")
    return template.format_map(names).strip() or _("Our staff")


def message_json(message):
    """A handoff-era ``Message`` as the widget reads it; a staff message names its author (``staff_name``)."""
    data = {**state.message_dict(message), "turn": str(message.turn_id) if message.turn_id else None}
    if message.role == Message.Role.STAFF:
        data["author"] = staff_name(message.author)
    return data


def state_from_db(conversation):
    """The conversation's handoff state, as the widget polls it (see ``public``), with its version:
    read the row before its messages (``publish`` locks it meanwhile)."""
    rows = (conversation.messages.filter(turn__isnull=True).select_related("author").order_by("-id")
            [:STATE_MESSAGES])
    requested = conversation.handoff_requested_at
    # Taken by a staff member who has left, it reads waiting again (``unanswered``).
    waiting = unanswered(conversation)
    return {
        "conversation": str(conversation.id),
        "owner": state.owner_dict(conversation),
        "state": Handoff.WAITING if waiting else conversation.handoff,
        "by": staff_name(conversation.handoff_by) if conversation.handoff == Handoff.TAKEN and not waiting else None,
        "requested_at": requested.timestamp() if requested else None,
        "messages": [message_json(m) for m in reversed(rows)],
        "version": conversation.handoff_version,
    }


def _past_wait(requested_at, now):
    """Whether a request made at ``requested_at`` (a timestamp) has waited past ``HANDOFF_WAIT`` by ``now``."""
    return requested_at is not None and now - requested_at > get_config()["HANDOFF_WAIT"]


def expired(data, now):
    """Whether the visitor has waited longer than ``HANDOFF_WAIT`` without anyone taking it."""
    return data["state"] == Handoff.WAITING and _past_wait(data["requested_at"], now)


def told_no_one_free(conversation, now):
    """Whether ``conversation``'s visitor reads, as of ``now`` (a timestamp), that no one is free
    (``expired``): staff see it on the answer page."""
    requested = conversation.handoff_requested_at
    return unanswered(conversation) and requested is not None and _past_wait(requested.timestamp(), now)


def public(data, now):
    """What the visitor may read of a handoff state (not its owner), with ``expired`` as of ``now``."""
    return {"conversation": data["conversation"], "state": data["state"], "by": data["by"],
            "messages": data["messages"], "version": data["version"], "expired": expired(data, now),
            "wait": get_config()["HANDOFF_WAIT"]}


def _locked(conversation_id):
    """The conversation's row, locked until the transaction ends. Its staff member is read after
    the lock, by its own query: joined in the locking query, PostgreSQL reads a row it waited for
    as committed but the joined one as it was before the wait, so a take that waited on another
    saw nobody holding the conversation and took it too."""
    return Conversation.objects.select_for_update().get(pk=conversation_id)


def publish(conversation_id):
    """Publish the conversation's handoff state from the database; returns it (None on a RedisError,
    logged: the poll rebuilds a missing state from the row).

    The row is locked while its messages are read, so that a version stands for one content; the
    cache keeps the newest version (``state.publish_person``), so a publish that read before a
    change but writes after that change's own publish does not hide it."""
    with transaction.atomic():
        data = state_from_db(_locked(conversation_id))
    try:
        return state.publish_person(data)
    except RedisError:
        logger.exception("Could not publish the handoff state of conversation %s", conversation_id)
        return None


def _changed(conversation_id, signal=None, **kwargs):
    """Count a change of the conversation's handoff state (``handoff_version``, in the transaction
    that makes it); after its commit, publish the state and send ``signal`` with ``kwargs``."""
    Conversation.objects.filter(pk=conversation_id).update(handoff_version=F("handoff_version") + 1)

    def send():
        publish(conversation_id)
        if signal is not None:
            conversation = Conversation.objects.select_related("assistant").get(pk=conversation_id)
            signal.send(sender=Conversation, conversation=conversation, **kwargs)
    transaction.on_commit(send)


def holds(conversation, user):
    """Whether ``user`` is the staff member answering ``conversation``."""
    return conversation.handoff == Handoff.TAKEN and conversation.handoff_by_id == user.pk


def holder_gone(conversation):
    """Whether ``conversation`` was taken by a staff member who is no longer there (their account
    deleted, which leaves ``handoff_by`` empty, or deactivated): anyone may answer it then."""
    holder = conversation.handoff_by
    return conversation.handoff == Handoff.TAKEN and (holder is None or not getattr(holder, "is_active", True))


def unanswered(conversation):
    """Whether ``conversation`` waits for a person with no one answering it: no one took it yet,
    or the staff member who did is gone. Anyone with the permission may answer it then, its
    visitor reads it waiting, and may go back to the assistant."""
    return conversation.handoff == Handoff.WAITING or holder_gone(conversation)


def may_take(conversation, user):
    """Whether ``user`` may take ``conversation`` now (``take``): no one answers it (``unanswered``),
    or ``user`` is a superuser, who may take it over from a colleague."""
    if holds(conversation, user):
        return False
    return unanswered(conversation) or (conversation.handoff == Handoff.TAKEN and getattr(user, "is_superuser", False))


def may_answer(conversation, user):
    """Whether ``user`` may reply to, hand back or close ``conversation`` now: no one answers it
    (a reply takes it), or they hold it."""
    return unanswered(conversation) or holds(conversation, user)


def _refusal(conversation, user=None):
    """The ``Refused`` for a change ``conversation``'s handoff state does not allow (for staff: ``user``)."""
    if conversation.handoff == Handoff.CLOSED:
        return Refused(closed_message() if user is None else _("This conversation is closed; nothing was sent."))
    if conversation.handoff == Handoff.TAKEN and user is not None and conversation.handoff_by_id != user.pk:
        other = conversation.handoff_by.get_username() if conversation.handoff_by else _("someone else")
        # Not the sentence's first word: the admin capitalises a message's first letter, and a login's is its own.
        return Refused(_("Nothing was sent: %(name)s is already answering this conversation.") % {"name": other})
    if conversation.handoff in (Handoff.NONE, Handoff.RETURNED):
        return Refused(_("This conversation is back with the assistant; nothing was sent."))
    return AlreadyAsked(_("A person has already been asked for: they will reply here."))


def request(conversation_id, how, reason=""):
    """Hand the conversation to a person (``how``: "button" or "tool"; ``reason``: the tool's
    sentence for staff, sent with ``handoff_requested``); returns the conversation.

    Raises ``NotOffered`` when its assistant does not allow ``how``, ``AlreadyAsked`` (a
    ``Refused``) when staff already hold it, ``Refused`` when it is closed. Asked for with the
    button, a turn still running is stopped: the assistant does not answer a conversation staff hold.
    """
    conversation = Conversation.objects.select_related("assistant", "handoff_by").get(pk=conversation_id)
    if conversation.assistant is None or not conversation.assistant.offers_handoff(how):
        raise NotOffered(_("This assistant cannot hand the conversation to a person."))
    with transaction.atomic():
        changed = Conversation.objects.filter(pk=conversation_id, handoff__in=[Handoff.NONE, Handoff.RETURNED]).update(
            handoff=Handoff.WAITING, handoff_requested_at=timezone.now(), handoff_by=None, handoff_taken_at=None)
        if not changed:
            conversation.refresh_from_db()
            raise _refusal(conversation)
        _changed(conversation_id, handoff_requested, how=how, reason=reason)
    if how == "button":
        for turn in Turn.objects.filter(conversation_id=conversation_id, status__in=Turn.ACTIVE_STATUSES):
            try:
                lifecycle.stop(turn)
            except RedisError:  # the turn still runs; its answer lands, and the next message is kept for staff
                logger.exception("Could not stop turn %s of a conversation handed to a person", turn.id)
    conversation.refresh_from_db()
    return conversation


def keep(conversation, content, idempotency_key=""):
    """Save a visitor's ``content`` for staff (no turn, no job) while they hold ``conversation``,
    whose row the caller has locked; returns ``(message, created)``: ``created`` is False for the
    message an earlier request with the same ``idempotency_key`` kept. Raises ``Refused`` when
    staff do not hold it."""
    if idempotency_key:
        earlier = state.kept_message(conversation.pk, idempotency_key)
        found = earlier and conversation.messages.filter(pk=earlier, turn__isnull=True).first()
        if found:
            return found, False
    if conversation.handoff not in Conversation.HELD:
        raise _refusal(conversation)
    limit = get_config()["HANDOFF_MAX_MESSAGES"]
    if limit and conversation.messages.filter(turn__isnull=True, role=Message.Role.USER).count() >= limit:
        raise Refused(_("This conversation has reached its limit of %(limit)d messages to our staff. Please wait "
                        "for their reply, or start a new conversation.") % {"limit": limit})
    content = Scrubber(assistants.settings_for(conversation.assistant)).text(content)  # REDACT, as for a turn
    message = Message.objects.create(conversation=conversation, turn=None, role=Message.Role.USER, content=content)
    if idempotency_key:
        state.remember_kept(conversation.pk, idempotency_key, message.pk)
    _changed(conversation.pk)
    return message, True


def take(conversation_id, user, holder=None):
    """``user`` takes the conversation (one staff member at a time, ``may_take``); returns it.
    Taking one's own again does nothing; one handed back or closed raises ``Refused``. A colleague
    still there is replaced only when ``holder`` names them (the pk the superuser's page showed),
    so that of two pressing Take at once the second is refused instead of taking it from the first."""
    with transaction.atomic():
        conversation, taken = _take(conversation_id, user, holder)
        if taken:
            _changed(conversation_id, handoff_taken, user=user)
    return conversation


def _take(conversation_id, user, holder=None):
    """``take`` within the caller's transaction, without counting the change: returns the
    conversation and whether ``user`` took it now (False: they held it already)."""
    conversation = _locked(conversation_id)
    if holds(conversation, user):
        return conversation, False
    over = conversation.handoff == Handoff.TAKEN and not holder_gone(conversation)
    if not may_take(conversation, user) or (over and str(conversation.handoff_by_id) != str(holder)):
        raise _refusal(conversation, user)
    conversation.handoff, conversation.handoff_by = Handoff.TAKEN, user
    conversation.handoff_taken_at = timezone.now()
    conversation.save(update_fields=["handoff", "handoff_by", "handoff_taken_at"])
    return conversation, True


def reply(conversation_id, user, content):
    """Save ``user``'s reply to the visitor (taking the conversation if it still waits); returns
    the ``Message``. Refused for a conversation another took, handed back or closed."""
    content = (content or "").strip()
    if not content:
        raise Refused(_("Write a reply first; nothing was sent."))
    limit = get_config()["MAX_MESSAGE_LENGTH"]
    if len(content) > limit:
        raise Refused(_("A reply may have at most %(limit)d characters; nothing was sent.") % {"limit": limit})
    with transaction.atomic():
        conversation, taken = _take(conversation_id, user)
        # One change, published once, whether or not the reply took the conversation too.
        _changed(conversation_id, handoff_taken if taken else None, user=user)
        return Message.objects.create(conversation=conversation, turn=None, role=Message.Role.STAFF,
                                      author=user, content=content)


def _end(conversation_id, user, to):
    with transaction.atomic():
        conversation = _locked(conversation_id)
        if not may_answer(conversation, user):
            raise _refusal(conversation, user)
        Conversation.objects.filter(pk=conversation_id).update(handoff=to)
        _changed(conversation_id)
    conversation.handoff = to
    return conversation


def hand_back(conversation_id, user):
    """Give the conversation back to the assistant, which then reads the staff messages in its history."""
    return _end(conversation_id, user, Handoff.RETURNED)


def close(conversation_id, user):
    """End the conversation: neither staff nor the assistant answer it any more."""
    return _end(conversation_id, user, Handoff.CLOSED)


def back_to_assistant(conversation_id):
    """The visitor stops waiting for a person (none took it, or the one who did has left) and
    writes to the assistant again."""
    with transaction.atomic():
        conversation = _locked(conversation_id)
        if not unanswered(conversation):
            if conversation.handoff == Handoff.TAKEN:
                raise Refused(_("A person has joined: they will reply here."))
            raise Refused(_("This conversation is not waiting for a person."))
        # Conditional on what was read: SQLite has no row lock, and a take may land in between.
        if not Conversation.objects.filter(pk=conversation_id, handoff=conversation.handoff,
                                           handoff_by=conversation.handoff_by_id).update(handoff=Handoff.RETURNED):
            raise Refused(_("This conversation is not waiting for a person."))
        _changed(conversation_id)
    return Conversation.objects.get(pk=conversation_id)


def staff_fields():
    """The user model's fields that change what a visitor reads of a staff member (their name,
    ``staff_name``; whether they are still there, ``holder_gone``)."""
    from django.contrib.auth import get_user_model

    model = get_user_model()
    return {model.USERNAME_FIELD, "first_name", "last_name", "is_active"}


def staff_changed(user):
    """Count a change of every handoff state that shows ``user`` (held by them, or with a message
    of theirs), so that the visitor's next poll reads their new name or that they left; call it
    in the transaction that saves or deletes the user (before a delete empties the references)."""
    shown = (Conversation.objects.exclude(handoff=Handoff.NONE)
             .filter(Q(handoff_by=user) | Q(messages__author=user, messages__turn__isnull=True))
             .values_list("pk", flat=True).distinct())
    for conversation_id in list(shown):
        _changed(conversation_id)


def owner_changed(conversation_ids):
    """Publish again, naming their new owner, the handoff states of those of ``conversation_ids``
    ever handed to a person (``claim_on_login`` made them a user's): the poll checks the cached
    owner, so the user's other sessions were refused until ``STATE_TTL``. Each is a change
    (``_changed``), so a publish that read the old owner cannot be written after it."""
    with transaction.atomic():
        for conversation_id in (Conversation.objects.filter(pk__in=conversation_ids).exclude(handoff=Handoff.NONE)
                                .values_list("pk", flat=True)):
            _changed(conversation_id)


def waiting():
    """The inbox: conversations staff hold, the longest wait first."""
    return (Conversation.objects.filter(handoff__in=Conversation.HELD).select_related("assistant", "handoff_by")
            .order_by("handoff_requested_at"))


# The tool's result, which the visitor reads in the widget's step; the model is not called again
# in that turn (``hands_over``), so it says what happened and asks nothing of it.
HANDED_OVER = "A person from the site's staff has been asked to join and will reply in this conversation."


@tool(idempotent=True)
def hand_to_person(context, reason: str = "") -> str:
    """Hand this conversation to a person from the site's staff: when the visitor asks for a human,
    or when you cannot help them. A person then replies in this conversation and you stop
    answering it. ``reason``: one short sentence for the staff member."""
    try:
        request(context.conversation.pk, "tool", reason=reason[:500])
    except AlreadyAsked:
        pass  # what the tool is for is done (a turn resumed after its worker died runs it again): no error
    except Refused as exc:
        raise ToolError(exc.message) from None
    return HANDED_OVER


def hands_over(row):
    """Whether ``row`` (a saved ``Message``) is ``hand_to_person``'s result without an error: the
    conversation is a person's now, so the runner ends the turn there, with nothing more from the
    model (no other tool of its reply, no next call); the widget's handoff line tells the visitor."""
    return row.role == Message.Role.TOOL and row.tool_name == hand_to_person.name and not row.is_error


__all__ = ["handoff_requested", "handoff_taken", "Refused", "NotOffered", "AlreadyAsked", "Held", "request", "keep",
           "take", "reply", "hand_back", "close", "back_to_assistant", "waiting", "hand_to_person", "HANDED_OVER",
           "ensure_with_assistant", "state_from_db", "public", "publish", "staff_name", "message_json", "holds",
           "holder_gone", "unanswered", "told_no_one_free", "may_take", "may_answer", "hands_over", "owner_changed", "staff_changed",
           "staff_fields"]


def waiting_count():
    """How many conversations wait for a person to take them (the ``conversations.handoffs.waiting`` metric)."""
    return Conversation.objects.filter(handoff=Handoff.WAITING).count()
