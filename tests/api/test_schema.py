"""The OpenAPI schema at /api/schema/ describes every endpoint and every answer it can give."""

import json

import pytest
from drf_spectacular.validation import validate_schema

from tests.support.helpers import OPERATIONS, call_every_endpoint, make_client

pytestmark = pytest.mark.django_db

CONVERSATION = "/api/conversations/{conversation_id}/"
TURNS = "/api/conversations/{conversation_id}/turns/"
POLL = "/api/conversations/{conversation_id}/turns/{turn_id}/"
CANCEL = "/api/conversations/{conversation_id}/turns/{turn_id}/cancel/"
RATING = "/api/conversations/{conversation_id}/turns/{turn_id}/rating/"
TOKEN = "/api/widget-token/"
HANDOFF = "/api/conversations/{conversation_id}/handoff/"
BACK = "/api/conversations/{conversation_id}/handoff/back/"
APPROVAL = "/api/conversations/{conversation_id}/turns/{turn_id}/approval/"


@pytest.fixture
def schema():
    response = make_client().get("/api/schema/?format=json")
    assert response.status_code == 200
    return json.loads(response.content)


def statuses(schema, path, method):
    return set(schema["paths"][path][method]["responses"])


def test_the_schema_is_public_valid_openapi_3(schema):
    validate_schema(schema)  # raises on an invalid document
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "Conversations API"


def test_the_schema_lists_every_endpoint_and_only_the_api(schema):
    assert set(schema["paths"]) == {"/api/conversations/", CONVERSATION, TURNS, POLL, CANCEL, RATING, TOKEN, HANDOFF,
                                      BACK, APPROVAL}
    assert set(schema["paths"]["/api/conversations/"]) == {"get", "post"}
    assert set(schema["paths"][TURNS]) == {"post"}


def test_the_schema_documents_every_answer(schema):
    assert statuses(schema, TURNS, "post") == {"200", "202", "400", "403", "404", "409", "413", "415", "422",
                                                    "429", "503"}
    assert statuses(schema, POLL, "get") == {"200", "304", "403", "404", "429", "503"}
    assert statuses(schema, CANCEL, "post") == {"202", "403", "404", "413", "415", "503"}
    assert statuses(schema, CONVERSATION, "get") == {"200", "403", "404", "503"}
    assert statuses(schema, "/api/conversations/", "post") == {"201", "400", "403", "413", "415", "429", "503"}
    assert statuses(schema, "/api/conversations/", "get") == {"200", "403", "503"}
    assert statuses(schema, RATING, "post") == {"200", "201", "400", "403", "404", "409", "413", "415", "429", "503"}
    assert statuses(schema, HANDOFF, "get") == {"200", "304", "403", "404", "429", "503"}
    assert statuses(schema, HANDOFF, "post") == {"202", "403", "404", "409", "413", "415", "429", "503"}
    assert statuses(schema, BACK, "post") == {"200", "403", "404", "409", "413", "415", "503"}
    assert statuses(schema, APPROVAL, "post") == {"200", "400", "403", "404", "409", "413", "415", "429", "503"}
    throttled = schema["paths"][TURNS]["post"]["responses"]["429"]
    assert "Retry-After" in throttled["headers"]


def test_the_schema_describes_request_and_response_bodies(schema):
    components = schema["components"]["schemas"]
    assert components["TurnCreate"]["required"] == ["content"]
    assert set(components["TurnState"]["properties"]) == {"id", "conversation", "status", "done", "messages",
                                                          "error", "version", "resuming", "approvals"}
    assert components["TurnSummary"]["properties"]["status"]["$ref"].endswith("StatusEnum")
    parameters = {p["name"]: p for p in schema["paths"][TURNS]["post"]["parameters"]}
    assert parameters["Idempotency-Key"]["in"] == "header"
    assert schema["components"]["securitySchemes"]["sessionCookie"] == {
        "type": "apiKey", "in": "cookie", "name": "sessionid",
        "description": schema["components"]["securitySchemes"]["sessionCookie"]["description"]}


def test_swagger_ui_is_served_only_in_debug(settings):
    client = make_client()
    settings.DEBUG = False
    assert client.get("/api/schema/ui/").status_code == 404
    settings.DEBUG = True
    response = client.get("/api/schema/ui/")
    assert response.status_code == 200 and b"swagger" in response.content.lower()


