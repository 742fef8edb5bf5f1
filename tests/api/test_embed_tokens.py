"""A widget embedded on a page of another site: it gets a visitor token for its page's origin and
sends it instead of cookies; the app answers CORS for the allowed origins only; a host site
vouches for its signed-in user with a signed identity. Every refusal is a 401 (or 403) with a
sentence, and creates nothing."""

import base64
import hashlib
import hmac
import json
import re
import secrets
import subprocess
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.exceptions import AuthenticationFailed

from conversations import assistants, visitors
from conversations.api import authentication
from conversations.models import Assistant, Conversation, Turn

pytestmark = pytest.mark.django_db

PAGE = "https://shop.example.com"
OTHER = "https://elsewhere.example.net"
SECRET = "host-site-secret-" + "x" * 20


class Page:
    """A page of ``origin`` in a browser that sends no cookie to the API (a cookie-less client,
    every request with the ``Origin`` header a browser sends)."""

    def __init__(self, origin=PAGE, visitor=None):
        self.origin = origin
        self.visitor = visitor or secrets.token_urlsafe(24)
        self.client = Client(enforce_csrf_checks=True)
        self.token = None

    def headers(self, token, **extra):
        """A browser's headers from this page; ``token`` in ``Authorization`` unless None."""
        headers = {"HTTP_ORIGIN": self.origin, **extra}
        if token:
            headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
        return headers

    def mint(self, assistant="", identity=None, **body):
        data = {"assistant": assistant, "visitor": self.visitor, **body}
        if identity is not None:
            data["identity"] = identity
        response = self.client.post("/api/widget-token/", json.dumps(data), content_type="application/json",
                                    **self.headers(None))
        if response.status_code == 200:
            self.token = response.json()["token"]
        return response

    def post(self, url, data=None, token=None, **extra):
        self.client.cookies.clear()  # a browser blocking third-party cookies keeps none of the API's
        return self.client.post(url, json.dumps(data or {}), content_type="application/json",
                                **self.headers(token or self.token, **extra))

    def get(self, url, token=None, **extra):
        self.client.cookies.clear()
        return self.client.get(url, **self.headers(token or self.token, **extra))

    def renew(self):
        """What the widget does before its token expires: the token, sent to get a fresh one."""
        return self.client.post("/api/widget-token/", json.dumps({"visitor": self.visitor}),
                                content_type="application/json", **self.headers(self.token))


@pytest.fixture(autouse=True)
def _page_allowed(conversations_settings):
    conversations_settings.update(ALLOWED_ORIGINS=[PAGE], IDENTITY_SECRET=SECRET)


def started(page, assistant=None):
    """A conversation the page's visitor started, and a turn in it (queued)."""
    created = page.post("/api/conversations/", {"assistant": assistant} if assistant else {})
    assert created.status_code == 201, created.content
    turn = page.post(f"/api/conversations/{created.json()['id']}/turns/", {"content": "Where is my order?"})
    assert turn.status_code == 202, turn.content
    return turn.json()


@pytest.mark.django_db(transaction=True)
def test_a_page_of_an_allowed_origin_chats_with_a_token_and_no_cookie(worker):
    page = Page()
    minted = page.mint()
    assert minted.status_code == 200, minted.content
    body = minted.json()
    assert body["expires_in"] == 900 and body["widget"]["api_url"] == "http://testserver/api/conversations/"
    assert minted["Access-Control-Allow-Origin"] == PAGE

    turn = started(page)
    worker()
    poll_url = turn["poll_url"]
    first = page.get(poll_url)
    while not first.json()["done"]:
        time.sleep(0.05)
        first = page.get(poll_url)
    again = page.get(poll_url, HTTP_IF_NONE_MATCH=first["ETag"])
    rated = page.post(turn["rating_url"], {"value": "up"})
    detail = page.get(f"/api/conversations/{turn['conversation']}/")

    assert first.status_code == 200 and again.status_code == 304
    assert rated.status_code == 201 and detail.status_code == 200
    assert [m["role"] for m in detail.json()["messages"]][0] == "user"
    for response in (first, again, rated, detail):
        assert response["Access-Control-Allow-Origin"] == PAGE
        assert "Origin" in response["Vary"]
        assert response["Access-Control-Expose-Headers"] == "ETag, Retry-After"
        assert "Access-Control-Allow-Credentials" not in response
        assert not response.cookies  # no session, no csrftoken: nothing for a browser to block
    conversation = Conversation.objects.get()
    assert conversation.user is None and conversation.owner_token.startswith("v:")
    assert Turn.objects.get().rating == "up"


