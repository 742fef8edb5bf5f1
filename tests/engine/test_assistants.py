"""Several assistants on one site: chosen by the page, each answering with its own prompt, model,
endpoint, credential, tools and limits, recorded on every turn; what cannot work is refused when
it is saved, and otherwise ends the turn with a sentence naming the assistant."""

import json
import logging

import pytest
from django.core.exceptions import ValidationError
from django.template import Context, Template
from django.test import RequestFactory

from conversations import assistants
from conversations.models import Assistant, AssistantVersion, Conversation, Turn
from tests.support.fakes import FakeProvider, Reply, openai_text, openai_tool_calls, unavailable
from tests.support.helpers import api_post, local_key, logged_in_client, make_client, poll_until_done


def make_assistant(slug, **fields):
    values = {"name": slug.title(), "system_prompt": f"You are {slug.title()}.", "provider": "demo"}
    values.update(fields)
    return Assistant.objects.create(slug=slug, **values)


def render(template, path="/help/"):
    request = RequestFactory().get(path)
    return Template("{% load conversations %}" + template).render(Context({"request": request}))


def start(client, assistant, content):
    """Start a conversation with ``assistant`` (a slug, or None) and send ``content``; the 202 body."""
    body = {"assistant": assistant} if assistant is not None else {}
    created = api_post(client, "/api/conversations/", body)
    assert created.status_code == 201, created.content
    assert created.json()["assistant"] == assistant
    response = api_post(client, f"/api/conversations/{created.json()['id']}/turns/", {"content": content})
    assert response.status_code == 202, response.content
    return response.json()


# -- choosing one --------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_tag_renders_each_assistants_widget_with_its_slug_title_greeting_and_suggestions():
    make_assistant("support", name="Help desk", greeting="Hi! Ask me about refunds.",
                   suggestions=["How do refunds work?", "Where is my \"order\"?"], job_timeout=30)
    make_assistant("shop", name="Shop", greeting="")

    html = render('{% chat_widget assistant="support" %}{% chat_widget assistant="shop" %}')

    assert html.count("data-conversations-widget") == 2
    support, shop = html.split("data-conversations-widget")[1:]
    assert 'data-assistant="support"' in support and 'data-assistant="shop"' in shop
    assert 'data-greeting="Hi! Ask me about refunds."' in support
    # The suggestions are JSON in the attribute, escaped for HTML.
    assert 'data-suggestions="[&quot;How do refunds work?&quot;, &quot;Where is my \\&quot;order\\&quot;?&quot;]"' \
        in support
    assert 'data-job-timeout="30"' in support and 'data-job-timeout="10"' in shop
    assert '"title": "Help desk"' in support and '"title": "Shop"' in shop


@pytest.mark.django_db
def test_the_tag_without_an_assistant_is_unchanged():
    html = render("{% chat_widget %}")
    assert "data-conversations-widget" in html and "data-assistant" not in html
    assert '"title": "Assistant"' in html


@pytest.mark.django_db
def test_an_unknown_or_inactive_assistant_renders_nothing_and_logs_a_warning(caplog):
    make_assistant("retired", active=False)
    with caplog.at_level(logging.WARNING, logger="conversations.widget"):
        html = render('<p>page</p>{% chat_widget assistant="nobody" %}{% chat_widget assistant="retired" %}')
    assert html == "<p>page</p>"
    assert [r.getMessage() for r in caplog.records] == [
        "chat_widget: no active assistant 'nobody' on /help/; the widget is not shown",
        "chat_widget: no active assistant 'retired' on /help/; the widget is not shown"]


@pytest.mark.django_db
def test_a_conversation_starts_with_an_active_assistant_and_refuses_others_with_a_sentence():
    make_assistant("support")
    make_assistant("retired", active=False)
    client = make_client()

    created = api_post(client, "/api/conversations/", {"assistant": "support"})
    default = api_post(client, "/api/conversations/", {})
    unknown = api_post(client, "/api/conversations/", {"assistant": "nobody"})
    inactive = api_post(client, "/api/conversations/", {"assistant": "retired"})
    wrong_type = api_post(client, "/api/conversations/", {"assistant": ["support"]})

    assert created.status_code == 201 and created.json()["assistant"] == "support"
    assert Conversation.objects.get(pk=created.json()["id"]).assistant.slug == "support"
    assert default.status_code == 201 and default.json()["assistant"] is None
    assert unknown.status_code == 400
    assert unknown.json() == {"assistant": ["There is no assistant “nobody” on this site."]}
    assert inactive.json() == {"assistant": ["There is no assistant “retired” on this site."]}
    assert wrong_type.status_code == 400
    assert Conversation.objects.count() == 2
    detail = client.get(f"/api/conversations/{created.json()['id']}/").json()
    assert detail["assistant"] == "support" and detail["ratings"] == {}


