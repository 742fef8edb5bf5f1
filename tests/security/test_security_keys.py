"""Only the site's operator decides where its keys go: a staff user who may change assistants
cannot send a credential, or the site's key, to a server of their own, whatever they type in
the admin and whatever ends up in the database; the worker checks each request's origin
against the key's binding right before sending."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from conversations.core.budget import Budget
from conversations.endpoints import BoundKey, origin
from conversations.infra.http import BudgetedHTTP, CallFailed
from conversations.models import Assistant, Turn
from tests.support.fakes import FakeProvider, openai_text
from tests.support.helpers import api_post, make_client, poll_until_done

pytestmark = pytest.mark.django_db(transaction=True)

SITE_KEY = "sk-site-key-0001"
KEYS = {"gateway-key": "sk-gateway-key-0002", "vendor-key": "sk-vendor-key-0003"}
CHANGE = "/admin/conversations/assistant/{}/change/"


@pytest.fixture
def site(conversations_settings):
    """The site's own endpoint (a fake on 127.0.0.1) and a hostile one on another port. The
    gateway credential is bound to the site's endpoint; the vendor one is a bare string (its
    provider's default origin only). Endpoints on 127.0.0.1 are allowed, so that only the
    binding of keys stands between the hostile server and the keys."""
    with FakeProvider(default=openai_text("From the site's endpoint.")) as own, \
            FakeProvider(default=openai_text("Give me your keys.")) as hostile:
        conversations_settings.update(
            PROVIDER="openai", BASE_URL=own.url, API_KEY=SITE_KEY, MODEL="m", TOOLS=[], STREAM=False,
            CREDENTIALS={"gateway-key": {"KEY": KEYS["gateway-key"], "ORIGINS": [origin(own.url)]},
                         "vendor-key": KEYS["vendor-key"]},
            ALLOWED_ENDPOINTS=["http://127.0.0.1:*"])
        yield own, hostile


def staff_with(*codenames):
    name = "staff-" + "-".join(codenames)
    user = get_user_model().objects.create_user(name, password="pw-123456789", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="conversations",
                                                        codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def form_fields(assistant, **changes):
    return {"name": assistant.name, "slug": assistant.slug, "active": "on", "system_prompt": assistant.system_prompt,
            "provider": assistant.provider, "model": assistant.model, "base_url": assistant.base_url,
            "credential": assistant.credential, "greeting": "", "suggestions": "", "fallbacks": "",
            "access": assistant.access, "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0", **changes}


def keys_seen(fake):
    """Every key-carrying header the fake received."""
    return [value for request in fake.requests for name, value in request["headers"].items()
            if name.lower() in ("authorization", "api-key", "x-api-key")]


def ask(client, slug):
    conversation = api_post(client, "/api/conversations/", {"assistant": slug}).json()["id"]
    return api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "My order number is 1234."}).json()


def test_change_assistant_alone_cannot_point_an_assistant_or_its_fallbacks_elsewhere(site):
    own, hostile = site
    support = Assistant.objects.create(slug="support", name="Support", system_prompt="Hi.", provider="openai")
    staff = staff_with("change_assistant", "view_assistant")

    page = staff.get(CHANGE.format(support.pk)).content.decode()
    assert 'name="base_url"' not in page and 'name="credential"' not in page and 'name="fallbacks"' not in page
    for credential in ["", *KEYS]:
        chain = json.dumps([{"provider": "openai", "base_url": hostile.url, "credential": credential}])
        saved = staff.post(CHANGE.format(support.pk), form_fields(
            support, base_url=hostile.url, credential=credential, provider="chatproject.evil.Provider",
            fallbacks=chain, system_prompt="Be brief."))
        assert saved.status_code == 302
        support.refresh_from_db()
        assert (support.system_prompt, support.provider, support.base_url, support.credential,
                support.fallbacks) == ("Be brief.", "openai", "", "", None)

    # Holding the dedicated permission, the same form changes them.
    root = staff_with("change_assistant", "view_assistant", "configure_provider")
    assert root.post(CHANGE.format(support.pk), form_fields(support, credential="gateway-key")).status_code == 302
    support.refresh_from_db()
    assert support.credential == "gateway-key"


@pytest.mark.parametrize("credential", ["", *KEYS])
def test_an_endpoint_of_the_assistants_own_never_receives_a_key_it_is_not_bound_to(site, worker, credential):
    """As if the admin had let it through (or the row was written some other way): the job
    refuses to run with a credential not bound to the endpoint, and the site's key stays at the
    site's endpoint."""
    own, hostile = site
    Assistant.objects.create(slug="support", name="Support", system_prompt="Hi.", provider="openai",
                             base_url=hostile.url, credential=credential)
    Assistant.objects.create(slug="chain", name="Chain", system_prompt="Hi.", provider="openai",
                             base_url="http://127.0.0.1:9/v1",  # refused: the fallback is asked next
                             fallbacks=[{"provider": "openai", "base_url": hostile.url, "credential": credential}])
    client = make_client()
    turns = [ask(client, "support"), ask(client, "chain")]
    worker()
    finals = [poll_until_done(client, turn["poll_url"]) for turn in turns]

    assert keys_seen(hostile) == []
    assert not any(key in json.dumps(finals) for key in [SITE_KEY, *KEYS.values()])
    assert own.requests == []


