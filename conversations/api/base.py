"""What every view of the API shares: the base view (authentication, body limits, 503 for an
unreachable Redis, 404 for what the caller does not own), the caller's conversation, and the
public shape of a turn and of its state."""

import logging
import secrets

from django.db import connections, router
from django.db.models import BooleanField, ExpressionWrapper
from django.http import Http404
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.translation import gettext as _
from rest_framework import status
from rest_framework.exceptions import APIException, NotFound, PermissionDenied
from rest_framework.views import APIView

from ..core.sentences import unavailable_message
from ..engine import statements
from ..infra.network import describe_redis_error
from ..models import Conversation
from ..owners import owned_filter, owner_token, request_visitor, visitor_owner_token
from .authentication import CsrfSessionAuthentication, VisitorTokenAuthentication
from .cors import CorsMixin, page_origin_allowed
from .parsers import LimitedJSONParser, check_content_length
from .permissions import LoginNotRequiredMixin, SignedInIfRequired
from .sessions import UNAVAILABLE_ERRORS, check_session_store, save_session
from .throttling import refuse

logger = logging.getLogger("conversations.api")


# The advisory locks of owners (``_lock_owner``) are apart from the knowledge index's (``knowledge.index``).
OWNER_LOCK = "conversations.owner"

PUBLIC_FIELDS = ("id", "conversation", "status", "done", "messages", "error", "version", "resuming", "approvals")


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class ServiceUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "unavailable"


def not_found_message():
    # Not found and not yours read the same (the API never says which).
    return _("This conversation is no longer available. It may have expired; please start a new one.")


def other_assistant_message():
    # Only ever said to the conversation's own visitor: it tells them nothing about anyone else's.
    return _("This conversation was with another assistant of this site, so it cannot go on in this chat. Please "
             "start a new one here.")


def poll_url(turn):
    return reverse("conversations:turn-detail", args=[turn.conversation_id, turn.id])


def rating_url(conversation_id, turn_id):
    # Handed out with every turn, so that the widget never builds an API path of its own.
    return reverse("conversations:turn-rating", args=[conversation_id, turn_id])


def turn_summary(turn):
    return {
        "id": str(turn.id),
        "conversation": str(turn.conversation_id),
        "status": turn.status,
        "done": turn.done,
        "poll_url": poll_url(turn),
        "cancel_url": reverse("conversations:turn-cancel", args=[turn.conversation_id, turn.id]),
        "rating_url": rating_url(turn.conversation_id, turn.id),
        # Where a tool call this turn waits for (its state's ``approvals``) is approved or declined.
        "approval_url": reverse("conversations:turn-approval", args=[turn.conversation_id, turn.id]),
    }


def public_state(data):
    return {**{key: data.get(key) for key in PUBLIC_FIELDS}, "resuming": bool(data.get("resuming")),
            "approvals": data.get("approvals") or []}


def owned_conversation(request, conversation_id, *, for_update=False, user=None):
    """The caller's conversation ``conversation_id`` (a UUID, or None for a malformed id), else 404.
    ``for_update``: inside ``transaction.atomic()``, lock the caller as an owner (``_lock_owned``).
    ``user``: the caller's verified user, where ``request.user`` is not it (see ``owned_filter``)."""
    if conversation_id is None:
        raise NotFound()
    queryset = Conversation.objects.filter(owned_filter(request, user))
    if for_update:
        locked = _lock_owned(request, user, conversation_id)
        if locked is not None:
            return locked
    try:
        return get_object_or_404(queryset, pk=conversation_id)
    except Http404:
        if with_another_assistant(request, user, conversation_id):
            raise NotFound(other_assistant_message()) from None
        raise


def _lock_owned(request, user, conversation_id):
    """Lock the caller as an owner, so that the limits spanning their conversations (turns running
    at once, the daily token budget) are checked by one request at a time, and return their
    conversation ``conversation_id`` read under that lock (None when it is not the caller's here:
    ``owned_conversation`` then says why). The cost does not grow with the owner's history:

    - without row locks (SQLite) the transaction already holds the database's one write lock
      (the demo's ``BEGIN IMMEDIATE``), so only the posted conversation is read;
    - on PostgreSQL one transaction-level advisory lock per owner (``_lock_owner``), then only the
      posted conversation's row is locked and read, by a statement of its own: it starts once the
      owner's lock is held, so it reads what the request that held it committed (both statements
      in one round trip where the driver binds on the client);
    - elsewhere (MySQL, MariaDB: not tested here) every conversation the limits count is locked, in
      one order, as before: a token's user has conversations with other assistants too."""
    alias = router.db_for_write(Conversation)  # where a locking read goes, whatever the site's router
    # By its key alone: no order (the model's) for a planner to read the owner's rows by.
    mine = Conversation.objects.using(alias).filter(owned_filter(request, user), pk=conversation_id).order_by()
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return _lock_owner(connection, request, user, mine.select_for_update())
    if not connection.features.has_select_for_update:
        return next(iter(mine), None)
    everything = Conversation.objects.filter(owned_filter(request, user, every_assistant=True))
    names = [field.attname for field in Conversation._meta.concrete_fields]
    scoped = request_visitor(request) is not None  # only then are the rows locked more than the caller's here
    if scoped:
        everything = everything.annotate(caller_here=ExpressionWrapper(owned_filter(request, user),
                                                                      output_field=BooleanField()))
    rows = everything.select_for_update().order_by("pk").values_list(*names, *(["caller_here"] if scoped else []))
    pk, wanted = names.index(Conversation._meta.pk.attname), Conversation._meta.pk.to_python(conversation_id)
    found = None
    for values in rows:
        if values[pk] == wanted and (not scoped or values[-1]):
            found = values[:len(names)]
    return None if found is None else Conversation.from_db(rows.db, names, found)