# -- who may chat with one --------------------------------------------------------------------


def user_client(username, *, staff=False, superuser=False, permissions=()):
    from django.contrib.auth.models import Permission

    client = logged_in_client(username)
    client.user.is_staff, client.user.is_superuser = staff, superuser
    client.user.save()
    for perm in permissions:
        app_label, codename = perm.split(".")
        client.user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return client


@pytest.mark.django_db
def test_each_assistant_lets_only_those_its_access_policy_names_start_a_conversation():
    """Any visitor could chat with any active assistant, a staff-only one included."""
    make_assistant("members", access="signed_in")
    make_assistant("internal", access="staff")
    make_assistant("audit", access="permission", access_permission="conversations.view_turn")
    anonymous, member = make_client(), user_client("member")
    staff, auditor = user_client("staff", staff=True), user_client("auditor", permissions=["conversations.view_turn"])
    root = user_client("root", superuser=True)

    def answer(client, slug):
        response = api_post(client, "/api/conversations/", {"assistant": slug})
        return response.status_code, response.json().get("detail")

    not_yours = (403, "This assistant is not available to you.")
    assert answer(anonymous, "members") == (403, "Please sign in to chat with this assistant.")
    assert [answer(anonymous, slug) for slug in ("internal", "audit")] == [not_yours] * 2
    assert answer(member, "members")[0] == 201
    assert [answer(member, slug) for slug in ("internal", "audit")] == [not_yours] * 2
    assert answer(staff, "internal")[0] == 201 and answer(staff, "audit") == not_yours
    assert answer(auditor, "audit")[0] == 201 and answer(auditor, "internal") == not_yours
    assert answer(root, "audit")[0] == 201  # a superuser holds every permission
    assert sorted(Conversation.objects.values_list("assistant__slug", flat=True)) == [
        "audit", "audit", "internal", "members"]


@pytest.mark.django_db(transaction=True)
def test_a_visitor_who_lost_access_mid_way_gets_a_sentence_not_an_answer(worker):
    make_assistant("internal", name="Internal", access="staff")
    staff = user_client("staff", staff=True)
    turn = start(staff, "internal", "What is on the payroll?")
    staff.user.is_staff = False  # their staff status is taken away while the turn waits for a worker
    staff.user.save()
    staff.force_login(staff.user)

    worker()

    final = poll_until_done(staff, turn["poll_url"])
    assert final["status"] == "failed"
    assert final["error"] == "The assistant “Internal” is not available to you any more."
    assert [m["role"] for m in final["messages"]] == ["user"]
    calls = Turn.objects.get(pk=turn["id"]).calls.all()  # the model was never asked; the timeline says why
    assert [(c.outcome, c.detail) for c in calls] == [("skipped", "refused: the owner may not use it")]


def render_for(template, user=None, path="/help/"):
    from django.contrib.auth.models import AnonymousUser

    request = RequestFactory().get(path)
    request.user = user if user is not None else AnonymousUser()
    return Template("{% load conversations %}" + template).render(Context({"request": request}))


@pytest.mark.django_db
def test_the_widget_of_an_assistant_the_visitor_may_not_use_says_so_and_shows_nothing_of_it():
    make_assistant("internal", greeting="Hi colleague! Payroll questions?", suggestions=["Show salaries"],
                   access="staff")
    make_assistant("members", greeting="Welcome back, member!", suggestions=["My orders"], access="signed_in")
    from django.contrib.auth import get_user_model

    member = get_user_model().objects.create_user("member")
    staff = get_user_model().objects.create_user("staff", is_staff=True)

    for user in (None, member):
        html = render_for('<p>page</p>{% chat_widget assistant="internal" %}', user)
        assert html == '<p>page</p><p class="conversations-refused">This assistant is not available to you.</p>\n'
    assert "Hi colleague!" in render_for('{% chat_widget assistant="internal" %}', staff)

    # Signing in would help: the sign-in link, still without the assistant's greeting and suggestions.
    anonymous = render_for('{% chat_widget assistant="members" %}')
    assert 'data-login-url="/accounts/login/?next=/help/"' in anonymous
    assert "Welcome back" not in anonymous and "My orders" not in anonymous
    signed_in = render_for('{% chat_widget assistant="members" %}', member)
    assert "data-login-url" not in signed_in
    assert 'data-greeting="Welcome back, member!"' in signed_in and "My orders" in signed_in


