"""Abuse and cost limits: throttles on turn creation, a cap per conversation, a daily token
budget per owner, and input limits (message length, control characters, body size)."""

import datetime
import io
import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from conversations.api.parsers import LimitedJSONParser, RequestTooLarge
from conversations.models import Conversation, Message, Turn
from tests.support.helpers import api_post, at_once, make_client, start_turn
from tests.support.fakes import FakeProvider, openai_text

pytestmark = pytest.mark.django_db(transaction=True)


def new_conversation(client, **extra):
    return api_post(client, "/api/conversations/", **extra).json()["id"]


def send(client, conversation, content="Hello", **extra):
    return api_post(client, f"/api/conversations/{conversation}/turns/", {"content": content}, **extra)


def finish_all_turns():
    """Mark every turn done, so the next message is not refused as 'still answering' (409)."""
    Turn.objects.update(status=Turn.Status.COMPLETED, finished_at=timezone.now())


# -- rate limits ------------------------------------------------------------------------------

def test_too_many_turns_per_owner_get_429_with_retry_after(conversations_settings):
    conversations_settings.update(TURN_RATE_PER_OWNER="2/min")
    client = make_client()
    conversation = new_conversation(client)
    for _ in range(2):
        assert send(client, conversation).status_code == 202
        finish_all_turns()
    response = send(client, conversation)

    assert response.status_code == 429
    assert 1 <= int(response["Retry-After"]) <= 60
    assert "too quickly" in response.json()["detail"]
    assert Turn.objects.count() == 2
    # Another visitor is not slowed down by this one.
    other = make_client()
    assert send(other, new_conversation(other)).status_code == 202


def test_too_many_turns_per_ip_get_429_across_owners(conversations_settings):
    conversations_settings.update(TURN_RATE_PER_IP="2/min")
    for _ in range(2):
        client = make_client()
        assert send(client, new_conversation(client)).status_code == 202
    client = make_client()  # a fresh session (cookies thrown away) from the same address
    response = send(client, new_conversation(client))
    assert response.status_code == 429 and int(response["Retry-After"]) >= 1
    assert send(client, new_conversation(client), REMOTE_ADDR="10.1.2.3").status_code == 202


def spoofed_address_headers():
    """Every header a client could use to claim another address, each with a new random one."""
    import random

    def address():
        return ".".join(str(random.randint(1, 254)) for _ in range(4))

    return {"HTTP_X_FORWARDED_FOR": f"{address()}, {address()}", "HTTP_FORWARDED": f"for={address()}",
            "HTTP_X_REAL_IP": address(), "HTTP_CLIENT_IP": address(), "HTTP_TRUE_CLIENT_IP": address()}


def test_a_client_cannot_escape_the_ip_limit_with_address_headers_and_new_cookies(conversations_settings):
    # Without NUM_PROXIES no header a client writes says who it is: only the connection's address does.
    conversations_settings.update(TURN_RATE_PER_IP="2/min")
    answers = []
    for _ in range(6):
        client = make_client()  # a new session, so a new owner with a fresh per-owner limit and budget
        answers.append(send(client, new_conversation(client, **spoofed_address_headers()),
                            **spoofed_address_headers()).status_code)
    assert answers == [202, 202, 429, 429, 429, 429]


def test_address_headers_cannot_spend_someone_elses_ip_limit(conversations_settings):
    conversations_settings.update(TURN_RATE_PER_IP="2/min")
    for _ in range(4):  # an attacker sends the victim's address in every header
        client = make_client()
        send(client, new_conversation(client), HTTP_X_FORWARDED_FOR="198.51.100.7", HTTP_X_REAL_IP="198.51.100.7",
             HTTP_FORWARDED="for=198.51.100.7")
    victim = make_client()
    assert send(victim, new_conversation(victim, REMOTE_ADDR="198.51.100.7"),
                REMOTE_ADDR="198.51.100.7").status_code == 202


def test_behind_a_proxy_num_proxies_makes_x_forwarded_for_the_client_address(conversations_settings, settings):
    conversations_settings.update(TURN_RATE_PER_IP="1/min")
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    for address in ("203.0.113.1", "203.0.113.2"):
        client = make_client()
        assert send(client, new_conversation(client), HTTP_X_FORWARDED_FOR=address).status_code == 202
    client = make_client()
    assert send(client, new_conversation(client), HTTP_X_FORWARDED_FOR="203.0.113.1").status_code == 429