def test_an_assistant_without_an_endpoint_uses_the_sites_endpoint_with_the_sites_key(site, worker):
    own, hostile = site
    Assistant.objects.create(slug="support", name="Support", system_prompt="Hi.", provider="openai")
    client = make_client()
    turn = ask(client, "support")
    worker()
    final = poll_until_done(client, turn["poll_url"])
    assert (final["status"], final["messages"][-1]["content"]) == ("completed", "From the site's endpoint.")
    assert keys_seen(own) == [f"Bearer {SITE_KEY}"] and hostile.requests == []


def test_a_credential_bound_to_the_endpoint_is_sent_there(site, worker):
    own, hostile = site
    Assistant.objects.create(slug="support", name="Support", system_prompt="Hi.", provider="openai",
                             base_url=own.url, credential="gateway-key")
    client = make_client()
    turn = ask(client, "support")
    worker()
    final = poll_until_done(client, turn["poll_url"])
    assert final["status"] == "completed" and keys_seen(own) == [f"Bearer {KEYS['gateway-key']}"]


def test_the_http_layer_never_sends_a_key_to_an_origin_it_is_not_bound_to(site):
    """The last check, right where the request is built, whoever built the configuration."""
    from conversations.conf import get_config

    own, hostile = site
    records = []
    key = BoundKey("sk-bound-elsewhere", [origin(own.url)])
    http = BudgetedHTTP(Budget(5), {**get_config(), "API_KEY": key}, recorder=lambda **f: records.append(f))
    with pytest.raises(CallFailed) as failed:
        http.post_json(hostile.url + "/chat/completions", {"messages": []}, {"Authorization": f"Bearer {key}"})
    assert failed.value.code == "key_not_bound" and hostile.requests == []
    assert records[0]["outcome"] == "error" and "not sent" in records[0]["detail"] and key not in records[0]["detail"]
    # Without the key in it, the same request goes (a local model needs none).
    http.post_json(hostile.url + "/chat/completions", {"messages": []}, {})
    assert len(hostile.requests) == 1
    assert Turn.objects.count() == 0


@pytest.fixture
def two_hosts(conversations_settings):
    """The site's gateway on 127.0.0.1, bound to the gateway credential and the site's key, and an
    attacker's server on 127.0.0.2 (another loopback address standing for another machine).
    Every endpoint on 127.0.0.1 is allowed: only the reading of the URL stands between them."""
    with FakeProvider(default=openai_text("From the site's gateway.")) as own, \
            FakeProvider(default=openai_text("Give me your keys."), host="127.0.0.2") as hostile:
        conversations_settings.update(
            PROVIDER="openai", BASE_URL=own.url, API_KEY=SITE_KEY, MODEL="m", TOOLS=[], STREAM=False,
            CREDENTIALS={"gateway-key": {"KEY": KEYS["gateway-key"], "ORIGINS": [origin(own.url)]}},
            ALLOWED_ENDPOINTS=["http://127.0.0.1:*"])
        yield own, hostile