@pytest.mark.django_db
def test_with_login_required_an_anonymous_page_carries_no_greeting_or_suggestions(conversations_settings):
    conversations_settings.update(LOGIN_REQUIRED=True)
    make_assistant("support", greeting="Hi! Ask me about refunds.", suggestions=["How do refunds work?"])
    from django.contrib.auth import get_user_model

    anonymous = render_for('{% chat_widget assistant="support" %}')
    assert "data-login-url=" in anonymous
    assert "Ask me about refunds" not in anonymous and "How do refunds work" not in anonymous
    member = render_for('{% chat_widget assistant="support" %}', get_user_model().objects.create_user("member"))
    assert "Ask me about refunds" in member and "How do refunds work" in member


# -- two assistants on one page -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_assistants_on_one_page_answer_with_their_own_prompt_model_key_and_tools(
        worker, conversations_settings, monkeypatch):
    monkeypatch.setenv("TEST_SUPPORT_KEY", "sk-support-from-env")
    conversations_settings.update(CREDENTIALS={"support-key": local_key("env:TEST_SUPPORT_KEY"),
                                               "shop-key": local_key("sk-shop-literal")},
                                  PRICES={"support-model": {"input": "1.00", "output": "2.00"}})
    with FakeProvider() as support_api, FakeProvider() as shop_api:
        support_api.add(openai_tool_calls(("search_faq", {"query": "refunds"})), openai_text("Within 30 days."))
        shop_api.add(openai_text("It is noon in Tokyo.", model="shop-model"))
        make_assistant("support", provider="openai", base_url=support_api.url, model="support-model",
                       credential="support-key", tools=["search_faq"], system_prompt="You are the help desk.")
        make_assistant("shop", provider="openai", base_url=shop_api.url, model="shop-model", credential="shop-key",
                       tools=["current_time"], system_prompt="You sell things.", job_timeout=20, max_steps=3)
        page = render('{% chat_widget assistant="support" %}{% chat_widget assistant="shop" %}', path="/")
        assert 'data-assistant="support"' in page and 'data-assistant="shop"' in page

        client = make_client()
        first = start(client, "support", "How do refunds work?")
        second = start(client, "shop", "What time is it in Tokyo?")
        worker()
        answers = [poll_until_done(client, turn["poll_url"]) for turn in (first, second)]

    assert [a["status"] for a in answers] == ["completed", "completed"]
    assert answers[0]["messages"][-1]["content"] == "Within 30 days."
    assert answers[1]["messages"][-1]["content"] == "It is noon in Tokyo."
    asked_support, asked_shop = support_api.requests[0], shop_api.requests[0]
    assert len(support_api.requests) == 2 and len(shop_api.requests) == 1
    assert asked_support["json"]["messages"][0] == {"role": "system", "content": "You are the help desk."}
    assert asked_shop["json"]["messages"][0] == {"role": "system", "content": "You sell things."}
    assert [t["function"]["name"] for t in asked_support["json"]["tools"]] == ["search_faq"]
    assert [t["function"]["name"] for t in asked_shop["json"]["tools"]] == ["current_time"]
    assert (asked_support["json"]["model"], asked_shop["json"]["model"]) == ("support-model", "shop-model")
    assert asked_support["headers"]["Authorization"] == "Bearer sk-support-from-env"
    assert asked_shop["headers"]["Authorization"] == "Bearer sk-shop-literal"

    support_turn = Turn.objects.select_related("assistant", "assistant_version").get(pk=first["id"])
    shop_turn = Turn.objects.select_related("assistant", "assistant_version").get(pk=second["id"])
    assert (support_turn.assistant.slug, shop_turn.assistant.slug) == ("support", "shop")
    # Each turn ran under its assistant's clocks: the site's 10 s, the shop's own 20 s.
    assert (support_turn.job_timeout, shop_turn.job_timeout) == (10, 20)
    snapshot = shop_turn.assistant_version.snapshot
    assert snapshot == {"system_prompt": "You sell things.", "provider": "openai", "model": "shop-model",
                        "base_url": shop_api.url, "credential": "shop-key", "tools": ["current_time"],
                        "limits": {"MAX_STEPS": 3, "MAX_TOKENS": 1024, "CALL_TIMEOUT": 5, "JOB_TIMEOUT": 20}}
    assert "sk-shop-literal" not in str(snapshot)
    assert len(shop_turn.assistant_version.fingerprint) == 12
    # (13 + 11) input and (5 + 7) output tokens at 1.00 and 2.00 per million; the shop's model has no price.
    assert str(support_turn.cost) == "0.00004800" and shop_turn.cost is None


