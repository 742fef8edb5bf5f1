"""Endpoints set in the admin go only where the site allows: not to loopback, private,
link-local or metadata addresses (checked on the address actually connected to, so a name
cannot be re-pointed after the form accepted it), and whatever an endpoint answers, the
visitor reads one sentence. The provider field imports nothing the site did not list."""

import html
import json
import sys

import pytest

from conversations.models import Assistant, CallRecord, Turn
from tests.support.fakes import FakeProvider, Reply, hang, openai_text, refused_url, unavailable
from tests.support.helpers import api_post, make_client, poll_until_done

ADD = "/admin/conversations/assistant/add/"
FIELDS = {"name": "Support", "slug": "support", "active": "on", "system_prompt": "Be kind.", "provider": "openai",
          "model": "m", "base_url": "", "credential": "", "greeting": "", "suggestions": "", "fallbacks": "",
          "access": "public", "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}


@pytest.fixture
def nothing_listed(conversations_settings):
    """The defaults: the vendors' public origins and the site's own endpoint only."""
    conversations_settings.update(ALLOWED_ENDPOINTS=[], PROVIDER="openai", BASE_URL="https://gw.example.com/v1")
    return conversations_settings


def refusal(response):
    """The form's page again, with its errors (nothing saved)."""
    assert response.status_code == 200, response.status_code
    return html.unescape(response.content.decode())


@pytest.mark.django_db
@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8080/v1", "http://localhost:11434/v1", "http://169.254.169.254/latest/meta-data",
    "http://10.0.0.5/v1", "http://[::1]:8080/v1", "http://[::ffff:127.0.0.1]/v1", "http://[fd00:ec2::254]/",
    "https://attacker.example.net/v1",
])
def test_the_admin_refuses_an_endpoint_the_site_does_not_allow(admin_client, nothing_listed, url):
    page = refusal(admin_client.post(ADD, {**FIELDS, "base_url": url}))
    assert "is not one this site allows" in page or "private, loopback or link-local address" in page
    chain = json.dumps([{"provider": "openai", "base_url": url}])
    page = refusal(admin_client.post(ADD, {**FIELDS, "fallbacks": chain}))
    assert "in its fallback 1, its endpoint" in page and not Assistant.objects.exists()


@pytest.mark.django_db
def test_the_admin_accepts_the_vendors_the_sites_own_and_listed_endpoints(admin_client, nothing_listed):
    nothing_listed.update(ALLOWED_ENDPOINTS=["https://*.openai.azure.com", "http://10.0.0.5:11434",
                                             "http://[fd00::5]:11434"])
    for number, url in enumerate(["https://api.openai.com/v1", "https://gw.example.com/v1/",
                                  "https://mine.openai.azure.com/openai/deployments/d?api-version=2024-10-21",
                                  "http://10.0.0.5:11434/v1", "http://[fd00::5]:11434/v1"]):
        saved = admin_client.post(ADD, {**FIELDS, "slug": f"s{number}", "base_url": url})
        assert saved.status_code == 302, saved.context["adminform"].form.errors
    # A private address needs its host written out: a wildcard entry covers public addresses only.
    nothing_listed.update(ALLOWED_ENDPOINTS=["http://10.0.0.*:11434"])
    page = refusal(admin_client.post(ADD, {**FIELDS, "slug": "local", "base_url": "http://10.0.0.6:11434/v1"}))
    assert "private, loopback or link-local address" in page and not Assistant.objects.filter(slug="local").exists()


def ask(client, slug):
    conversation = api_post(client, "/api/conversations/", {"assistant": slug}).json()["id"]
    return api_post(client, f"/api/conversations/{conversation}/turns/", {"content": "Hello?"}).json()