@pytest.mark.django_db(transaction=True)
def test_another_visitors_token_owns_nothing_and_a_renewed_token_keeps_the_conversation(conversations_settings):
    page, stranger = Page(), Page()
    page.mint()
    stranger.mint()
    turn = started(page)
    detail = f"/api/conversations/{turn['conversation']}/"

    renewed = page.renew()

    assert stranger.get(detail).status_code == 404
    assert stranger.get(turn["poll_url"]).status_code == 404
    assert renewed.status_code == 200
    assert page.get(detail, token=renewed.json()["token"]).status_code == 200
    # The same visitor id from a page of another allowed origin is someone else.
    elsewhere = Page(origin="https://other.example.com", visitor=page.visitor)
    conversations_settings.update(ALLOWED_ORIGINS=[PAGE, elsewhere.origin])
    assert elsewhere.mint().status_code == 200
    assert elsewhere.get(detail).status_code == 404


def test_a_token_used_from_a_page_of_another_origin_is_refused():
    page = Page()
    page.mint()
    thief = Page(origin=OTHER)

    response = thief.post("/api/conversations/", token=page.token)

    assert response.status_code == 401
    assert response.json() == {"detail": "This chat's access was given to another site. Please reload the page."}
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert not Conversation.objects.exists()


def test_a_token_for_another_assistant_is_refused():
    Assistant.objects.create(slug="sales", name="Sales", system_prompt="Sell.", allowed_origins=[PAGE])
    Assistant.objects.create(slug="support", name="Support", system_prompt="Help.", allowed_origins=[PAGE])
    page = Page()
    assert page.mint(assistant="sales").status_code == 200

    response = page.post("/api/conversations/", {"assistant": "support"})

    assert response.status_code == 401
    assert response.json() == {"detail": "This chat's access was given for another assistant. Please reload the "
                                         "page."}
    assert not Conversation.objects.exists()


@pytest.mark.parametrize("slug", ["no-such-assistant", "Support Bot", "sup\x00port"])
def test_a_page_naming_an_assistant_there_is_not_is_told_so(slug):
    """Whatever the page's data-assistant says, even what no slug can be (PostgreSQL refuses a NUL in
    a query): a 404 with a sentence, as the schema's plain string promises, never a 400 or a 500."""
    Assistant.objects.create(slug="support", name="Support", system_prompt="Help.", allowed_origins=[PAGE])

    response = Page().mint(assistant=slug)

    assert response.status_code == 404
    assert response.json() == {"detail": "This assistant is not available."}


def test_an_expired_token_is_refused_and_a_new_one_is_minted_for_the_same_visitor(conversations_settings):
    page = Page()
    page.mint()
    turn = started(page)
    conversations_settings.update(WIDGET_TOKEN_TTL=-1)  # every token issued is now past its lifetime

    refused = page.get(turn["poll_url"])
    renewal = page.renew()

    assert refused.status_code == 401
    assert refused.json() == {"detail": "This chat's access has expired. Please reload the page."}
    assert renewal.status_code == 401  # an expired token renews nothing …
    conversations_settings.update(WIDGET_TOKEN_TTL=900)
    page.token = None
    assert page.mint().status_code == 200  # … but the same visitor id gets a new one, and its conversation
    assert page.get(f"/api/conversations/{turn['conversation']}/").status_code == 200


def test_a_tampered_token_is_refused():
    page = Page()
    page.mint()
    payload, _sep, signature = page.token.partition(":")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["v"] = "someone-else-entirely-0123456789"
    forged = base64.urlsafe_b64encode(json.dumps(claims, separators=(",", ":")).encode()).decode()

    responses = [page.post("/api/conversations/", token=forged.rstrip("=") + ":" + signature),
                 page.post("/api/conversations/", token=page.token[:-2] + "xx")]

    for response in responses:
        assert response.status_code == 401
        assert response.json() == {"detail": "This chat could not verify its access. Please reload the page."}
    assert not Conversation.objects.exists()


def test_a_page_of_an_origin_not_allowed_gets_no_token_and_can_read_why():
    page = Page(origin=OTHER)

    response = page.mint()

    assert response.status_code == 403
    assert response.json() == {"detail": f"This assistant cannot be used on pages of {OTHER}."}
    assert response["Access-Control-Allow-Origin"] == OTHER  # the widget can show the sentence
    assert not Conversation.objects.exists()