@pytest.mark.django_db(transaction=True)
def test_changing_an_assistant_makes_a_new_version_and_leaves_earlier_turns_alone(worker):
    support = make_assistant("support", system_prompt="Version one.")
    client = make_client()
    first = start(client, "support", "Hello")
    worker()
    poll_until_done(client, first["poll_url"])
    support.system_prompt = "Version two."
    support.save()
    conversation = first["conversation"]
    second = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "Hello again"}).json()
    worker()
    poll_until_done(client, second["poll_url"])
    third = api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "And again"}).json()
    worker()
    poll_until_done(client, third["poll_url"])

    versions = {str(turn.pk): turn.assistant_version for turn in Turn.objects.select_related("assistant_version")}
    one, two, three = (versions[t["id"]] for t in (first, second, third))
    assert one.snapshot["system_prompt"] == "Version one." and two.snapshot["system_prompt"] == "Version two."
    assert one.fingerprint != two.fingerprint and two == three
    assert AssistantVersion.objects.filter(assistant=support).count() == 2


@pytest.mark.django_db(transaction=True)
def test_an_assistants_own_chain_answers_when_its_provider_is_down_and_leaves_the_other_assistant_alone(
        worker, conversations_settings, monkeypatch):
    monkeypatch.setenv("TEST_BACKUP_KEY", "sk-backup-from-env")
    conversations_settings.update(CREDENTIALS={"support-key": local_key("sk-support"),
                                               "backup-key": local_key("env:TEST_BACKUP_KEY")},
                                  FALLBACK_RESERVE=2, MAX_ATTEMPTS=1, STREAM=False, TOOLS=[])
    with FakeProvider(default=unavailable(500)) as support_api, FakeProvider() as backup_api, \
            FakeProvider() as shop_api:
        backup_api.add(openai_text("Refunds take 30 days.", model="backup-model"))
        shop_api.add(openai_text("It is noon in Tokyo.", model="shop-model"))
        make_assistant("support", name="Support", provider="openai", base_url=support_api.url, model="support-model",
                       credential="support-key", fallbacks=[{"provider": "openai", "base_url": backup_api.url,
                                                             "model": "backup-model", "credential": "backup-key"}])
        make_assistant("shop", name="Shop", provider="openai", base_url=shop_api.url, model="shop-model")

        client = make_client()
        first = start(client, "support", "How do refunds work?")
        second = start(client, "shop", "What time is it in Tokyo?")
        worker()
        support_answer, shop_answer = (poll_until_done(client, turn["poll_url"]) for turn in (first, second))

    # The visitor of the help desk gets an answer, from its second provider, with that provider's key.
    assert (support_answer["status"], support_answer["messages"][-1]["content"]) == ("completed",
                                                                                     "Refunds take 30 days.")
    assert [r["headers"]["Authorization"] for r in support_api.requests] == ["Bearer sk-support"]
    assert [r["headers"]["Authorization"] for r in backup_api.requests] == ["Bearer sk-backup-from-env"]
    support_turn = Turn.objects.select_related("assistant_version").get(pk=first["id"])
    assert (support_turn.provider, support_turn.model) == ("openai", "backup-model")  # what the admin shows
    assert [(c.name, c.outcome) for c in support_turn.calls.order_by("id")] == [("support-model", "http_error"),
                                                                               ("backup-model", "ok")]
    # The shop has no chain of its own and the site none: its one provider answered, nothing else was tried.
    assert (shop_answer["status"], shop_answer["messages"][-1]["content"]) == ("completed", "It is noon in Tokyo.")
    shop_turn = Turn.objects.get(pk=second["id"])
    assert (shop_turn.model, len(shop_api.requests)) == ("shop-model", 1)
    assert [(c.name, c.outcome) for c in shop_turn.calls.all()] == [("shop-model", "ok")]
    # The version records the chain by credential name; no key is stored.
    snapshot = support_turn.assistant_version.snapshot
    assert snapshot["fallbacks"] == [{"provider": "openai", "model": "backup-model", "base_url": backup_api.url,
                                      "credential": "backup-key"}]
    assert "sk-" not in json.dumps(snapshot) and "fallbacks" not in shop_turn.assistant_version.snapshot


# -- what cannot work --------------------------------------------------------------------------


