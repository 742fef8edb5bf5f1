"""Receivers: a visitor's recent anonymous conversations follow them into their account, a
saved user's verified session hash is forgotten (see ``owners``), a staff member renamed,
deactivated or deleted is what their visitors read next (``handoff.staff_changed``), a page
that fails because Redis is unreachable is logged where an operator looks, and staff are mailed
when a visitor asks for a person.

A test run's turn that ended, however it ended, is scored and its run goes on
(``lifecycle.turn_ended``).

The app's own signals, for a site to connect its chat tool or pager to:
``handoff_requested(sender=Conversation, conversation, how, reason)`` and
``handoff_taken(sender=Conversation, conversation, user)``, each sent once, after the commit.
"""

import datetime
import logging

from django.apps import apps as django_apps
from django.conf import settings
from django.contrib.auth.signals import user_logged_in
from django.core.mail import send_mail
from django.core.signals import got_request_exception
from django.db import transaction
from django.db.models import Max, Q
from django.db.models.signals import post_delete, post_save, pre_delete
from django.dispatch import receiver
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from redis.exceptions import RedisError

from .infra import state
from .engine import handoff, lifecycle
from .engine.handoff import handoff_requested, handoff_taken
from .conf import get_config
from .evals import runs as test_runs
from .models import Conversation, Turn
from .infra.network import describe_redis_error
from .owners import SESSION_KEY
from .api.sessions import UNAVAILABLE_ERRORS

logger = logging.getLogger("conversations.redis")

__all__ = ["handoff_requested", "handoff_taken"]


def site_url(path):
    """``path`` as a full URL: on ``SITE_URL`` when set, else on the current site of
    ``django.contrib.sites`` (https) where a site installed it, else ``path`` as it is (then
    ``conversations.W046`` says so): a mail sent from a worker has no request to take the host from."""
    base = get_config()["SITE_URL"]
    if base:
        return base.rstrip("/") + path
    if not django_apps.is_installed("django.contrib.sites"):
        return path
    from django.contrib.sites.models import Site  # an optional app: importable only where installed

    return f"https://{Site.objects.get_current().domain}{path}"


@receiver(handoff_requested, dispatch_uid="conversations_mail_handoff")
def mail_handoff(sender, conversation, how, reason="", **kwargs):
    """Mail ``HANDOFF_EMAILS`` (Django's mail settings) that a visitor waits for a person, with
    the answer page's address. The text names the assistant and the conversation only: what the
    visitor wrote, and the model's ``reason`` (which may quote them), stay in the admin, behind
    its permission."""
    recipients = list(get_config()["HANDOFF_EMAILS"])
    if not recipients:
        return
    try:
        where = site_url(reverse("admin:conversations_waitingconversation_change", args=[conversation.pk]))
    except NoReverseMatch:  # a site without the admin
        where = str(conversation.pk)
    assistant = conversation.assistant.name if conversation.assistant_id else "-"
    lines = [f"A visitor is waiting for a person ({'the assistant asked' if how == 'tool' else 'they asked'}).",
             f"Assistant: {assistant}", f"Answer it: {where}"]
    try:
        send_mail(f"A visitor is waiting for a person ({assistant})", "\n".join(lines), None, recipients)
    except Exception:  # noqa: BLE001 - a mail server down must not undo the handoff, which is saved
        logging.getLogger("conversations.handoff").exception("Could not mail %s about conversation %s",
                                                             recipients, conversation.pk)


@receiver(lifecycle.turn_ended, dispatch_uid="conversations_advance_test_run")
def advance_test_run(sender, turn, **kwargs):
    """A turn of a test run (its answer to a question, or the judge's verdict) has ended, by its
    job, Stop or the repair: the run scores it and starts its next questions, so that it goes on
    with only the site's workers running and nobody looking at it. A visitor's turn (in the job,
    its conversation is already loaded) costs no query."""
    if turn.conversation.internal:
        test_runs.advance_for(turn)