def test_cors_preflight_answers_allowed_origins_only():
    Assistant.objects.create(slug="docs", name="Docs", system_prompt="Explain.",
                             allowed_origins=["https://*.example.org"])
    client = Client()

    def preflight(origin, path="/api/conversations/"):
        return client.options(path, HTTP_ORIGIN=origin, HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST",
                              HTTP_ACCESS_CONTROL_REQUEST_HEADERS="authorization,content-type")

    allowed, wildcard, refused = preflight(PAGE), preflight("https://help.example.org"), preflight(OTHER)
    bare_domain = preflight("https://example.org")  # "*." stands for a subdomain, not the domain itself

    assert allowed.status_code == 204 and allowed["Access-Control-Allow-Origin"] == PAGE
    assert {"Authorization", "Content-Type", "If-None-Match"} <= {
        h.strip() for h in allowed["Access-Control-Allow-Headers"].split(",")}
    assert "Origin" in allowed["Vary"] and "Access-Control-Allow-Credentials" not in allowed
    assert wildcard["Access-Control-Allow-Origin"] == "https://help.example.org"
    for response in (refused, bare_domain):
        assert "Access-Control-Allow-Origin" not in response and "Origin" in response["Vary"]
    # An assistant's origins are its own: the default assistant is not embedded there.
    assert Page(origin="https://help.example.org").mint().status_code == 403
    assert Page(origin="https://help.example.org").mint(assistant="docs").status_code == 200


def test_token_minting_is_limited_per_address(conversations_settings):
    conversations_settings.update(TOKEN_RATE_PER_IP="2/min")
    answers = [Page().mint().status_code for _ in range(3)]
    last = Page().mint()

    assert answers == [200, 200, 429]
    # One voice: the app's sentence alone, the wait in Retry-After.
    assert last.json() == {"detail": "This chat was opened too many times from your address. Please wait a moment "
                                     "and reload the page."}
    assert int(last["Retry-After"]) >= 1


def signed_in_user():
    return get_user_model().objects.create_user("shopper", password="pw-123456789")


def test_a_signed_identity_makes_the_visitor_that_user(conversations_settings):
    conversations_settings.update(LOGIN_REQUIRED=True)
    user = signed_in_user()
    page, anonymous = Page(), Page()

    minted = page.mint(identity=visitors.sign_identity(user.pk, SECRET))
    refused = anonymous.mint()
    turn = started(page)

    assert minted.status_code == 200 and refused.status_code == 403
    assert refused.json() == {"detail": "Please sign in to chat with the assistant."}
    conversation = Conversation.objects.get()
    assert conversation.user == user and str(conversation.id) == turn["conversation"]
    assert page.get(turn["poll_url"]).status_code == 200
    # Their conversations, from any page the host site vouches for them on.
    again = Page()
    again.mint(identity=visitors.sign_identity(user.pk, SECRET))
    assert again.get(f"/api/conversations/{turn['conversation']}/").status_code == 200


def tampered(identity):
    """``identity`` with the last character of its signature changed (to another one: a signature
    that already ended in "0" stayed genuine when "0" was written over it, one run in sixteen)."""
    return identity[:-1] + ("1" if identity.endswith("0") else "0")


def signed_with_stamp(user_id, stamp):
    """An identity genuinely signed with the site's secret whose timestamp is ``stamp`` as written."""
    message = f"{user_id}:{stamp}:{secrets.token_hex(16)}"
    return f"{message}:{hmac.new(SECRET.encode(), message.encode(), hashlib.sha256).hexdigest()}"


@pytest.mark.parametrize("identity, sentence", [
    (lambda user: visitors.sign_identity(user.pk, "not-the-site-secret"),
     "Your sign-in could not be verified. Please reload the page."),
    (lambda user: tampered(visitors.sign_identity(user.pk, SECRET)),
     "Your sign-in could not be verified. Please reload the page."),
    (lambda user: f"{user.pk}:{int(time.time())}:nonce",
     "Your sign-in could not be verified. Please reload the page."),
    (lambda user: visitors.sign_identity(user.pk, SECRET, now=time.time() - 301),
     "Your sign-in has expired. Please reload the page."),
    (lambda user: visitors.sign_identity(user.pk, SECRET)[:-1] + "é",
     "Your sign-in could not be verified. Please reload the page."),
    (lambda user: visitors.sign_identity(user.pk, SECRET).replace(":", ":\x00", 1),
     "Your sign-in could not be verified. Please reload the page."),
    # Digits to str.isdigit() but not to int() (a 500), or to int() but not ASCII: signed, yet no timestamp.
    (lambda user: signed_with_stamp(user.pk, "\u00b2"),
     "Your sign-in could not be verified. Please reload the page."),
    (lambda user: signed_with_stamp(user.pk, "".join(chr(0x660 + int(d)) for d in str(int(time.time())))),
     "Your sign-in could not be verified. Please reload the page."),
], ids=["forged", "tampered", "unsigned", "expired", "not-ascii", "nul", "superscript-stamp", "arabic-indic-stamp"])
def test_a_signed_identity_that_cannot_be_taken_is_refused(identity, sentence):
    user = signed_in_user()

    response = Page().mint(identity=identity(user))

    assert response.status_code == 401
    assert response.json() == {"detail": sentence}