@pytest.mark.django_db
def test_saving_refuses_what_cannot_work(conversations_settings):
    conversations_settings.update(CREDENTIALS={"ok": "sk-x", "unset": "env:TEST_NO_SUCH_VARIABLE"},
                                  HISTORY_MAX_CHARS=100, ALLOWED_PROVIDERS=["no.such.Provider"])
    bad = Assistant(slug="bad", name="Bad", system_prompt="x" * 51, provider="no.such.Provider",
                    tools=["search_faq", "delete_everything"], credential="missing", job_timeout=3)
    with pytest.raises(ValidationError) as refused:
        bad.full_clean()
    errors = refused.value.message_dict
    assert errors["provider"][0].startswith("its provider “no.such.Provider” cannot be used")
    assert errors["tools"] == ["its tools “delete_everything” are not among the site's registered tools."]
    assert errors["credential"] == ["its credential “missing” is not in the site's CREDENTIALS setting."]
    assert errors["system_prompt"] == ["its system prompt has 51 characters; at most 50 (half of HISTORY_MAX_CHARS) "
                                       "are allowed."]
    # The clocks: the same rule and sentence as the system check (conversations.E001) for the site's settings.
    assert errors["job_timeout"] == ["DEADLINE_MARGIN (4s) must be smaller than JOB_TIMEOUT (3s)."]

    demo = Assistant(slug="demo", name="Demo", system_prompt="Hi", provider="demo", model="gpt-4o",
                     credential="unset", suggestions=["a", "b", "c", "d", "e"], call_timeout=20)
    errors = pytest.raises(ValidationError, demo.full_clean).value.message_dict
    assert errors["model"] == ["the demo provider has no model “gpt-4o”: leave the model empty."]
    assert errors["credential"] == ["the environment variable TEST_NO_SUCH_VARIABLE of its credential “unset” is "
                                    "not set."]
    assert errors["suggestions"] == ["at most 4 suggested questions, each of 1 to 200 characters."]
    assert "call_timeout" not in errors  # longer than the site's (5 s) is allowed: it still fits in the job

    Assistant(slug="good", name="Good", system_prompt="x" * 50, provider="openai", model="gpt-4o-mini",
              credential="ok", tools=["search_faq"], max_steps=2, call_timeout=3).full_clean()


@pytest.mark.django_db
def test_saving_refuses_a_chain_of_fallbacks_that_cannot_work(conversations_settings):
    conversations_settings.update(CREDENTIALS={"ok": {"KEY": "sk-x", "ORIGINS": ["https://api.openai.com",
                                                                               "http://127.0.0.1:*"]}},
                                  MIN_CALL_BUDGET=1, FALLBACK_RESERVE=0.5, ALLOWED_PROVIDERS=["no.such.Provider"])

    def refused(fallbacks):
        assistant = Assistant(slug="a", name="A", system_prompt="Hi", provider="demo", fallbacks=fallbacks)
        return pytest.raises(ValidationError, assistant.full_clean).value.message_dict["fallbacks"]

    assert refused({"provider": "openai"}) == refused(["openai"]) == [
        'its fallbacks must be a list of providers, each {"provider": …, "model": …, "base_url": …, "credential": …}.']
    errors = refused([{"provider": "no.such.Provider", "api_key": "sk-typed-here"},
                      {"provider": "demo", "model": "gpt-4o", "base_url": "not a url", "credential": "missing"},
                      {"model": "m"}, {"provider": "openai", "model": 4}, {"provider": "openai", "credential": "ok"}])
    assert errors[0] == ("its fallback 1 has unknown keys: api_key (an entry takes provider, model, base_url and "
                         "credential; never an API key).")
    assert errors[1].startswith("its fallback 1 names a provider “no.such.Provider” that cannot be used (")
    assert errors[2:] == [
        "in its fallback 2, the demo provider has no model “gpt-4o”: leave the model empty.",
        "its fallback 2 has an endpoint that is not a URL: “not a url”.",
        "in its fallback 2, its credential “missing” is not in the site's CREDENTIALS setting.",
        "its fallback 3 names no provider.",
        "its fallback 4 must give its provider, model, base_url and credential as text.",
        # Its own chain keeps FALLBACK_RESERVE for the next provider, as the site's does (conversations.E014).
        "FALLBACK_RESERVE (0.5s) is smaller than MIN_CALL_BUDGET (1s): a provider that hangs would leave the next "
        "too little time to start."]

    conversations_settings.update(FALLBACK_RESERVE=1)
    for fallbacks in (None, [], [{"provider": "openai", "model": "gpt-4o-mini", "base_url": "http://127.0.0.1:8080/v1",
                                  "credential": "ok"}, {"provider": "demo"}]):
        Assistant(slug="a", name="A", system_prompt="Hi", provider="demo", fallbacks=fallbacks).full_clean()


