"""Fuzz the whole API from its own OpenAPI schema (schemathesis) against a live server with a
real RQ worker: no 5xx, and every answer conforms to the schema (status code, content type,
headers, body). Bounded: at most MAX_EXAMPLES generated requests per operation."""

import itertools

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig
from schemathesis.generation import GenerationMode

pytestmark = [pytest.mark.slow]

MAX_EXAMPLES = 30

# Valid requests may still be refused for the state they meet, as documented: 409 (a turn is
# running), 403 (conversation full; a page origin not allowed a widget token), 422 (an
# Idempotency-Key reused for another message), 429, 401 (a generated signed identity is no
# host site's signature).
CONFIG = SchemathesisConfig.from_dict({
    "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "3xx", 401, 403, 404, 409, 422, 429]}},
})


# Every check that judges one request and its answer on its own, named so that none is skipped by a
# default: a status the schema does not document fails `status_code_conformance`. (The stateful
# ones — ignored_auth, use_after_free, ensure_resource_availability, object_level_authorization —
# need OpenAPI links or credentials the fuzzer can drop; ownership is tested in test_ownership.py.)
STATELESS_CHECKS = ["not_a_server_error", "status_code_conformance", "content_type_conformance",
                    "response_headers_conformance", "response_schema_conformance", "negative_data_rejection",
                    "positive_data_acceptance", "missing_required_header", "unsupported_method",
                    "allow_header_conformance"]


def stateless_checks():
    load_all_checks()
    checks = {check.__name__: check for check in CHECKS.get_all()}
    return [checks[name] for name in STATELESS_CHECKS]


class Visitor:
    """A browser-like session on the live server: session and csrftoken cookies, the X-CSRFToken
    header on every request, and a conversation and a turn of its own, so that about half of
    the generated requests hit resources it owns (the rest get 404 for random ids)."""

    def __init__(self, base_url):
        self.base_url = base_url
        self.session = requests.Session()
        self.session.get(f"{base_url}/").raise_for_status()
        self.headers = {"X-CSRFToken": self.session.cookies["csrftoken"], "Referer": f"{base_url}/"}
        self.conversation = self.post("/api/conversations/").json()["id"]
        self.turn = self.post(f"/api/conversations/{self.conversation}/turns/", {"content": "Hello"}).json()["id"]
        self._counter = itertools.count()
        self.seen = set()  # (operation, status code) pairs answered

    def post(self, path, data=None):
        response = self.session.post(f"{self.base_url}{path}", json=data or {}, headers=self.headers, timeout=10)
        response.raise_for_status()
        return response

    def aim(self, case, mode):
        """Point every other case at this visitor's own conversation and turn. A valid request
        names an assistant that exists: the schema does not list them (it is public, and some
        are for staff only), so a generated slug is replaced by "" (the site's default)."""
        body = case.body if isinstance(case.body, dict) else {}
        if mode == GenerationMode.POSITIVE and isinstance(body.get("assistant"), str):
            body["assistant"] = ""
        if next(self._counter) % 2:
            return
        if "conversation_id" in (case.path_parameters or {}):
            case.path_parameters["conversation_id"] = self.conversation
        if "turn_id" in (case.path_parameters or {}):
            case.path_parameters["turn_id"] = self.turn


@pytest.fixture
def visitor(live_server, worker_process, conversations_settings, settings):
    # The live server speaks plain HTTP; requests would not send Secure cookies over it.
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = False
    # The fuzzer sends far more than a visitor would: throttles would answer most requests 429.
    conversations_settings.update(TURN_RATE_PER_OWNER="10000/min", TURN_RATE_PER_IP="10000/min", DEMO_DELAY=0.0)
    worker_process(1)
    return Visitor(live_server.url)


def fuzz(operation, mode, visitor):
    """Send up to MAX_EXAMPLES generated requests to ``operation``; every response must pass all checks."""

    checks = stateless_checks()

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate], database=None)
    def run(case):
        visitor.aim(case, mode)
        response = case.call_and_validate(base_url=visitor.base_url, session=visitor.session,
                                          headers=visitor.headers, checks=checks)
        visitor.seen.add((operation.label, response.status_code))

    run()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_api_survives_fuzzing_and_matches_its_schema(mode, visitor):
    schema = schemathesis.openapi.from_url(f"{visitor.base_url}/api/schema/?format=json", config=CONFIG)
    # Deleting a conversation last: it erases the visitor's own conversation the others aim at.
    operations = sorted((result.ok() for result in schema.get_all_operations()),
                        key=lambda operation: operation.method.upper() == "DELETE")
    assert len(operations) == 13  # the widget-token, handoff, approval and delete endpoints are fuzzed like the rest
    for operation in operations:
        if mode == GenerationMode.NEGATIVE and not (any(operation.iter_parameters()) or operation.body):
            continue  # nothing in the request to get wrong (e.g. GET /api/conversations/)
        fuzz(operation, mode, visitor)
    if mode == GenerationMode.POSITIVE:
        # The fuzzer reached real resources, not only 404s for random ids.
        turns, poll = "POST /api/conversations/{conversation_id}/turns/", \
            "GET /api/conversations/{conversation_id}/turns/{turn_id}/"
        assert {(turns, 202), (poll, 200), ("GET /api/conversations/{conversation_id}/", 200)} <= visitor.seen


def test_deeply_nested_bodies_get_a_4xx_on_every_operation(visitor):
    """Python's JSON parser recurses per bracket; a body nested past the stack is a 400 with a
    sentence wherever a body is read, and never a 5xx anywhere (over the live server, as sent)."""
    schema = schemathesis.openapi.from_url(f"{visitor.base_url}/api/schema/?format=json", config=CONFIG)
    posts = [result.ok() for result in schema.get_all_operations() if result.ok().method.upper() == "POST"]
    bodies = ["[" * 30000 + "]" * 30000, '{"content": ' + "[" * 30000 + "]" * 30000 + "}"]
    for operation, body in itertools.product(posts, bodies):
        path = operation.path.format(conversation_id=visitor.conversation, turn_id=visitor.turn)
        response = visitor.session.post(f"{visitor.base_url}{path}", data=body, timeout=10,
                                        headers={**visitor.headers, "Content-Type": "application/json"})
        assert response.status_code < 500, (operation.label, response.status_code)
        if operation.body:
            assert response.status_code == 400, operation.label
            assert response.json() == {"detail": "The request body is nested too deeply to be read."}