def backslashed(hostile, own):
    """An endpoint ``urlsplit`` reads as ``own``'s host while urllib3 connects to ``hostile``'s."""
    return f"http://127.0.0.2:{hostile.port}\\@127.0.0.1:{own.port}/v1"


@pytest.mark.parametrize("credential", ["", "gateway-key"])
def test_an_endpoint_with_a_backslash_before_the_at_sign_is_refused_by_the_form_and_its_fallbacks(
        two_hosts, admin_client, credential):
    own, hostile = two_hosts
    url = backslashed(hostile, own)
    add = "/admin/conversations/assistant/add/"
    fields = {"name": "Support", "slug": "support", "active": "on", "system_prompt": "Hi.", "provider": "openai",
              "model": "m", "base_url": "", "credential": credential, "greeting": "", "suggestions": "",
              "fallbacks": "", "access": "public", "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}
    chain = json.dumps([{"provider": "openai", "base_url": url, "credential": credential}])
    for changes in [{"base_url": url}, {"fallbacks": chain}]:
        page = admin_client.post(add, {**fields, **changes})
        assert page.status_code == 200
        assert "is not a plain URL of the form scheme://host[:port]/path" in page.content.decode()
    assert not Assistant.objects.exists() and hostile.requests == []


@pytest.mark.parametrize("credential", ["", "gateway-key"])
def test_a_row_with_a_backslash_before_the_at_sign_never_sends_a_key_to_the_host_before_it(
        two_hosts, worker, credential):
    """Written without the form (a fixture, a data migration, an import): the worker refuses the
    endpoint, the visitor reads a sentence, and the attacker's server hears nothing."""
    own, hostile = two_hosts
    url = backslashed(hostile, own)
    Assistant.objects.create(slug="support", name="Support", system_prompt="Hi.", provider="openai",
                             base_url=url, credential=credential)
    Assistant.objects.create(slug="chain", name="Chain", system_prompt="Hi.", provider="openai",
                             base_url="http://127.0.0.1:9/v1",  # refused: the fallback is asked next
                             fallbacks=[{"provider": "openai", "base_url": url, "credential": credential}])
    client = make_client()
    turns = [ask(client, "support"), ask(client, "chain")]
    worker()
    finals = [poll_until_done(client, turn["poll_url"]) for turn in turns]

    assert hostile.requests == [] and own.requests == []
    assert [final["status"] for final in finals] == ["failed", "failed"]
    assert all(final["error"] for final in finals)
    assert not any(key in json.dumps(finals) for key in [SITE_KEY, *KEYS.values()])


def test_the_http_layer_refuses_a_key_for_a_url_it_does_not_read_as_plain(two_hosts):
    """The last check, whoever built the URL: a key bound to the gateway never goes to a URL whose
    host two parsers could read differently."""
    from conversations.conf import get_config

    own, hostile = two_hosts
    key = BoundKey("sk-bound-to-the-gateway", [origin(own.url)])
    http = BudgetedHTTP(Budget(5), {**get_config(), "API_KEY": key}, recorder=lambda **f: None)
    with pytest.raises(CallFailed) as failed:
        http.post_json(backslashed(hostile, own) + "/chat/completions", {"messages": []},
                       {"Authorization": f"Bearer {key}"})
    assert failed.value.code == "key_not_bound" and hostile.requests == [] and own.requests == []


def test_a_key_is_not_sent_to_an_origin_that_only_begins_with_the_one_it_is_bound_to(site):
    """A binding is matched whole: ``http://127.0.0.1`` (port 80) is not ``http://127.0.0.1:PORT``,
    as ``https://gw.example.com`` is not ``https://gw.example.com.attacker.net``."""
    from conversations.conf import get_config

    own, hostile = site
    key = BoundKey("sk-bound-to-port-80", ["http://127.0.0.1"])
    http = BudgetedHTTP(Budget(5), {**get_config(), "API_KEY": key}, recorder=lambda **f: None)
    with pytest.raises(CallFailed) as failed:
        http.post_json(hostile.url + "/chat/completions", {"messages": []}, {"Authorization": f"Bearer {key}"})
    assert failed.value.code == "key_not_bound" and hostile.requests == []