@pytest.mark.django_db
def test_an_assistant_whose_primary_could_never_be_called_before_its_fallback_is_refused(conversations_settings):
    conversations_settings.update(JOB_TIMEOUT=60, DEADLINE_MARGIN=20, FALLBACK_RESERVE=15, MIN_CALL_BUDGET=5,
                                  CALL_TIMEOUT=30, STATE_TTL=600)
    sentence = ("JOB_TIMEOUT - DEADLINE_MARGIN - FALLBACK_RESERVE (5s) is not more than MIN_CALL_BUDGET (5s): the "
                "primary provider could never be called, and every turn would go to its fallback.")

    def refused(**fields):
        assistant = Assistant(slug="a", name="A", system_prompt="Hi", provider="demo", **fields)
        return pytest.raises(ValidationError, assistant.full_clean).value.message_dict

    # Its own job timeout under the site's chain, and its own chain under its own job timeout.
    conversations_settings.update(FALLBACKS=[{"PROVIDER": "demo"}])
    assert refused(job_timeout=40) == {"job_timeout": [sentence]}
    conversations_settings.update(FALLBACKS=[])
    assert refused(job_timeout=40, fallbacks=[{"provider": "demo"}]) == {"job_timeout": [sentence]}
    assert refused(fallbacks=[{"provider": "demo"}], call_timeout=30, job_timeout=40) == {"job_timeout": [sentence]}
    Assistant(slug="a", name="A", system_prompt="Hi", provider="demo", job_timeout=41,
              fallbacks=[{"provider": "demo"}]).full_clean()
    Assistant(slug="b", name="B", system_prompt="Hi", provider="demo", job_timeout=40).full_clean()  # no chain


NOT_SET_UP = "The assistant “Support” is not set up correctly, so it cannot answer right now."