def test_every_answer_the_api_gives_is_documented(schema, conversations_settings, django_db_blocker):
    """Provoke each status each operation can answer (503s: the next test) and check the schema
    documents it for that operation; a fuzzer rarely reaches a 409, a 422 or a 429."""
    from tests.support.helpers import api_post, start_turn

    conversations_settings.update(MAX_TURNS_PER_CONVERSATION=2, CONVERSATION_RATE_PER_OWNER="3/hour")
    answers = {}

    def seen(path, method, response):
        answers.setdefault((path, method), set()).add(str(response.status_code))

    client = make_client()
    started = start_turn(client, "Hello")
    conversation, turn = started["conversation"], started["id"]
    turns = f"/api/conversations/{conversation}/turns/"
    poll = started["poll_url"]
    key = {"HTTP_IDEMPOTENCY_KEY": "k-1"}

    seen(TURNS, "post", api_post(client, turns, {"content": "Again"}))  # 409: still answering
    api_post(client, started["cancel_url"])
    seen(TURNS, "post", api_post(client, turns, {"content": "Two"}, **key))  # 202
    seen(TURNS, "post", api_post(client, turns, {"content": "Two"}, **key))  # 200: replayed
    seen(TURNS, "post", api_post(client, turns, {"content": "Other"}, **key))  # 422: key reused
    seen(TURNS, "post", api_post(client, turns, {"content": ""}))  # 400
    seen(TURNS, "post", client.post(turns, "content=x", content_type="application/x-www-form-urlencoded",
                                    HTTP_X_CSRFTOKEN=client.csrf))  # 415
    seen(TURNS, "post", client.post(turns, "{}", content_type="application/json"))  # 403: no CSRF token
    seen(TURNS, "post", api_post(client, turns, {"content": "x"}, CONTENT_LENGTH="999999"))  # 413
    seen(TURNS, "post", api_post(client, "/api/conversations/00000000-0000-4000-8000-000000000000/turns/",
                                 {"content": "x"}))  # 404
    from conversations.models import Turn
    Turn.objects.update(status="completed")
    seen(TURNS, "post", api_post(client, turns, {"content": "Three"}))  # 403: conversation full
    other = api_post(client, "/api/conversations/").json()["id"]
    conversations_settings.update(TURN_RATE_PER_OWNER="1/min")
    seen(TURNS, "post", api_post(client, f"/api/conversations/{other}/turns/", {"content": "x"}))  # 429

    first = client.get(poll)
    seen(POLL, "get", first)
    seen(POLL, "get", client.get(poll, HTTP_IF_NONE_MATCH=first["ETag"]))  # 304
    seen(POLL, "get", make_client().get(poll))  # 404
    seen(CANCEL, "post", api_post(client, started["cancel_url"]))  # 202
    seen(CANCEL, "post", client.post(started["cancel_url"], content_type="application/json"))  # 403
    seen(CANCEL, "post", client.post(started["cancel_url"], HTTP_X_CSRFTOKEN=client.csrf))  # 415: a form body
    seen(CANCEL, "post", api_post(make_client(), started["cancel_url"]))  # 404
    seen(CANCEL, "post", api_post(client, started["cancel_url"], CONTENT_LENGTH="999999"))  # 413
    seen(CONVERSATION, "get", client.get(f"/api/conversations/{conversation}/"))
    seen(CONVERSATION, "get", make_client().get(f"/api/conversations/{conversation}/"))
    for _ in range(3):
        seen("/api/conversations/", "post", api_post(client, "/api/conversations/"))  # 201, then 429
    seen("/api/conversations/", "post", client.post("/api/conversations/", content_type="application/json"))  # 403
    seen("/api/conversations/", "post", client.post("/api/conversations/", HTTP_X_CSRFTOKEN=client.csrf))  # 415
    seen("/api/conversations/", "post", api_post(client, "/api/conversations/", CONTENT_LENGTH="999999"))  # 413
    seen("/api/conversations/", "get", client.get("/api/conversations/"))

    rating = f"/api/conversations/{conversation}/turns/{turn}/rating/"
    conversations_settings.update(RATING_RATE_PER_OWNER="3/min", CONVERSATION_RATE_PER_OWNER="")
    seen("/api/conversations/", "post", api_post(client, "/api/conversations/", {"assistant": "nobody"}))  # 400
    seen(RATING, "post", api_post(client, rating, {"value": "meh"}))  # 400
    seen(RATING, "post", api_post(client, rating, {"value": "up"}))  # 201
    seen(RATING, "post", api_post(client, rating, {"value": "down"}))  # 200: changed
    seen(RATING, "post", client.post(rating, '{"value": "up"}', content_type="application/json"))  # 403
    seen(RATING, "post", client.post(rating, "value=up", content_type="application/x-www-form-urlencoded",
                                     HTTP_X_CSRFTOKEN=client.csrf))  # 415
    seen(RATING, "post", api_post(client, rating, {"value": "up"}, CONTENT_LENGTH="999999"))  # 413
    seen(RATING, "post", api_post(client, rating, {"value": "up"}))  # 429
    stranger = make_client()
    seen(RATING, "post", api_post(stranger, rating, {"value": "up"}))  # 404
    unfinished = start_turn(stranger, "Hello")
    seen(RATING, "post", api_post(stranger, f"/api/conversations/{unfinished['conversation']}/turns/"
                                            f"{unfinished['id']}/rating/", {"value": "up"}))  # 409

    for (path, method), given in answers.items():
        assert given <= statuses(schema, path, method), (method, path, given - statuses(schema, path, method))
    assert answers[(TURNS, "post")] == {"200", "202", "400", "403", "404", "409", "413", "415", "422", "429"}
    assert answers[("/api/conversations/", "post")] == {"201", "400", "403", "413", "415", "429"}
    assert answers[(RATING, "post")] == {"200", "201", "400", "403", "404", "409", "413", "415", "429"}
    assert answers[(CANCEL, "post")] == {"202", "403", "404", "413", "415"}


