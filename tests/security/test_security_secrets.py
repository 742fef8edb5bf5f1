"""The provider API key never lands anywhere but the provider's Authorization header: not in
the cache (Redis), the database, the admin or the RQ dashboard, the logs, or what the
visitor sees, even when the provider quotes the key back in its error messages."""

import json
import logging

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.urls import reverse

from conversations.models import Turn
from tests.support.helpers import api_post, local_key, make_client, poll_until_done, redis_values
from tests.support.fakes import FakeProvider, Reply, openai_text

pytestmark = pytest.mark.django_db(transaction=True)


# One key that looks like a key, one that no pattern would recognise.
KEYS = ["sk-SECRET-123", "plainword-Zq81"]


def echoing(status, key):
    """A provider error whose message quotes the key, as OpenAI's 401 does (partly masked there)."""
    return Reply(status, {"error": {"message": f"Incorrect API key provided: {key}. Key {key} is not valid.",
                                    "type": "invalid_request_error", "code": "invalid_api_key" if status == 401
                                    else None, "param": key}},
                 headers={"X-Echo": key})


def database_rows():
    """Every row of every table, as text."""
    for model in apps.get_models(include_auto_created=True):
        if not model._meta.managed:  # django-rq's dashboard placeholder has no table
            continue
        for row in model.objects.values_list():
            yield f"{model._meta.db_table}: {row!r}"


def admin_pages(client):
    """Every admin changelist and change page, and every page of the RQ dashboard about our jobs."""
    for model in admin.site._registry:
        if not model._meta.managed:  # django-rq's link to its dashboard, visited below
            continue
        info = model._meta.app_label, model._meta.model_name
        yield client.get(reverse(f"admin:{info[0]}_{info[1]}_changelist"))
        for pk in model.objects.values_list("pk", flat=True)[:20]:
            yield client.get(reverse(f"admin:{info[0]}_{info[1]}_change", args=[pk]))
    yield client.get(reverse("django_rq:home"))
    for name in ("jobs", "finished_jobs", "failed_jobs", "started_jobs"):
        yield client.get(reverse(f"django_rq:{name}", args=[0]))
    for job_id in Turn.objects.values_list("job_id", flat=True):
        yield client.get(reverse("django_rq:job_detail", args=[0, job_id]))


@pytest.fixture
def log_file(tmp_path):
    """Every log record of this process and of the forked work horses, at DEBUG, in one file."""
    path = tmp_path / "all.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s %(args)s"))
    handler.setLevel(logging.DEBUG)
    root = logging.getLogger()
    levels = {name: logging.getLogger(name).level for name in ("", "conversations", "rq", "urllib3")}
    root.addHandler(handler)
    for name in levels:
        logging.getLogger(name).setLevel(logging.DEBUG)
    yield path
    root.removeHandler(handler)
    handler.close()
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("api_key", KEYS)
def test_the_api_key_is_nowhere_after_failed_and_successful_turns(api_key, conversations_settings, worker, log_file,
                                                                 caplog, capfd):
    caplog.set_level(logging.DEBUG)
    client = make_client()
    seen = []
    with FakeProvider() as fake:
        fake.add(echoing(401, api_key),                             # turn 1: rejected credentials
                 echoing(500, api_key), echoing(500, api_key), echoing(500, api_key),  # turn 2: provider down
                 echoing(400, api_key),                             # turn 3: a request the provider refuses
                 Reply(200, f"not an object {api_key}"),            # turn 4: an unreadable reply
                 openai_text("All good."))                          # turn 5: success
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY=api_key, MAX_ATTEMPTS=3)
        conversation = api_post(client, "/api/conversations/").json()["id"]
        for number in range(5):
            started = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": f"Question {number}"})
            seen.append(started.content)
            worker()
            final = poll_until_done(client, started.json()["poll_url"])
            seen.append(repr(final).encode())
        seen.append(client.get(f"/api/conversations/{conversation}/").content)
        sent = [request["headers"].get("Authorization") for request in fake.requests]

    # The key was really in play: every request carried it.
    assert sent == [f"Bearer {api_key}"] * 7
    statuses = list(Turn.objects.order_by("enqueued_at").values_list("status", flat=True))
    assert statuses == ["failed", "failed", "failed", "failed", "completed"]

    secret = api_key.encode()
    assert [v for v in redis_values() if v and secret in v] == []
    assert [row for row in database_rows() if api_key in row] == []
    assert [body for body in seen if secret in body] == []

    superuser = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    staff = make_client()
    staff.force_login(superuser)
    pages = list(admin_pages(staff))
    assert pages and all(page.status_code == 200 for page in pages), [(p.request["PATH_INFO"], p.status_code)
                                                                       for p in pages if p.status_code != 200]
    assert [page.request["PATH_INFO"] for page in pages if secret in page.content] == []

    logged = log_file.read_text()
    assert "provider call" in logged  # the work horses' records did reach the file
    assert api_key not in logged
    assert [r.getMessage() for r in caplog.records if api_key in r.getMessage() or api_key in str(r.__dict__)] == []
    out, err = capfd.readouterr()
    assert api_key not in out and api_key not in err