@pytest.mark.parametrize("proxied", [False, True], ids=["direct", "behind_a_proxy"])
def test_ipv6_addresses_of_one_network_share_every_per_address_limit(proxied, conversations_settings, settings):
    """One subscriber holds a whole /64: 20 new conversations from 20 of its addresses were all
    accepted where one address got 429 after 3. Now the network is what is counted."""
    conversations_settings.update(CONVERSATION_RATE_PER_IP="3/hour", TURN_RATE_PER_IP="2/min")
    if proxied:
        settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}

    def came_from(address):
        return {"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": address} if proxied else {"REMOTE_ADDR": address}

    answers = [api_post(make_client(), "/api/conversations/", **came_from(f"2001:db8:1:2::{n:x}")).status_code
               for n in range(1, 21)]
    assert answers == [201] * 3 + [429] * 17
    # Another network, and an IPv4 client, have their own limits.
    assert api_post(make_client(), "/api/conversations/", **came_from("2001:db8:1:3::1")).status_code == 201
    assert api_post(make_client(), "/api/conversations/", **came_from("192.0.2.9")).status_code == 201

    # Turns are counted the same way (a conversation made from elsewhere, then posted to from the /64).
    sent = []
    for n in range(3):
        client = make_client()
        sent.append(send(client, new_conversation(client, **came_from("192.0.2.10")),
                         **came_from(f"2001:db8:9:9:{n}::1")).status_code)
    assert sent == [202, 202, 429]


def test_ipv4_clients_seen_through_an_ipv6_socket_keep_limits_of_their_own(conversations_settings):
    """A dual-stack server sees an IPv4 visitor as ::ffff:a.b.c.d: cut to a /64 that would put
    every IPv4 visitor under one limit."""
    conversations_settings.update(CONVERSATION_RATE_PER_IP="1/hour")
    answers = [api_post(make_client(), "/api/conversations/", REMOTE_ADDR=address).status_code
               for address in ("::ffff:192.0.2.1", "::ffff:192.0.2.2", "192.0.2.1", "fe80::1%eth0", "fe80::2")]
    assert answers == [201, 201, 429, 201, 429]


def test_ipv6_prefix_128_counts_each_address_apart(conversations_settings):
    conversations_settings.update(CONVERSATION_RATE_PER_IP="1/hour", IPV6_PREFIX=128)
    answers = [api_post(make_client(), "/api/conversations/", REMOTE_ADDR=address).status_code
               for address in ("2001:db8::1", "2001:db8::2", "2001:db8::1")]
    assert answers == [201, 201, 429]


def test_rest_framework_throttle_rates_override_the_defaults(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "DEFAULT_THROTTLE_RATES": {"conversations_turns_owner": "1/min"}}
    client = make_client()
    conversation = new_conversation(client)
    assert send(client, conversation).status_code == 202
    finish_all_turns()
    assert send(client, conversation).status_code == 429


@pytest.mark.parametrize("off", ["", "0"])
def test_an_empty_or_zero_rate_switches_a_throttle_off(off, conversations_settings):
    conversations_settings.update(TURN_RATE_PER_OWNER=off, TURN_RATE_PER_IP=off)
    client = make_client()
    conversation = new_conversation(client)
    for _ in range(12):
        assert send(client, conversation).status_code == 202
        finish_all_turns()


def test_too_many_new_conversations_get_429_per_owner_and_per_ip(conversations_settings):
    conversations_settings.update(CONVERSATION_RATE_PER_OWNER="3/hour", CONVERSATION_RATE_PER_IP="7/hour")
    client = make_client()
    # The first conversation makes the visitor an owner (counted per address only); three more, then 429.
    answers = [api_post(client, "/api/conversations/").status_code for _ in range(5)]
    assert answers == [201, 201, 201, 201, 429]
    refused = api_post(client, "/api/conversations/")
    # One voice: the app's sentence, and the wait in Retry-After (not DRF's "Expected available in…").
    assert refused.json() == {"detail": "You have started too many conversations. Please continue one of them or "
                                        "try again later."}
    assert int(refused["Retry-After"]) >= 1
    # A new cookie per request is a new owner, but the same address (6 requests counted so far).
    answers = [api_post(make_client(), "/api/conversations/", **spoofed_address_headers()).status_code
               for _ in range(3)]
    assert answers == [201, 429, 429]
    assert Conversation.objects.count() == 5
    assert make_client().get("/api/conversations/").status_code == 200  # reading the list is not limited


# -- cost limits ------------------------------------------------------------------------------