@pytest.mark.parametrize("user_id", ["not-a-number", "999999"])
def test_a_signed_identity_of_a_user_this_site_does_not_have_is_refused(user_id):
    """A host site may sign ids that are none of this site's users (its own scheme, or a user
    deleted since): refused with the sentence, never a 500."""
    signed_in_user()

    response = Page().mint(identity=visitors.sign_identity(user_id, SECRET))

    assert response.status_code == 401
    assert response.json() == {"detail": "Your sign-in could not be verified. Please reload the page."}


def test_a_signed_identity_that_is_no_uuid_is_refused_where_users_have_uuid_keys(monkeypatch):
    """A site whose user model's primary key is a UUID (one model per test run, so a model of this
    app with a UUID key stands in for it): Django raises ValidationError, not ValueError, for an id
    that is not one; it is refused like any other."""
    monkeypatch.setattr(authentication, "get_user_model", lambda: Conversation)
    visitor = visitors.Visitor(origin=PAGE, assistant_id=None, visitor_id="v" * 22, user_id="not-a-uuid")

    with pytest.raises(AuthenticationFailed) as refused:
        authentication.visitor_user(visitor)

    assert str(refused.value.detail) == "Your sign-in could not be verified. Please reload the page."


def test_a_replayed_signed_identity_is_refused():
    identity = visitors.sign_identity(signed_in_user().pk, SECRET)

    first, replayed = Page().mint(identity=identity), Page().mint(identity=identity)

    assert first.status_code == 200 and replayed.status_code == 401
    assert replayed.json() == {"detail": "Your sign-in was already used. Please reload the page."}


def test_an_origin_that_is_not_one_is_refused_in_the_admin_form():
    assistant = Assistant(slug="x", name="X", system_prompt="Hi.",
                          allowed_origins=["https://ok.example.com", "https://*", "https://*.example.com/path"])

    fields = [field for field, _reason in assistants.problems(assistant)]

    assert fields == ["allowed_origins"]
    assistant.allowed_origins = ["https://ok.example.com", "https://*.example.com", "http://127.0.0.1:8000"]
    assert not [f for f, _reason in assistants.problems(assistant) if f == "allowed_origins"]


@pytest.mark.django_db(transaction=True)
def test_an_embedded_widgets_poll_is_answered_from_the_cache_alone(worker, django_assert_num_queries):
    user = signed_in_user()
    anonymous, signed_in = Page(), Page()
    anonymous.mint()
    signed_in.mint(identity=visitors.sign_identity(user.pk, SECRET))
    turns = [started(anonymous), started(signed_in)]
    worker()
    for page, turn in zip((anonymous, signed_in), turns):
        assert page.get(turn["poll_url"]).json()["done"]  # the allowed origins are read once here

        with django_assert_num_queries(0):
            response = page.get(turn["poll_url"])

        assert response.status_code == 200 and response["Access-Control-Allow-Origin"] == PAGE


def test_an_allowed_origin_that_no_page_can_have_stops_the_checks(conversations_settings):
    from conversations.checks import check_config

    conversations_settings.update(ALLOWED_ORIGINS=["https://shop.example.com", "https://*.example.com", "https://*",
                                                   "https://shop.example.com/cart", "TOKEN_RATE"],
                                  TOKEN_RATE_PER_IP="often")

    found = [(m.id, m.msg) for m in check_config() if m.id in ("conversations.E043", "conversations.E012")]

    assert found == [
        ("conversations.E012", "TOKEN_RATE_PER_IP 'often' is not a rate."),
        ("conversations.E043", "ALLOWED_ORIGINS entry 'https://*' is not an origin a page can have."),
        ("conversations.E043", "ALLOWED_ORIGINS entry 'https://shop.example.com/cart' is not an origin a page can have."),
        ("conversations.E043", "ALLOWED_ORIGINS entry 'TOKEN_RATE' is not an origin a page can have."),
    ]