@pytest.mark.django_db(transaction=True)
def test_a_name_that_resolves_to_loopback_is_never_connected_to_unless_written_out(conversations_settings, worker):
    """The form accepts a name (its addresses can change after it is saved: DNS rebinding); the
    worker resolves it once, checks the address and connects to that address only."""
    with FakeProvider(default=openai_text("Hello from inside.")) as inside:
        conversations_settings.update(ALLOWED_ENDPOINTS=["http://local*:*"], TOOLS=[], STREAM=False)
        url = f"http://localhost:{inside.port}/v1"
        Assistant(slug="support", name="Support", system_prompt="Hi.", provider="openai", base_url=url).full_clean()
        Assistant.objects.create(slug="support", name="Support", system_prompt="Hi.", provider="openai", base_url=url)
        client = make_client()
        turn = ask(client, "support")
        worker()
        final = poll_until_done(client, turn["poll_url"])
        assert inside.requests == []
        assert (final["status"], final["error"]) == ("failed", "The assistant “Support” could not answer. Please "
                                                               "try again later.")
        (detail,) = CallRecord.objects.filter(turn_id=turn["id"]).values_list("detail", flat=True)
        assert "localhost resolves to" in detail and "127.0.0.1" in detail

        # Written out, the operator's local model is reached.
        conversations_settings.update(ALLOWED_ENDPOINTS=[f"http://localhost:{inside.port}"])
        turn = ask(client, "support")
        worker()
        final = poll_until_done(client, turn["poll_url"])
    assert final["status"] == "completed" and len(inside.requests) == 1


@pytest.mark.django_db(transaction=True)
def test_whatever_an_endpoint_of_the_admins_answers_the_visitor_reads_one_sentence(conversations_settings, worker):
    """401, 404, 503, a refused connection and a time-out would otherwise tell a port scanner apart."""
    conversations_settings.update(TOOLS=[], STREAM=False, MAX_ATTEMPTS=1, CALL_TIMEOUT=2)
    with FakeProvider() as endpoint:
        endpoint.add(Reply(401, {"error": {"message": "no", "code": "invalid_api_key"}}),
                     Reply(404, {"error": {"message": "no such model", "code": "model_not_found"}}),
                     unavailable(503), hang)
        urls = [endpoint.url] * 4 + [refused_url()]
        client = make_client()
        turns = []
        for number, url in enumerate(urls):
            Assistant.objects.create(slug=f"a{number}", name="Support", system_prompt="Hi.", provider="openai",
                                     base_url=url)
            turns.append(ask(client, f"a{number}"))
            worker()
        finals = [poll_until_done(client, turn["poll_url"]) for turn in turns]
    assert {(f["status"], f["error"]) for f in finals} == {
        ("failed", "The assistant “Support” could not answer. Please try again later.")}
    # The admin's timeline still tells them apart.
    assert [c.status_code for c in CallRecord.objects.order_by("turn__enqueued_at", "id")][:3] == [401, 404, 503]
    assert Turn.objects.filter(status="failed").count() == 5


@pytest.mark.django_db
def test_the_provider_field_imports_nothing_the_site_did_not_list(admin_client, conversations_settings):
    probe = "xml.dom.pulldom"  # a module nothing here has imported
    sys.modules.pop(probe, None)
    page = refusal(admin_client.post(ADD, {**FIELDS, "provider": f"{probe}.PullDOM"}))
    assert f"its provider “{probe}.PullDOM” is not one this site allows" in page
    assert probe not in sys.modules

    conversations_settings.update(ALLOWED_PROVIDERS=["conversations.providers.openai.OpenAIProvider"])
    saved = admin_client.post(ADD, {**FIELDS, "provider": "conversations.providers.openai.OpenAIProvider"})
    assert saved.status_code == 302


def test_an_allowed_endpoint_that_is_not_an_origin_stops_the_checks(conversations_settings):
    from conversations.checks import check_config

    conversations_settings.update(ALLOWED_ENDPOINTS=["https://gw.example.com/v1", "gw.example.com",
                                                     "https://*.openai.azure.com", "http://10.0.0.5:11434"])
    assert [(m.id, m.msg) for m in check_config() if m.id == "conversations.E042"] == [
        ("conversations.E042", "ALLOWED_ENDPOINTS entry 'https://gw.example.com/v1' is not an origin."),
        ("conversations.E042", "ALLOWED_ENDPOINTS entry 'gw.example.com' is not an origin.")]