def test_the_refusal_of_anonymous_callers_under_login_required_is_documented(schema, conversations_settings):
    from tests.support.helpers import start_turn

    client = make_client()
    started = start_turn(client, "Hello")
    conversations_settings.update(LOGIN_REQUIRED=True)

    answers = {OPERATIONS[name]: response for name, response in call_every_endpoint(client, started).items()}

    assert set(answers) == {(path, method) for path in schema["paths"] for method in schema["paths"][path]}
    for (path, method), response in answers.items():
        assert response.status_code == 403, (method, path, response.status_code)
        assert "403" in statuses(schema, path, method), (method, path)
        assert "LOGIN_REQUIRED" in schema["paths"][path][method]["responses"]["403"]["description"], (method, path)


def test_the_answer_every_operation_gives_while_redis_is_down_is_documented(schema, settings):
    """Every operation, with the cache (sessions included) and the queue unreachable, answers a
    503 that its schema documents, with the error body the schema describes."""
    from tests.support.helpers import NOWHERE, start_turn

    client = make_client()
    started = start_turn(client, "Hello")
    settings.CACHES = {alias: {**conf, "LOCATION": NOWHERE} for alias, conf in settings.CACHES.items()}
    settings.RQ_QUEUES = {name: {**conf, "URL": NOWHERE} for name, conf in settings.RQ_QUEUES.items()}

    answers = {OPERATIONS[name]: response for name, response in call_every_endpoint(client, started).items()}

    assert set(answers) == {(path, method) for path in schema["paths"] for method in schema["paths"][path]}
    for (path, method), response in answers.items():
        assert response.status_code == 503, (method, path, response.status_code)
        assert "503" in statuses(schema, path, method), (method, path)
        documented = schema["paths"][path][method]["responses"]["503"]["content"]["application/json"]["schema"]
        assert documented == {"$ref": "#/components/schemas/Error"}
        assert set(response.json()) == set(schema["components"]["schemas"]["Error"]["properties"])


def test_the_session_cookie_is_optional_unless_only_logged_in_users_may_chat(conversations_settings):
    def security(path, method):
        return json.loads(make_client().get("/api/schema/?format=json").content)["paths"][path][method].get("security")

    # A visitor token (an embedded widget's), or the session cookie, which a first visit has not yet.
    assert security("/api/conversations/", "post") == [{"visitorToken": []}, {"sessionCookie": []}, {}]
    assert security(TOKEN, "post") == security(POLL, "get")  # asking for a token needs neither, as a poll
    conversations_settings.update(LOGIN_REQUIRED=True)
    assert security("/api/conversations/", "post") == [{"visitorToken": []}, {"sessionCookie": []}]
    assert security(TURNS, "post") == [{"visitorToken": []}, {"sessionCookie": []}]
