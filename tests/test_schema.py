"""The OpenAPI schema at /api/schema/ describes every endpoint and every answer it can give."""

import json

import pytest
from drf_spectacular.validation import validate_schema

from tests.helpers import make_client

pytestmark = pytest.mark.django_db

CONVERSATION = "/api/conversations/{conversation_id}/"
TURNS = "/api/conversations/{conversation_id}/turns/"
POLL = "/api/conversations/{conversation_id}/turns/{turn_id}/"
CANCEL = "/api/conversations/{conversation_id}/turns/{turn_id}/cancel/"


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
    assert set(schema["paths"]) == {"/api/conversations/", CONVERSATION, TURNS, POLL, CANCEL}
    assert set(schema["paths"]["/api/conversations/"]) == {"get", "post"}
    assert set(schema["paths"][TURNS]) == {"post"}


def test_the_schema_documents_every_answer(schema):
    assert statuses(schema, TURNS, "post") == {"200", "202", "400", "403", "404", "409", "413", "415", "422",
                                                    "429", "503"}
    assert statuses(schema, POLL, "get") == {"200", "304", "404"}
    assert statuses(schema, CANCEL, "post") == {"202", "403", "404", "413", "503"}
    assert statuses(schema, CONVERSATION, "get") == {"200", "404"}
    assert statuses(schema, "/api/conversations/", "post") == {"201", "403", "413"}
    throttled = schema["paths"][TURNS]["post"]["responses"]["429"]
    assert "Retry-After" in throttled["headers"]


def test_the_schema_describes_request_and_response_bodies(schema):
    components = schema["components"]["schemas"]
    assert components["TurnCreate"]["required"] == ["content"]
    assert set(components["TurnState"]["properties"]) == {"id", "conversation", "status", "done", "messages",
                                                          "error", "version"}
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