def documented_setups():
    """The ``CONVERSATIONS`` of docs/providers.md's "Where keys and calls may go" example."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "providers.md").read_text()
    section = text.split("## Where keys and calls may go", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {}
    exec(compile("import os\n" + block, "docs/providers.md", "exec"), namespace)
    return namespace["CONVERSATIONS"]


@pytest.mark.django_db
def test_the_documented_gateway_azure_and_local_model_setups_pass_check_and_save(admin_client, monkeypatch,
                                                                                  conversations_settings):
    from conversations.checks import check_config

    for variable in ("GATEWAY_KEY", "SUPPORT_GATEWAY_KEY", "AZURE_OPENAI_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.setenv(variable, f"key-of-{variable.lower()}")
    conversations_settings.update(documented_setups())
    assert check_config() == []
    # Each assistant the example's comments describe, saved through the admin as written there.
    for slug, provider, url, credential in [
        ("gateway", "openai", "https://gw.example.com/v1", "support-gateway"),
        ("azure", "openai", "https://mine.openai.azure.com/openai/deployments/gpt-4o?api-version=2024-10-21", "azure"),
        ("claude", "anthropic", "", "anthropic"),
        ("local", "openai", "http://10.0.0.5:11434/v1", ""),
    ]:
        saved = admin_client.post(ADD, {**FIELDS, "slug": slug, "provider": provider, "base_url": url,
                                        "credential": credential})
        assert saved.status_code == 302, (slug, saved.context["adminform"].form.errors)
    assert Assistant.objects.count() == 4


@pytest.mark.django_db
def test_a_provider_not_listed_is_not_imported_when_a_credential_is_chosen_for_it(admin_client, conversations_settings):
    """Binding a credential asks where the provider calls by default: the answer for a provider the
    site did not list is "nowhere", without importing it, for an assistant's own and its fallbacks'."""
    conversations_settings.update(CREDENTIALS={"vendor-key": "sk-vendor-key-0003"})
    probe = "tabnanny"  # a module nothing here has imported
    sys.modules.pop(probe, None)
    chain = json.dumps([{"provider": f"{probe}.NannyNag", "credential": "vendor-key"}])
    for changes in [{"provider": f"{probe}.NannyNag", "credential": "vendor-key"}, {"fallbacks": chain}]:
        page = refusal(admin_client.post(ADD, {**FIELDS, **changes}))
        assert f"provider “{probe}.NannyNag” is not one this site allows" in page
        assert probe not in sys.modules
    assert not Assistant.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("url", [
    "http://[64:ff9b::7f00:1]/v1", "http://[64:ff9b::a9fe:a9fe]/latest", "http://[64:ff9b:1::a00:5]/v1",
    "http://[2002:7f00:1::]/v1", "http://[2002:a9fe:a9fe::]/", "http://[::127.0.0.1]/v1", "http://[::a00:5]/v1",
    "http://[fec0::1]/v1", "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/v1",
])
def test_an_ipv6_address_carrying_a_private_ipv4_one_is_not_public(admin_client, nothing_listed, url):
    """NAT64, 6to4, IPv4-compatible and Teredo addresses reach the IPv4 address they carry; the
    deprecated site-local fec0::/10 is private. None is public under a wildcard entry."""
    nothing_listed.update(ALLOWED_ENDPOINTS=["http://*"])
    page = refusal(admin_client.post(ADD, {**FIELDS, "base_url": url}))
    assert "private, loopback or link-local address" in page and not Assistant.objects.exists()


@pytest.mark.django_db
def test_an_ipv6_address_carrying_a_public_ipv4_one_is_public(admin_client, nothing_listed):
    nothing_listed.update(ALLOWED_ENDPOINTS=["http://*"])
    for number, url in enumerate(["http://[64:ff9b::808:808]/v1", "http://[2002:808:808::]/v1"]):
        saved = admin_client.post(ADD, {**FIELDS, "slug": f"s{number}", "base_url": url})
        assert saved.status_code == 302, saved.context["adminform"].form.errors