def test_the_key_of_an_assistants_fallback_credential_is_nowhere_either(conversations_settings, worker, log_file,
                                                                         monkeypatch):
    from conversations.models import Assistant
    from tests.support.fakes import unavailable

    key = "plainword-Backup-77"
    monkeypatch.setenv("TEST_BACKUP_KEY", key)
    conversations_settings.update(CREDENTIALS={"backup": local_key("env:TEST_BACKUP_KEY")}, FALLBACK_RESERVE=2,
                                  MAX_ATTEMPTS=1)
    client = make_client()
    with FakeProvider(default=unavailable(500)) as primary, FakeProvider() as backup:
        backup.add(echoing(500, key), openai_text("From the backup."))  # down (quoting the key), then answering
        Assistant.objects.create(slug="support", name="Support", system_prompt="Hi.", provider="openai",
                                 base_url=primary.url, fallbacks=[{"provider": "openai", "base_url": backup.url,
                                                                   "credential": "backup"}])
        conversation = api_post(client, "/api/conversations/", {"assistant": "support"}).json()["id"]
        finals = []
        for number in range(2):
            started = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": f"Question {number}"})
            worker()
            finals.append(poll_until_done(client, started.json()["poll_url"]))

    assert [f["status"] for f in finals] == ["failed", "completed"]
    assert [r["headers"]["Authorization"] for r in backup.requests] == [f"Bearer {key}"] * 2
    assert key not in repr(finals)
    assert [v for v in redis_values() if v and key.encode() in v] == []
    assert [row for row in database_rows() if key in row] == []  # the version names the credential only
    superuser = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    staff = make_client()
    staff.force_login(superuser)
    assert [page.request["PATH_INFO"] for page in admin_pages(staff) if key.encode() in page.content] == []
    logged = log_file.read_text()
    assert "provider call" in logged and key not in logged


@pytest.mark.parametrize("provider, base, header", [
    ("openai", "/v1", "authorization"),
    ("openai", "/openai/deployments/chat?api-version=2024-10-21", "api-key"),  # Azure style
    ("anthropic", "", "x-api-key"),
])
@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_never_followed_and_the_key_stays_home(conversations_settings, provider, base, header,
                                                             status):
    from tests.support.fake_wire import run_turn_here

    key = "sk-REDIRECT-test-0123456789"
    with FakeProvider() as elsewhere, FakeProvider() as fake:
        target = f"{elsewhere.url}/collect?token=location-secret"
        fake.add(Reply(status, b"", {"Location": target}))
        conversations_settings.update(PROVIDER=provider, BASE_URL=f"http://127.0.0.1:{fake.port}{base}", API_KEY=key,
                                      MAX_ATTEMPTS=3)
        turn = run_turn_here("Hello?")

        assert header in {k.lower() for k in fake.requests[0]["headers"]}  # the key went to the configured host
        assert elsewhere.requests == [] and len(fake.requests) == 1  # not followed, and not retried
    assert turn.status == "failed"
    assert turn.error == ("The assistant is not set up correctly: the AI service's address answered with a "
                          f"redirect (HTTP {status}), which is not followed.")
    details = " ".join(turn.calls.values_list("detail", flat=True))
    assert "location-secret" not in turn.error + details and str(status) in details