def docs_code_block(opening):
    """The code block of docs/widget.md that starts with ``opening``."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "widget.md").read_text()
    blocks = re.findall(r"```(?:python|js)\n(.*?)```", text, re.S)
    return next(block for block in blocks if block.startswith(opening))


@pytest.mark.parametrize("language", ["python", "node"])
def test_the_signing_code_in_the_docs_makes_identities_the_api_takes(language):
    user = signed_in_user()
    if language == "python":
        namespace = {}
        exec(docs_code_block("import hashlib"), namespace)  # noqa: S102 - our own docs
        identity = namespace["conversations_identity"](user.pk, SECRET)
    else:
        code = docs_code_block('const crypto') + f"\nprocess.stdout.write(conversationsIdentity({user.pk}, {SECRET!r}));"
        identity = subprocess.run(["node", "-e", code], capture_output=True, text=True, check=True).stdout

    assert Page().mint(identity=identity).status_code == 200


def test_an_assistant_for_signed_in_users_gets_a_token_only_with_a_signed_identity():
    Assistant.objects.create(slug="members", name="Members", system_prompt="Help.", allowed_origins=[PAGE],
                             access=Assistant.Access.SIGNED_IN)
    user = signed_in_user()
    anonymous, member = Page(), Page()

    refused = anonymous.mint(assistant="members")
    minted = member.mint(assistant="members", identity=visitors.sign_identity(user.pk, SECRET))

    assert refused.status_code == 403
    assert refused.json() == {"detail": "Please sign in to chat with this assistant."}
    assert minted.status_code == 200
    assert member.post("/api/conversations/", {"assistant": "members"}).status_code == 201
    assert Conversation.objects.get().user == user


@pytest.mark.django_db(transaction=True)
def test_a_signed_in_users_token_for_one_assistant_reaches_none_of_their_conversations_with_another():
    """A host site vouching for its user on a page embedding one assistant grants that assistant's
    conversations of theirs, not the ones they had with an assistant allowed on no other site
    (on the site's own pages): every endpoint answers 404 as for a conversation not theirs, the
    poll of a cached state and the handoff's too."""
    partner = "https://partner.example"
    Assistant.objects.create(slug="public", name="Public", system_prompt="Help.", allowed_origins=[partner])
    Assistant.objects.create(slug="internal", name="Internal", system_prompt="Secrets.", allowed_origins=[],
                             handoff=Assistant.HandoffWays.BUTTON)
    user = signed_in_user()
    own_site = Client()
    own_site.force_login(user)

    def own_post(url, data=None):
        return own_site.post(url, json.dumps(data or {}), content_type="application/json")

    private = own_post("/api/conversations/", {"assistant": "internal"}).json()["id"]
    turn = own_post(f"/api/conversations/{private}/turns/", {"content": "Our salaries?"}).json()
    handed = own_post("/api/conversations/", {"assistant": "internal"}).json()["id"]
    assert own_post(f"/api/conversations/{handed}/handoff/").status_code == 202
    page = Page(origin=partner)
    assert page.mint(assistant="public", identity=visitors.sign_identity(user.pk, SECRET)).status_code == 200
    mine = page.post("/api/conversations/", {"assistant": "public"}).json()["id"]

    listed = page.get("/api/conversations/")
    answers = {
        "detail": page.get(f"/api/conversations/{private}/"),
        "turns": page.post(f"/api/conversations/{private}/turns/", {"content": "Tell me."}),
        "poll": page.get(turn["poll_url"]),
        "cancel": page.post(turn["cancel_url"]),
        "rating": page.post(turn["rating_url"], {"value": "up"}),
        "handoff": page.get(f"/api/conversations/{handed}/handoff/"),
        "handoff post": page.post(f"/api/conversations/{private}/handoff/"),
        "handoff back": page.post(f"/api/conversations/{handed}/handoff/back/"),
    }

    assert [c["id"] for c in listed.json()] == [mine]
    assert {name: r.status_code for name, r in answers.items()} == dict.fromkeys(answers, 404)
    for response in answers.values():
        assert response.json() == {"detail": "This conversation is no longer available. It may have expired; "
                                             "please start a new one."}
    assert Turn.objects.filter(conversation_id=private).count() == 1
    assert Turn.objects.get(conversation_id=private).status == Turn.Status.QUEUED
    assert own_site.get(f"/api/conversations/{private}/").status_code == 200  # still theirs on the site itself


def test_a_state_published_before_states_named_their_assistant_is_checked_against_the_row():
    """A state an older worker published names no assistant: the token's own turn is still served
    (its row says whose it is), and a foreign one still is not."""
    from conversations.infra import state

    page, stranger = Page(), Page()
    page.mint()
    stranger.mint()
    turn = started(page)
    data = state.read(turn["id"])
    del data["owner"]["assistant"]
    state.publish(data)

    assert page.get(turn["poll_url"]).status_code == 200
    assert stranger.get(turn["poll_url"]).status_code == 404


MALFORMED_ORIGINS = ["http://[", "https://a]b", "https://[zz]"]


@pytest.mark.parametrize("malformed", MALFORMED_ORIGINS)
def test_a_malformed_origin_header_is_refused_like_any_origin_not_allowed(malformed):
    """An Origin header no page can send (a bracket without its pair: urlsplit raises on it) is an
    origin like any other that is not allowed: no CORS, no token, a token refused; never a 500."""
    page = Page()
    page.mint()
    turn = started(page)
    odd = Page(origin=malformed)

    preflight = Client().options("/api/conversations/", HTTP_ORIGIN=malformed,
                                 HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST")
    minted = odd.mint()
    listed = odd.get("/api/conversations/", token=page.token)
    polled = odd.get(turn["poll_url"], token=page.token)

    assert preflight.status_code == 204 and "Access-Control-Allow-Origin" not in preflight
    assert minted.status_code == 403
    assert minted.json() == {"detail": "This assistant cannot be used on this page."}
    for response in (listed, polled):
        assert response.status_code == 401
        assert response.json() == {"detail": "This chat's access was given to another site. Please reload the page."}


def test_an_allowed_origin_with_a_bracket_stops_the_checks_and_breaks_no_request(conversations_settings):
    from conversations.checks import check_config

    conversations_settings.update(ALLOWED_ORIGINS=[PAGE, "https://a]b", "http://["])

    found = [m.msg for m in check_config() if m.id == "conversations.E043"]
    page = Page()

    assert found == ["ALLOWED_ORIGINS entry 'https://a]b' is not an origin a page can have.",
                     "ALLOWED_ORIGINS entry 'http://[' is not an origin a page can have."]
    assert page.mint().status_code == 200
    assert page.get("/api/conversations/")["Access-Control-Allow-Origin"] == PAGE


def test_origin_null_is_not_the_sites_own_page(conversations_settings):
    """``Origin: null`` (a sandboxed frame, a file: page, on any site) is no origin a token or an
    allowed origin names, not the site's own: only a request without the header is the site's."""
    own = "http://testserver"
    conversations_settings.update(ALLOWED_ORIGINS=[PAGE, own])
    site_page, sandboxed = Page(origin=own), Page(origin="null")
    assert site_page.mint().status_code == 200

    used = sandboxed.get("/api/conversations/", token=site_page.token)
    minted = sandboxed.mint()

    assert used.status_code == 401
    assert used.json() == {"detail": "This chat's access was given to another site. Please reload the page."}
    assert minted.status_code == 403
    assert minted.json() == {"detail": "This assistant cannot be used on this page."}
    # Without the header (a same-origin GET, which browsers send without one) it is the site's own page.
    assert Client().get("/api/conversations/", HTTP_AUTHORIZATION=f"Bearer {site_page.token}").status_code == 200


def test_a_signed_identity_refused_for_its_page_is_not_used_up():
    """A request refused for what it asks (a page of an origin not allowed, an assistant the user may
    not use) spends no signed identity: the page it was made for still signs the user in with it."""
    Assistant.objects.create(slug="staff-only", name="Staff", system_prompt="Hi.", allowed_origins=[PAGE],
                             access=Assistant.Access.STAFF)
    identity = visitors.sign_identity(signed_in_user().pk, SECRET)

    elsewhere = Page(origin=OTHER).mint(identity=identity)
    not_theirs = Page().mint(assistant="staff-only", identity=identity)
    page = Page()
    minted = page.mint(identity=identity)

    assert elsewhere.status_code == 403
    assert elsewhere.json() == {"detail": f"This assistant cannot be used on pages of {OTHER}."}
    assert not_theirs.status_code == 403
    assert minted.status_code == 200
    assert Page().mint(identity=identity).status_code == 401  # and then it is used up


def a_token_of_a_chain_begun(page, seconds_ago, user_id=None):
    """A token for ``page``'s visitor, renewed ever since its chain began ``seconds_ago`` (what a
    widget left open that long holds: each renewal keeps when the first token was issued)."""
    return visitors.issue(visitors.Visitor(origin=page.origin, assistant_id=None, visitor_id=page.visitor,
                                           user_id=user_id, started=time.time() - seconds_ago))


def test_renewals_end_when_the_first_token_of_their_chain_is_older_than_the_max_age(conversations_settings):
    """A token can be renewed for WIDGET_TOKEN_MAX_AGE (12 hours) after the first of its chain was
    issued, not for ever; an anonymous visitor then gets a new one for their visitor id, as the
    widget asks, and keeps their conversation."""
    page = Page()
    page.mint()
    turn = started(page)
    page.token = a_token_of_a_chain_begun(page, 12 * 3600 + 60)

    still_good = page.get(f"/api/conversations/{turn['conversation']}/")  # good until its own TTL ends
    renewal = page.renew()
    page.token = None
    fresh = page.mint()

    assert still_good.status_code == 200
    assert renewal.status_code == 401
    assert renewal.json() == {"detail": "This chat's access has expired. Please reload the page."}
    assert fresh.status_code == 200
    assert page.get(f"/api/conversations/{turn['conversation']}/").status_code == 200


def test_a_renewed_token_keeps_when_its_chain_began(conversations_settings):
    page = Page()
    page.token = a_token_of_a_chain_begun(page, 2 * 3600)
    renewed = page.renew()
    assert renewed.status_code == 200
    page.token = renewed.json()["token"]
    conversations_settings.update(WIDGET_TOKEN_MAX_AGE=3600)

    again = page.renew()

    assert again.status_code == 401  # a renewal that began a new chain would have been renewed
    assert again.json() == {"detail": "This chat's access has expired. Please reload the page."}


def test_a_signed_in_users_chain_past_the_max_age_is_not_renewed():
    """The widget cannot mint a signed-in user a new chain without a new signature from the host
    site: past the max age the user reads that the chat's access expired and reloads the page."""
    user = signed_in_user()
    page = Page()
    page.token = a_token_of_a_chain_begun(page, 13 * 3600, user_id=user.pk)

    renewal = page.renew()

    assert renewal.status_code == 401
    assert renewal.json() == {"detail": "This chat's access has expired. Please reload the page."}
    assert page.mint(identity=visitors.sign_identity(user.pk, SECRET)).status_code == 200  # a reload


def test_a_max_age_shorter_than_a_tokens_lifetime_stops_the_checks(conversations_settings):
    from conversations.checks import check_config

    conversations_settings.update(WIDGET_TOKEN_TTL=900, WIDGET_TOKEN_MAX_AGE=600)

    found = [(m.id, m.msg) for m in check_config() if m.id == "conversations.E045"]

    assert found == [("conversations.E045", "WIDGET_TOKEN_MAX_AGE (600s) is shorter than WIDGET_TOKEN_TTL (900s): "
                                            "the first token of a chain would outlive the time its chain may be "
                                            "renewed for.")]


@pytest.mark.django_db(transaction=True)
def test_an_embedded_widget_is_offered_a_person_and_follows_the_handoff_with_its_token():
    Assistant.objects.create(slug="support", name="Support", provider="demo", system_prompt="Help.",
                             handoff=Assistant.HandoffWays.BUTTON)
    Assistant.objects.create(slug="sales", name="Sales", provider="demo", system_prompt="Sell.")
    assert Page().mint("sales").json()["widget"]["handoff"] == ""
    page = Page()
    assert page.mint("support").json()["widget"]["handoff"] == "button"
    conversation = page.post("/api/conversations/", {"assistant": "support"}).json()["id"]

    asked = page.post(f"/api/conversations/{conversation}/handoff/")
    polled = page.get(f"/api/conversations/{conversation}/handoff/")
    again = page.get(f"/api/conversations/{conversation}/handoff/", HTTP_IF_NONE_MATCH=polled["ETag"])

    assert asked.status_code == 202 and asked.json()["state"] == "waiting"
    assert polled.status_code == 200 and polled.json()["state"] == "waiting" and again.status_code == 304
    assert polled["Access-Control-Allow-Origin"] == PAGE and not polled.cookies


@pytest.mark.parametrize("lookalike", [PAGE + ".evil.net", PAGE + ":8443", PAGE + "-evil.net"])
def test_an_origin_that_only_begins_with_an_allowed_one_gets_no_token_and_no_cors(lookalike):
    """An allowed origin is matched whole: a page whose origin merely starts with it is another site."""
    Assistant.objects.create(slug="sales", name="Sales", system_prompt="Sell.", allowed_origins=[PAGE])
    preflight = Client().options("/api/conversations/", HTTP_ORIGIN=lookalike,
                                 HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST")

    assert Page(origin=lookalike).mint().status_code == 403
    assert Page(origin=lookalike).mint(assistant="sales").status_code == 403
    assert "Access-Control-Allow-Origin" not in preflight
    assert not Conversation.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_user_the_host_site_deactivated_can_no_longer_chat_read_or_renew_with_their_token():
    """Polls too: one answered from the cache before (the user verified active) is not after."""
    user = signed_in_user()
    page = Page()
    assert page.mint(identity=visitors.sign_identity(user.pk, SECRET)).status_code == 200
    turn = started(page)
    assert [page.get(turn["poll_url"]).status_code for _ in range(2)] == [200, 200]  # the second from the cache
    user.is_active = False
    user.save()

    answers = [page.post("/api/conversations/"), page.get(f"/api/conversations/{turn['conversation']}/"),
               page.post(f"/api/conversations/{turn['conversation']}/turns/", {"content": "Still there?"}),
               page.get(turn["poll_url"]), page.renew()]

    assert [answer.status_code for answer in answers] == [401, 401, 401, 401, 401]
    # Reloading would sign the same account in again: the sentence says what is true instead.
    assert {answer.json()["detail"] for answer in answers} == {
        "Your account can no longer use this chat: the site has switched it off. Please contact the site if you "
        "think this is a mistake."}
    assert page.get(turn["poll_url"], HTTP_ACCEPT_LANGUAGE="es").json() == {"detail": (
        "Su cuenta ya no puede usar este chat: el sitio la ha desactivado. Si cree que es un error, póngase en "
        "contacto con el sitio.")}
    assert Conversation.objects.count() == 1 and Turn.objects.count() == 1


OTHER_ASSISTANT = ("This conversation was with another assistant of this site, so it cannot go on in this chat. "
                   "Please start a new one here.")


@pytest.mark.parametrize("signed_in", [False, True], ids=["anonymous visitor", "signed-in user"])
def test_a_token_for_one_assistant_on_the_visitors_conversation_with_another_says_so(signed_in):
    """The same visitor (the widget's visitor id, or the user the host site vouches for) holds a
    token for Sales and one for Support: Support's token on the Sales conversation is refused with
    the truth, not "It may have expired"; a stranger's token still reads "no longer available"."""
    for slug in ("sales", "support"):
        Assistant.objects.create(slug=slug, name=slug.title(), system_prompt="Help.", allowed_origins=[PAGE])
    user = signed_in_user() if signed_in else None

    def signed():  # a fresh identity for each token: one is spent by the token it gets
        return {"identity": visitors.sign_identity(user.pk, SECRET)} if user else {}

    sales, stranger = Page(), Page()
    support = Page(visitor=sales.visitor)  # the same widget's visitor id on the same site
    assert sales.mint(assistant="sales", **signed()).status_code == 200
    assert support.mint(assistant="support", **signed()).status_code == 200
    assert stranger.mint(assistant="support").status_code == 200
    turn = started(sales, assistant="sales")
    conversation = f"/api/conversations/{turn['conversation']}/"

    answers = [support.get(conversation), support.post(conversation + "turns/", {"content": "And now?"}),
               support.get(turn["poll_url"])]
    strangers = [stranger.get(conversation), stranger.get(turn["poll_url"])]

    assert [(a.status_code, a.json()["detail"]) for a in answers] == [(404, OTHER_ASSISTANT)] * 3
    assert [(a.status_code, a.json()["detail"]) for a in strangers] == [
        (404, "This conversation is no longer available. It may have expired; please start a new one.")] * 2
    assert support.get(conversation, HTTP_ACCEPT_LANGUAGE="es").json() == {"detail": (
        "Esta conversación era con otro asistente de este sitio, así que no puede continuar en este chat. Empieza "
        "una nueva aquí.")}
    assert sales.get(turn["poll_url"]).status_code == 200
    assert Turn.objects.count() == 1


def test_a_token_for_an_assistant_starts_no_conversation_with_the_sites_default():
    """The default assistant has origins of its own (``ALLOWED_ORIGINS``): a token for another one
    is not a way in."""
    Assistant.objects.create(slug="sales", name="Sales", system_prompt="Sell.", allowed_origins=[PAGE])
    page = Page()
    assert page.mint(assistant="sales").status_code == 200

    response = page.post("/api/conversations/", {})

    assert response.status_code == 401
    assert response.json() == {"detail": "This chat's access was given for another assistant. Please reload the "
                                         "page."}
    assert not Conversation.objects.exists()


def test_a_token_for_an_assistant_switched_off_since_is_not_renewed():
    sales = Assistant.objects.create(slug="sales", name="Sales", system_prompt="Sell.", allowed_origins=[PAGE])
    page = Page()
    assert page.mint(assistant="sales").status_code == 200
    sales.active = False
    sales.save()

    renewal = page.renew()

    assert renewal.status_code == 404
    assert renewal.json() == {"detail": "This assistant is not available."}
    assert "token" not in renewal.json()


@pytest.mark.parametrize("spelling", ["0{}", "+{}", "{} ", " {}", "{}.0", "{}\n"])
def test_a_signed_identity_names_a_user_in_one_spelling_only(spelling):
    """``06`` is not user 6: another spelling would be another owner and another replay record for
    the same user."""
    user = signed_in_user()

    response = Page().mint(identity=visitors.sign_identity(spelling.format(user.pk), SECRET))

    assert response.status_code == 401
    assert response.json() == {"detail": "Your sign-in could not be verified. Please reload the page."}
    assert Page().mint(identity=visitors.sign_identity(str(user.pk), SECRET)).status_code == 200


def test_an_origin_taken_off_the_list_is_not_kept_in_a_browsers_preflight_cache(conversations_settings):
    """SECURITY.md: the browser stops sending from an origin taken off the list within 20 seconds,
    10 for the answers (the origins' cache) and 10 for the preflight it keeps."""
    def preflight():
        return Client().options("/api/conversations/", HTTP_ORIGIN=PAGE, HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST",
                                HTTP_ACCESS_CONTROL_REQUEST_HEADERS="authorization,content-type")

    allowed = preflight()
    conversations_settings.update(ALLOWED_ORIGINS=[])
    removed = preflight()

    assert allowed["Access-Control-Allow-Origin"] == PAGE and 0 < int(allowed["Access-Control-Max-Age"]) <= 10
    assert "Access-Control-Allow-Origin" not in removed and "Access-Control-Max-Age" not in removed