@receiver(user_logged_in, dispatch_uid="conversations_claim_on_login")
def claim_on_login(sender, request, user, **kwargs):
    """A visitor who chatted anonymously keeps those conversations when they log in.

    Login keeps the session's data, so the owner token is still there and the visitor keeps
    reading every conversation of it from this browser. Those active within the last
    ``CLAIM_ON_LOGIN_WITHIN`` seconds (0: none) also become the user's, readable from any of
    their sessions: only recent ones, because whoever logs in on a browser (a shared computer,
    a login forced by another site) would get every conversation ever held on it. The cached
    states of their turns, and of those handed to a person, are republished naming the user, so
    that polls from any of the user's sessions keep working.
    """
    session = getattr(request, "session", None)
    token = session.get(SESSION_KEY) if session is not None else None
    window = get_config()["CLAIM_ON_LOGIN_WITHIN"]
    if not token or window <= 0:
        return
    since = timezone.now() - datetime.timedelta(seconds=window)
    claimed = list(
        Conversation.objects.filter(user__isnull=True, owner_token=token)
        .annotate(last_turn=Max("turns__enqueued_at"))
        .filter(Q(created_at__gte=since) | Q(last_turn__gte=since))
        .values_list("pk", flat=True)
    )
    if not claimed:
        return
    with transaction.atomic():
        Conversation.objects.filter(pk__in=claimed).update(user=user)
        handoff.owner_changed(claimed)
    # Only turns recent enough to still have a cached state (and a job that may still publish one).
    recent = timezone.now() - datetime.timedelta(seconds=get_config()["STATE_TTL"])
    turns = list(Turn.objects.filter(conversation_id__in=claimed, enqueued_at__gte=recent)
                 .select_related("conversation"))
    state.owners_changed({turn.conversation_id: turn.conversation for turn in turns}.values())
    for turn in turns:
        cached = state.read(turn.id)
        if cached is not None:
            state.publish(cached)  # names the user now (state.owners_changed)


@receiver(user_logged_in, dispatch_uid="conversations_remember_verified_session")
def remember_verified_session(sender, request, user, **kwargs):
    """A login has just verified the user: their polls need not ask the database again (until the
    user is saved). Connected after auth's own ``update_last_login``, whose save drops the stamp."""
    try:
        state.write_auth_stamp(user)
    except RedisError:
        pass


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="conversations_user_saved")
@receiver(post_delete, sender=settings.AUTH_USER_MODEL, dispatch_uid="conversations_user_deleted")
def forget_verified_session(sender, instance, **kwargs):
    """A changed password or ``is_active`` must reach the poll's fast path at once: drop the
    user's verified auth hash, so that the next poll of each session asks Django again."""
    try:
        state.forget_auth_stamp(instance.pk)
    except RedisError:  # the stamp expires with STATE_TTL; saving a user must not fail for it
        pass


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="conversations_staff_saved")
@receiver(pre_delete, sender=settings.AUTH_USER_MODEL, dispatch_uid="conversations_staff_deleted")
def republish_staff(sender, instance, update_fields=None, **kwargs):
    """A staff member renamed, deactivated or deleted: the visitors whose handoff shows them read
    it at their next poll (not a login's save of ``last_login``, which changes nothing they read)."""
    if update_fields is not None and not set(update_fields) & handoff.staff_fields():
        return
    if kwargs.get("created") or kwargs.get("raw"):
        return  # a new user appears in no conversation yet; a fixture's load publishes nothing
    with transaction.atomic():  # a delete's own transaction: its publish comes after the commit
        handoff.staff_changed(instance)


@receiver(got_request_exception, dispatch_uid="conversations_log_redis_500")
def log_unreachable_redis(sender, request=None, **kwargs):
    """Log a page outside the API (the admin's login, with the README's sessions in the cache)
    that answers Django's HTML 500 because Redis cannot be reached. Django logs a 500 only to
    ``mail_admins`` unless ``DEBUG`` is on, so a new site's log would otherwise say nothing; this
    line (an error: Python prints it even where no logging is configured) names Redis's host,
    port and reason. The API answers these with its own 503 and logs them there."""
    import sys

    exc = sys.exc_info()[1]
    if isinstance(exc, UNAVAILABLE_ERRORS):
        path = getattr(request, "path", "?")
        method = getattr(request, "method", "?")
        logger.error("Redis is unreachable; %s %s answered 500: %s", method, path, describe_redis_error(exc))