def _lock_owner(connection, request, user, rows):
    """Take PostgreSQL's transaction-level advisory lock, on ``connection``, of each name the caller
    owns by: their user (whose conversations span every assistant, also for a visitor token naming
    them) and their owner token (a session's, or a visitor token's). The limits per owner count exactly those
    conversations (``owners.owned_by``), so two requests sharing either name wait for each other,
    whether or not it owns any row yet. Both are taken in one statement, the user's first
    (PostgreSQL evaluates a select list in order), so that no two requests each hold a lock the
    other waits for. Two names may hash alike: their owners then wait for each other, which costs
    a wait, never a wrong count.

    Then returns the first conversation of ``rows`` (a queryset), read once the locks are held. Both
    statements go through ``statements.send``, which sends them as one string, in one round trip
    not two, where the driver binds on the client: PostgreSQL starts each statement of a string
    once the one before it has ended, with a snapshot of its own (READ COMMITTED), so the read
    still sees what the lock's last holder committed, as a statement sent after it would."""
    user = user if user is not None else getattr(request, "user", None)
    names = ([f"user:{user.pk}"] if user is not None and user.is_authenticated else []) + \
        ([f"token:{token}"] if (token := owner_token(request)) else [])
    if not names:
        return next(iter(rows), None)
    locks = f"SELECT {', '.join(['pg_advisory_xact_lock(hashtext(%s), hashtext(%s))'] * len(names))}"
    params = [value for name in names for value in (OWNER_LOCK, name)]
    lock = statements.Statement(connection, locks, params, lambda _cursor: None)
    return statements.send(lock, statements.first_statement(rows))[1]


def with_another_assistant(request, user, conversation_id):
    """Whether conversation ``conversation_id`` is the caller's own, with another assistant than the
    one their visitor token was given for (a signed-in user's, or the same anonymous visitor's),
    and one that pages of the token's origin may embed too: the token cannot open it, and the
    caller should hear why, not "expired". A conversation with an assistant that page may not
    embed (one kept for the site's own pages) stays "not found" to it."""
    visitor = request_visitor(request)
    if visitor is None:
        return False
    other = (Conversation.objects.filter(pk=conversation_id).exclude(owned_filter(request, user))
             .select_related("assistant").first())
    if other is None or other.assistant_id == visitor.assistant_id:
        return False
    theirs = Conversation.objects.filter(owned_filter(request, user, every_assistant=True), pk=other.pk).exists() \
        or secrets.compare_digest(other.owner_token or "", visitor_owner_token(visitor.origin, other.assistant_id,
                                                                               visitor.visitor_id))
    return theirs and page_origin_allowed(visitor.origin, other.assistant)


class RedisDownMixin:
    """An unreachable Redis answers 503 ``{"detail": "<sentence>"}`` from every API view, never
    Django's HTML 500: errors raised in the view (throttle history, live states, the queue) are
    turned into a ``ServiceUnavailable``; a session kept in the cache is checked before anything
    trusts it, and a changed session is saved inside the view (see ``sessions``)."""

    def handle_exception(self, exc):
        """DRF's, with Redis errors answered 503 instead of re-raised, and every 404 with the app's
        own sentence (not "No Conversation matches the given query.") unless it says one of its own
        ("This assistant is not available."); returns the response."""
        if isinstance(exc, UNAVAILABLE_ERRORS):
            logger.error("Redis is unreachable; %s %s answered 503: %s", self.request.method, self.request.path,
                         describe_redis_error(exc))
            exc = ServiceUnavailable(unavailable_message())
        elif isinstance(exc, Http404) or (isinstance(exc, NotFound) and exc.detail == NotFound.default_detail):
            exc = NotFound(not_found_message())  # a 404 that says its own sentence keeps it
        return super().handle_exception(exc)

    def finalize_response(self, request, response, *args, **kwargs):
        """Save the session before the response goes out, so that a failure is still a 503."""
        if response.status_code < 500:
            try:
                save_session(request)
            except UNAVAILABLE_ERRORS as exc:
                response = self.handle_exception(exc)
        return super().finalize_response(request, response, *args, **kwargs)


class ConversationAPIView(CorsMixin, LoginNotRequiredMixin, RedisDownMixin, APIView):
    """Base of the API views: a visitor token (a widget embedded on another site, ``tokens``),
    else session authentication with CSRF for everyone; CORS for the allowed origins (``cors``);
    JSON bodies only, a body over ``MAX_REQUEST_BYTES`` refused (413) before anything reads it,
    and anonymous callers refused (403) while ``LOGIN_REQUIRED`` is on."""

    authentication_classes = [VisitorTokenAuthentication, CsrfSessionAuthentication]
    permission_classes = [SignedInIfRequired]
    parser_classes = [LimitedJSONParser]

    def permission_denied(self, request, message=None, code=None):
        """Always a 403 with the permission's sentence: DRF's own would give an anonymous caller
        "Authentication credentials were not provided." instead."""
        raise PermissionDenied(message)

    throttle_message = None  # the sentence of this view's 429; None: DRF's

    def initial(self, request, *args, **kwargs):
        check_content_length(request)
        check_session_store(request)
        super().initial(request, *args, **kwargs)

    def throttled(self, request, wait):
        """A 429 with the view's sentence alone, and ``Retry-After`` in whole seconds (``refuse``)."""
        refuse(self.throttle_message, wait)