def reasons_recorded(turn_id):
    """What the admin's timeline of the turn says (its call records' details)."""
    return list(Turn.objects.get(pk=turn_id).calls.values_list("detail", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_chain_whose_key_is_unset_on_the_worker_ends_the_turn_failed_with_one_sentence(
        worker, conversations_settings, monkeypatch):
    monkeypatch.setenv("TEST_BACKUP_KEY", "sk-backup")
    conversations_settings.update(CREDENTIALS={"backup-key": "env:TEST_BACKUP_KEY"})
    make_assistant("support", name="Support", fallbacks=[{"provider": "demo", "credential": "backup-key"}])
    client = make_client()
    turn = start(client, "support", "Hello")
    monkeypatch.delenv("TEST_BACKUP_KEY")  # as on a worker started without it
    worker()
    final = poll_until_done(client, turn["poll_url"])
    # The visitor learns neither the credential's name nor the variable's; the admin does.
    assert (final["status"], final["error"]) == ("failed", NOT_SET_UP)
    assert reasons_recorded(turn["id"]) == [
        "not set up: in its fallback 1, the environment variable TEST_BACKUP_KEY of its credential “backup-key” is "
        "not set."]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("breaks, reason", [
    ("a tool", "its tools “current_time” are not among the site's registered tools."),
    ("the provider", "its provider “chatproject.no_such.Provider” cannot be used (No module named "
                     "'chatproject.no_such')."),
    ("the credential", "its credential “gone-key” is not in the site's CREDENTIALS setting."),
])
def test_an_assistant_broken_after_it_was_saved_tells_the_visitor_one_sentence_and_the_admin_why(
        worker, conversations_settings, breaks, reason):
    support = make_assistant("support", name="Support", tools=["search_faq", "current_time"])
    client = make_client()
    turn = start(client, "support", "Hello")
    # Between the message and the job, the site drops a tool; or the assistant's provider or key breaks.
    if breaks == "a tool":
        conversations_settings.update(TOOLS=["chatproject.tools.search_faq"])
    elif breaks == "the provider":
        conversations_settings.update(ALLOWED_PROVIDERS=["chatproject.no_such.Provider"])
        Assistant.objects.filter(pk=support.pk).update(provider="chatproject.no_such.Provider")
    else:
        Assistant.objects.filter(pk=support.pk).update(credential="gone-key")
    worker()
    final = poll_until_done(client, turn["poll_url"])

    assert (final["status"], final["error"]) == ("failed", NOT_SET_UP)
    assert reasons_recorded(turn["id"]) == [f"not set up: {reason}"]
    assert Turn.objects.get(pk=turn["id"]).assistant_version is None


@pytest.mark.django_db(transaction=True)
def test_a_model_the_service_rejects_ends_the_turn_failed_with_one_sentence(worker, conversations_settings):
    with FakeProvider() as api:
        api.add(Reply(404, {"error": {"message": "The model `gpt-nope` does not exist", "type": "invalid_request_error",
                                      "code": "model_not_found"}}))
        conversations_settings.update(PROVIDER="openai", BASE_URL=api.url)  # the site's endpoint, from settings
        make_assistant("support", name="Support", provider="openai", model="gpt-nope")
        client = make_client()
        turn = start(client, "support", "Hello")
        worker()
        final = poll_until_done(client, turn["poll_url"])

    assert (final["status"], final["error"]) == ("failed", NOT_SET_UP)
    # The admin's turn page shows the model and the status the service answered.
    called = Turn.objects.get(pk=turn["id"])
    assert called.model == "gpt-nope" and list(called.calls.values_list("status_code", flat=True)) == [404]


@pytest.mark.django_db(transaction=True)
def test_a_switched_off_assistant_answers_no_more_in_its_conversations(worker):
    support = make_assistant("support", name="Support")
    client = make_client()
    turn = start(client, "support", "Hello")
    Assistant.objects.filter(pk=support.pk).update(active=False)
    worker()
    final = poll_until_done(client, turn["poll_url"])
    assert final["status"] == "failed"
    assert final["error"] == "The assistant “Support” is no longer available. Please start a new conversation."


def test_the_fingerprint_covers_the_configuration_not_the_greeting():
    def fingerprint(**fields):
        assistant = Assistant(**{"slug": "a", "name": "A", "system_prompt": "p", "provider": "demo", **fields})
        return assistants.fingerprint(assistants.snapshot(assistant, assistants.settings_for(assistant)))

    assert fingerprint(greeting="Hi") == fingerprint(greeting="Hello") == fingerprint(name="Renamed")
    assert len({fingerprint(), fingerprint(system_prompt="p2"), fingerprint(model="demo"),
                fingerprint(tools=["search_faq"]), fingerprint(max_steps=2), fingerprint(credential="k"),
                fingerprint(fallbacks=[{"provider": "demo"}]),
                fingerprint(fallbacks=[{"provider": "demo", "credential": "k"}])}) == 8
    # No chain, whether inherited from a site without one or set empty: the snapshot (and so the fingerprint)
    # of before chains existed.
    assert fingerprint(fallbacks=[]) == fingerprint(fallbacks=None) == fingerprint()
    plain = Assistant(slug="a", name="A", system_prompt="p", provider="demo", fallbacks=[])
    assert set(assistants.snapshot(plain, assistants.settings_for(plain))) == {
        "system_prompt", "provider", "model", "base_url", "credential", "tools", "limits"}


@pytest.mark.django_db
def test_the_public_schema_names_no_assistant():
    """The schema listed every active slug, a staff-only assistant's too, even with LOGIN_REQUIRED."""
    from drf_spectacular.validation import validate_schema

    make_assistant("support")
    make_assistant("internal-payroll", access="staff")
    response = make_client().get("/api/schema/?format=json")
    schema = response.json()
    validate_schema(schema)
    assert "internal-payroll" not in response.content.decode() and "support" not in response.content.decode()
    body = schema["components"]["schemas"]["ConversationCreate"]["properties"]["assistant"]
    assert "enum" not in json.dumps(body) and "^[-a-zA-Z0-9_]+$" in json.dumps(body)  # any slug, none named
    # "" and null: the site's default.
    assert api_post(make_client(), "/api/conversations/", {"assistant": ""}).json()["assistant"] is None


@pytest.mark.django_db(transaction=True)
def test_the_sentences_naming_an_assistant_are_translated(worker, settings):
    make_assistant("soporte", name="Soporte", tools=["no_such_tool"])
    client = make_client()
    refused = api_post(client, "/api/conversations/", {"assistant": "nadie"}, HTTP_ACCEPT_LANGUAGE="es")
    assert refused.json() == {"assistant": ["No hay ningún asistente «nadie» en este sitio."]}

    settings.LANGUAGE_CODE = "es"  # the job writes its sentences in the site's language, as for every turn error
    turn = start(client, "soporte", "Hola")
    worker()
    final = poll_until_done(client, turn["poll_url"])
    assert final["error"] == "El asistente «Soporte» no está bien configurado, así que no puede responder ahora."


@pytest.mark.django_db
def test_the_access_sentences_are_translated():
    from django.utils import translation

    make_assistant("socios", access="signed_in")
    make_assistant("interno", access="staff")
    client = make_client()
    answers = [api_post(client, "/api/conversations/", {"assistant": slug}, HTTP_ACCEPT_LANGUAGE="es").json()
               for slug in ("socios", "interno")]
    assert answers == [{"detail": "Inicia sesión para hablar con este asistente."},
                       {"detail": "Este asistente no está disponible para ti."}]
    with translation.override("es"):
        assert render_for('{% chat_widget assistant="interno" %}') == (
            '<p class="conversations-refused">Este asistente no está disponible para ti.</p>\n')
        assert str(assistants.NoAccess(Assistant(name="Interno")).message) == (
            "El asistente «Interno» ya no está disponible para ti.")


@pytest.mark.django_db
def test_the_sentences_about_a_chain_are_translated(conversations_settings):
    from django.utils import translation

    conversations_settings.update(FALLBACK_RESERVE=2)  # the suite's 10 s job leaves its primary room

    soporte = Assistant(slug="soporte", name="Soporte", system_prompt="Hola", provider="demo",
                        fallbacks=[{"provider": "openai", "credential": "nadie"}, {"provider": "demo", "clave": "x"}])
    with translation.override("es"):
        errors = pytest.raises(ValidationError, soporte.full_clean).value.message_dict["fallbacks"]
        label = str(Assistant._meta.get_field("fallbacks").verbose_name)
    assert errors == [
        "en su proveedor de reserva 1, su credencial «nadie» no está en el ajuste CREDENTIALS del sitio.",
        "su proveedor de reserva 2 tiene claves desconocidas: clave (una entrada admite provider, model, base_url y "
        "credential; nunca una clave de API)."]
    assert label == "proveedores de reserva"


# -- checks ------------------------------------------------------------------------------------


def test_credentials_and_prices_are_checked_at_start_up(conversations_settings):
    from django.core.checks import Error, Warning

    from conversations.checks import check_config

    conversations_settings.update(
        CREDENTIALS={"ok": "sk-1", "number": 5, "unset": "env:TEST_NO_SUCH_VARIABLE"},
        PRICES={"fine": {"input": "0.15", "output": 0.6}, "words": {"input": "cheap", "output": "1"},
                "half": {"input": "1"}, "negative": {"input": "-1", "output": "1"}})
    found = {(m.id, m.msg) for m in check_config()}
    assert {m for m in found if m[0].startswith("conversations.E04") or m[0] == "conversations.W040"} == {
        ("conversations.E040", "CREDENTIALS['number'] must be an API key or \"env:VARIABLE\" (a non-empty string), "
                               "or {\"KEY\": …, \"ORIGINS\": […]}."),
        ("conversations.W040", "CREDENTIALS['unset'] reads the environment variable TEST_NO_SUCH_VARIABLE, which is "
                               "not set in this process."),
        ("conversations.E041", "PRICES['words'] has an input price that is not a decimal number: 'cheap'."),
        ("conversations.E041", "PRICES['half'] must be {\"input\": …, \"output\": …}, with nothing else."),
        ("conversations.E041", "PRICES['negative'] has an input price that is not a number of at least 0: '-1'."),
    }
    assert all(isinstance(m, Error if m.id.startswith("conversations.E") else Warning) for m in check_config())


def test_settings_from_the_environment_may_hold_credentials_and_prices_as_json(settings):
    from conversations.conf import get_config

    settings.CONVERSATIONS = {"PRICES": '{"m": {"input": "0.5", "output": "1.5"}}', "CREDENTIALS": '{"k": "env:K"}'}
    assert get_config()["PRICES"]["m"]["output"] == "1.5" and dict(get_config()["CREDENTIALS"]) == {"k": "env:K"}
    with pytest.raises(TypeError):  # read-only, like the rest of the configuration
        get_config()["PRICES"]["m"]["input"] = "0"


@pytest.mark.django_db
def test_assistants_that_cannot_work_are_listed_by_the_database_check():
    from conversations.checks import check_assistants

    make_assistant("support", tools=["gone"])
    make_assistant("off", tools=["gone"], active=False)
    assert check_assistants() == []  # runserver's checks: no database named, none touched
    (warning,) = check_assistants(databases=["default"])
    assert warning.id == "conversations.W041"
    assert warning.msg == ("The assistant 'support' is not set up correctly: its tools “gone” are not among the "
                           "site's registered tools.")


@pytest.mark.django_db
def test_the_tag_passes_the_servers_give_up_margin_comment_length_and_csrf_cookie(settings, monkeypatch):
    from conversations.templatetags import conversations as tag

    # The server's own values, whatever they are, not a copy in the script.
    monkeypatch.setattr(tag, "WIDGET_GIVE_UP_MARGIN", 45)
    settings.CSRF_COOKIE_NAME = "site_csrf"
    html = render("{% chat_widget %}")
    assert 'data-give-up-margin="45"' in html
    assert 'data-comment-max-length="%d"' % Turn._meta.get_field("rating_comment").max_length in html
    assert 'data-csrf-cookie="site_csrf"' in html


def test_a_user_model_without_staff_flag_or_permissions_is_refused_staff_and_permission_assistants():
    from types import SimpleNamespace

    # What a site's own AbstractBaseUser subclass looks like: signed in, active, nothing more.
    user = SimpleNamespace(is_authenticated=True, is_active=True)
    assert Assistant(slug="a", access="signed_in").allows(user)
    assert not Assistant(slug="b", access="staff").allows(user)
    assert not Assistant(slug="c", access="permission", access_permission="conversations.view_turn").allows(user)