@pytest.mark.parametrize("api_key", KEYS)
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("when", ["before any text", "after some text", "malformed event"])
def test_a_key_quoted_back_in_a_stream_is_nowhere_in_the_log_or_the_call_records(conversations_settings, caplog,
                                                                                 api_key, provider, when):
    from conversations.models import CallRecord
    from tests.support.fake_stream import anthropic_error_event, anthropic_stream, openai_stream, streaming
    from tests.support.fake_wire import run_turn_here

    events = anthropic_stream if provider == "anthropic" else openai_stream
    error = anthropic_error_event("invalid_request_error", f"key {api_key} is not allowed") \
        if provider == "anthropic" else (None, json.dumps({"error": {"message": f"key {api_key} is not allowed"}}))
    if when == "malformed event":
        error = (None, f'{{"choices": [], "key": "{api_key}"')
    text = events(pieces=["Refunds ", "are "], done=False)[:-2] if when == "after some text" else []
    caplog.set_level(logging.DEBUG)
    with FakeProvider() as fake:
        fake.repeat(streaming([*text, error]), 3)
        base = fake.url if provider == "openai" else f"http://127.0.0.1:{fake.port}"
        conversations_settings.update(PROVIDER=provider, BASE_URL=base, API_KEY=api_key, MODEL="m", TOOLS=[],
                                      MAX_ATTEMPTS=1)
        turn = run_turn_here("How do refunds work?")

    assert turn.status in ("failed", "incomplete")
    details = list(CallRecord.objects.values_list("detail", flat=True))
    assert details and [d for d in details if api_key in d] == []
    assert any("[API key hidden]" in d for d in details)  # the detail is there, without the key
    logged = [r.getMessage() for r in caplog.records]
    assert [m for m in logged if api_key in m] == [] and any("[API key hidden]" in m for m in logged)


def error_report(**frame):
    """The text of an error report (the DEBUG page, a mail to ADMINS) for an exception raised in a
    frame holding ``frame``'s variables, made as Django makes it with the site's filter."""
    import sys

    from django.views.debug import ExceptionReporter, get_default_exception_reporter_filter

    get_default_exception_reporter_filter.cache_clear()  # Django keeps the first filter it made

    def fail(**variables):
        raise RuntimeError("the provider call failed")

    try:
        fail(**frame)
    except RuntimeError:
        reporter = ExceptionReporter(None, *sys.exc_info())
    return reporter.get_traceback_text() + reporter.get_traceback_html()


def test_credentials_are_hidden_in_error_reports_and_a_filter_that_shows_them_is_warned_of(
        conversations_settings, settings):
    from django.core.checks import Warning

    from conversations.checks import check_config
    from conversations.conf import get_config

    bare, bound = "sk-bare-credential-0007", "sk-bound-credential-0008"
    conversations_settings.update(CREDENTIALS={"support": bare, "gateway": {"KEY": bound, "ORIGINS": [
        "https://gw.example.com"]}})
    report = error_report(config=dict(get_config()), key=bare)
    assert bare not in report and bound not in report and "CREDENTIALS" in report
    assert [w for w in check_config() if w.id == "conversations.W042"] == []

    settings.DEFAULT_EXCEPTION_REPORTER_FILTER = "django.views.debug.SafeExceptionReporterFilter"
    assert bare in error_report()  # Django's own filter hides settings by name only
    assert [w for w in check_config() if w.id == "conversations.W042"] == [Warning(
        "Error reports (the DEBUG page, mails to ADMINS) would show 1 of the site's API keys: "
        "DEFAULT_EXCEPTION_REPORTER_FILTER hides settings by name, and CREDENTIALS holds keys under names of your "
        "choosing.",
        hint='Set DEFAULT_EXCEPTION_REPORTER_FILTER = "conversations.redaction.ExceptionReporterFilter" (or a filter '
             "of your own that hides CREDENTIALS).", id="conversations.W042")]