def test_a_full_conversation_refuses_more_turns_with_403(conversations_settings):
    conversations_settings.update(MAX_TURNS_PER_CONVERSATION=2)
    client = make_client()
    conversation = new_conversation(client)
    for _ in range(2):
        assert send(client, conversation).status_code == 202
        finish_all_turns()
    response = send(client, conversation)

    assert response.status_code == 403
    assert response.json()["detail"] == ("This conversation has reached its limit of 2 messages. "
                                         "Please start a new conversation.")
    assert send(client, new_conversation(client)).status_code == 202


def test_daily_token_budget_refuses_with_429_until_midnight(conversations_settings, worker):
    with FakeProvider() as fake:
        fake.add(openai_text("One.", prompt_tokens=20, completion_tokens=10),
                 openai_text("Two.", prompt_tokens=20, completion_tokens=10))
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", DAILY_TOKEN_BUDGET=60)
        client = make_client()
        conversation = new_conversation(client)
        for _ in range(2):
            assert send(client, conversation).status_code == 202
            worker()
        assert sum(t.input_tokens + t.output_tokens for t in Turn.objects.all()) == 60

        response = send(client, new_conversation(client))  # the budget is the owner's, not the conversation's
        assert response.status_code == 429
        assert response.json() == {"detail": "You have reached today's limit for the assistant. "
                                             "Please come back tomorrow."}
        now = timezone.localtime()
        midnight = (now + datetime.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        assert abs(int(response["Retry-After"]) - (midnight - now).total_seconds()) < 60

        other = make_client()  # someone else still has their budget
        assert send(other, new_conversation(other)).status_code == 202

        Turn.objects.update(enqueued_at=timezone.now() - datetime.timedelta(days=1))
        assert send(client, conversation).status_code == 202  # a new day


def test_a_users_budget_counts_all_their_sessions(conversations_settings):
    conversations_settings.update(DAILY_TOKEN_BUDGET=100)
    user = get_user_model().objects.create_user("spender", password="pw-123456789")
    first = make_client()
    first.force_login(user)
    first.get("/")
    first.csrf = first.cookies["csrftoken"].value
    start_turn(first)
    Turn.objects.update(status=Turn.Status.COMPLETED, input_tokens=80, output_tokens=20)

    second = make_client()
    second.force_login(user)
    second.get("/")
    second.csrf = second.cookies["csrftoken"].value
    assert send(second, new_conversation(second)).status_code == 429


def test_zero_means_no_cost_limit(conversations_settings):
    conversations_settings.update(DAILY_TOKEN_BUDGET=0, MAX_TURNS_PER_CONVERSATION=0, TURN_RATE_PER_OWNER="")
    client = make_client()
    conversation = new_conversation(client)
    start = send(client, conversation)
    Turn.objects.update(status=Turn.Status.COMPLETED, input_tokens=10 ** 9, output_tokens=10 ** 9)
    assert start.status_code == 202
    assert send(client, conversation).status_code == 202


# -- input limits -----------------------------------------------------------------------------

def test_too_long_message_gets_a_clear_400(conversations_settings):
    conversations_settings.update(MAX_MESSAGE_LENGTH=10)
    client = make_client()
    response = send(client, new_conversation(client), "x" * 11)
    assert response.status_code == 400
    assert response.json() == {"content": ["The message is too long: 11 characters, at most 10 allowed."]}
    assert Turn.objects.count() == 0


def test_control_characters_are_stripped_and_an_empty_result_is_refused():
    client = make_client()
    conversation = new_conversation(client)
    assert send(client, conversation, "Hi\x00\x07 there\x1b[31m\u009b").status_code == 202
    assert Message.objects.get().content == "Hi there[31m"
    finish_all_turns()
    response = send(client, conversation, "\x00\x01\x02")
    assert response.status_code == 400 and response.json() == {"content": ["Write a message first."]}


def test_a_body_that_is_not_json_gets_415():
    client = make_client()
    response = client.post(f"/api/conversations/{new_conversation(client)}/turns/", data={"content": "Hi"},
                           HTTP_X_CSRFTOKEN=client.csrf)  # a form post
    assert response.status_code == 415
    assert "Unsupported media type" in response.json()["detail"]


def test_oversized_body_is_refused_with_413_before_it_is_parsed(conversations_settings):
    conversations_settings.update(MAX_REQUEST_BYTES=1000)
    client = make_client()
    conversation = new_conversation(client)
    # Not even JSON: a parsed body would have been a 400, so this 413 came before parsing.
    response = client.post(f"/api/conversations/{conversation}/turns/", data=b"{" * 5000,
                           content_type="application/json", HTTP_X_CSRFTOKEN=client.csrf)
    assert response.status_code == 413
    assert response.json() == {"detail": "The request is too large: at most 1000 bytes are accepted."}
    assert api_post(client, "/api/conversations/", {"padding": "x" * 2000}).status_code == 413
    assert Turn.objects.count() == 0


def test_a_body_longer_than_declared_or_undeclared_is_cut_off_at_the_limit(conversations_settings):
    """Chunked bodies have no Content-Length; the parser itself stops reading past the limit."""
    conversations_settings.update(MAX_REQUEST_BYTES=100)
    with pytest.raises(RequestTooLarge):
        LimitedJSONParser().parse(io.BytesIO(json.dumps({"content": "x" * 200}).encode()))
    assert LimitedJSONParser().parse(io.BytesIO(b'{"content": "short"}')) == {"content": "short"}


def test_django_refuses_huge_form_bodies_outside_the_api_too():
    client = make_client()
    response = client.post("/admin/login/", data="username=" + "x" * 300_000,
                           content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400


def post_at_once(clients):
    """POST one message in each client's own new conversation, all at the same moment (threads);
    return the status codes."""
    conversations = [new_conversation(client) for client in clients]
    return at_once(*[lambda c=client, id=conversation: send(c, id).status_code
                     for client, conversation in zip(clients, conversations)])


def sessions_of(username, count):
    """``count`` clients logged in as one new user (their phone, laptop, tabs…)."""
    user = get_user_model().objects.create_user(username, password="pw-123456789")
    clients = []
    for _ in range(count):
        client = make_client()
        client.force_login(user)
        client.get("/")
        client.csrf = client.cookies["csrftoken"].value
        clients.append(client)
    return clients


def test_turns_posted_at_once_in_many_conversations_cannot_overspend_the_budget(conversations_settings, worker):
    """A budget of 100 tokens once let 10 turns in side by side (690 tokens spent): now the
    running turn holds TURN_TOKEN_RESERVE back, and the owner's conversations are locked while
    the limits are checked, so spending stays within the budget plus one turn's worth."""
    with FakeProvider(default=openai_text("An answer.", prompt_tokens=50, completion_tokens=19)) as fake:
        conversations_settings.update(PROVIDER="openai", BASE_URL=fake.url, API_KEY="k", DAILY_TOKEN_BUDGET=100,
                                      TURN_RATE_PER_OWNER="", TURN_RATE_PER_IP="", CONVERSATION_RATE_PER_OWNER="",
                                      CONVERSATION_RATE_PER_IP="")
        clients = sessions_of("spender", 10)
        answers = post_at_once(clients)
        assert sorted(answers) == [202] + [429] * 9
        worker()
        answers = post_at_once(clients)  # 69 spent: one more fits, then the day is over
        assert sorted(answers) == [202] + [429] * 9
        worker()
        assert post_at_once(clients[:3]) == [429] * 3
    spent = sum(t.input_tokens + t.output_tokens for t in Turn.objects.exclude(input_tokens=None))
    assert spent == 138 <= 100 + 69


def test_one_address_cannot_fill_every_worker_however_many_owners_it_makes(conversations_settings, worker):
    """30 turns from one address, each from a new cookie (a new owner), were all accepted, and
    kept 3 workers busy until another visitor's turn was refused. Now an address, an IPv6 one by
    its /64, has at most MAX_ACTIVE_TURNS_PER_ADDRESS turns queued or running; the lock per
    address holds for requests sent at the same moment."""
    conversations_settings.update(MAX_ACTIVE_TURNS_PER_ADDRESS=3, TURN_RATE_PER_IP="", TURN_RATE_PER_OWNER="",
                                  CONVERSATION_RATE_PER_IP="", CONVERSATION_RATE_PER_OWNER="", DAILY_TOKEN_BUDGET=0)
    clients = [make_client() for _ in range(12)]
    conversations = [new_conversation(client) for client in clients]
    answers = at_once(*[lambda n=n: send(clients[n], conversations[n],
                                         REMOTE_ADDR=f"2001:db8:7:7:{n:x}::1") for n in range(12)])

    assert sorted(a.status_code for a in answers) == [202] * 3 + [429] * 9
    refused = next(a for a in answers if a.status_code == 429)
    assert int(refused["Retry-After"]) == 5
    assert refused.json() == {"detail": "The assistant is answering too many messages from your network right now. "
                                        "Please wait for an answer to finish."}
    assert Turn.objects.count() == 3
    spanish = send(clients[0], new_conversation(clients[0]), REMOTE_ADDR="2001:db8:7:7::5", HTTP_ACCEPT_LANGUAGE="es")
    assert spanish.json() == {"detail": "El asistente está respondiendo a demasiados mensajes de tu red en este "
                                        "momento. Espera a que termine una respuesta."}
    other = make_client()  # another visitor is not held up
    assert send(other, new_conversation(other), REMOTE_ADDR="2001:db8:7:8::1").status_code == 202

    worker()  # the address's turns end, and it may send again
    again = [send(clients[n], conversations[n], REMOTE_ADDR="2001:db8:7:7::9").status_code for n in range(4)]
    assert sorted(again) == [202] * 3 + [429]


def test_an_owner_may_have_only_so_many_turns_running_at_once(conversations_settings):
    conversations_settings.update(MAX_ACTIVE_TURNS_PER_OWNER=3, DAILY_TOKEN_BUDGET=0, TURN_RATE_PER_OWNER="")
    answers = post_at_once(sessions_of("busy", 8))
    assert sorted(answers) == [202] * 3 + [429] * 5
    client = sessions_of("other", 1)[0]
    response = send(client, new_conversation(client))
    assert response.status_code == 202  # someone else is not held up

    conversations_settings.update(MAX_ACTIVE_TURNS_PER_OWNER=1)
    refused = send(client, new_conversation(client))
    assert refused.status_code == 429 and int(refused["Retry-After"]) == 5
    assert refused.json() == {"detail": "The assistant is still answering your other messages. "
                                        "Please wait for an answer to finish."}


def tabs_of_one_visitor(count):
    """``count`` clients of one anonymous visitor (one session, so one owner token: their tabs)."""
    first = make_client()
    api_post(first, "/api/conversations/")  # gives the session its owner token
    tabs = [first]
    for _ in range(count - 1):
        tab = Client(enforce_csrf_checks=True)
        tab.cookies = first.cookies
        tab.csrf = first.csrf
        tabs.append(tab)
    return tabs


def test_an_anonymous_visitors_tabs_may_have_only_so_many_turns_running_at_once(conversations_settings):
    """Sent at the same moment from one session's tabs, each in a conversation of its own, no more
    than MAX_ACTIVE_TURNS_PER_OWNER turns start: the owner's token is locked (PostgreSQL), not only
    the conversation posted to."""
    conversations_settings.update(MAX_ACTIVE_TURNS_PER_OWNER=2, DAILY_TOKEN_BUDGET=0, TURN_RATE_PER_OWNER="",
                                  TURN_RATE_PER_IP="", CONVERSATION_RATE_PER_OWNER="", CONVERSATION_RATE_PER_IP="")
    tabs = tabs_of_one_visitor(6)
    conversations = [new_conversation(tabs[0]) for _ in tabs]
    answers = at_once(*[lambda tab=tab, id=conversation: send(tab, id).status_code
                        for tab, conversation in zip(tabs, conversations)])
    assert sorted(answers) == [202] * 2 + [429] * 4
    assert Turn.objects.count() == 2


def test_a_post_reads_only_its_own_conversation_however_many_the_owner_has(conversations_settings):
    """A visitor's POST of a turn read (and on PostgreSQL locked) every conversation of its owner
    under the write lock, 51 rows here, to check the limits per owner one request at a time: now
    it reads the one posted to, and the limits are still kept (the tests above)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    conversations_settings.update(TURN_RATE_PER_OWNER="", CONVERSATION_RATE_PER_OWNER="")
    client = make_client()
    posted = new_conversation(client)
    token = Conversation.objects.get(pk=posted).owner_token
    Conversation.objects.bulk_create([Conversation(owner_token=token) for _ in range(50)])
    with CaptureQueriesContext(connection) as queries:
        assert send(client, posted).status_code == 202

    table = f'FROM "{Conversation._meta.db_table}"'
    reads = [query["sql"] for query in queries.captured_queries
             if query["sql"].startswith("SELECT") and table in query["sql"]]
    rows = []
    with connection.cursor() as cursor:
        for sql in reads:  # as sent (their parameters inlined)
            cursor.execute(sql)
            rows.append(len(cursor.fetchall()))
    assert rows == [1], reads
