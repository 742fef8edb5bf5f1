"""A scripted conversations API inside the browser (Playwright route interception), for the widget
states a real turn passes through too quickly, or not yet at all, to look at: a message still
being posted, a queued turn, a growing (streamed) answer, each ending.

The page itself still comes from the live server (its template tag, its translations); only the
API calls are answered here, from what the test puts in ``api.state``. Every answer is what the
real API sends (docs/api.md): the poll answers ``304`` for the ETag of the state it last served.
"""

import json
import re

CONVERSATION = "7d1d7c0e-0000-4000-8000-000000000001"
TURN = 41
ENDINGS = {"completed", "incomplete", "failed", "cancelled"}
QUESTION = "What time is it in Tokyo?"
USER = {"id": 1, "role": "user", "content": QUESTION}


def state(status, *messages, version, error=None):
    """A turn's state as the poll view serves it."""
    return {"id": TURN, "conversation": CONVERSATION, "status": status, "done": status in ENDINGS,
            "messages": [USER, *messages], "error": error, "version": version}


def streaming(text):
    """The growing assistant message of a streamed model call (issue 15's contract)."""
    return {"id": None, "role": "assistant", "content": text, "streaming": True}


def assistant(text, id=2, tool_calls=None):
    message = {"id": id, "role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def tool_call(call_id="call_1", name="current_time", **arguments):
    return {"id": call_id, "name": name, "arguments": arguments}


def tool_result(content, call_id="call_1", name="current_time", id=3, is_error=False):
    return {"id": id, "role": "tool", "content": content, "tool_call_id": call_id, "name": name,
            "is_error": is_error}


class ScriptedApi:
    """Answers the widget's API calls on ``page`` from this object's attributes.

    ``state``: what the poll serves (None: the queued state). ``refusal``: ``(status, body)`` for
    the next turn POST instead of a 202. ``hold``: keep turn POSTs unanswered (``release()``).
    ``transcript``/``active``/``rated``: what ``GET /api/conversations/<id>/`` serves after a reload;
    ``ratings``: the rating POSTs received.
    """

    def __init__(self, page):
        self.state = None
        self.refusal = None
        self.hold = False
        self.held = []
        self.transcript = []
        self.active = None
        self.cancels = 0
        self.ratings = []  # the bodies of the rating POSTs; ``rated`` is what a reload is told
        self.rated = {}
        self.polls = 0
        page.route(re.compile(r"/api/conversations/"), self._answer)

    def _answer(self, route):
        request = route.request
        path = re.sub(r"^https?://[^/]+", "", request.url).split("?")[0]
        base = "/api/conversations/"
        if request.method == "POST" and path == base:
            return self._json(route, 201, {"id": CONVERSATION, "created_at": "2025-01-01T00:00:00Z"})
        if request.method == "GET" and path == f"{base}{CONVERSATION}/":
            return self._json(route, 200, {"id": CONVERSATION, "messages": self.transcript,
                                           "active_turn": self.active, "ratings": self.rated,
                                           # Where each turn is rated, as the real API hands it out.
                                           "rating_urls": {str(m["turn"]): f"{base}{CONVERSATION}/turns/{m['turn']}/rating/"
                                                           for m in self.transcript}})
        if request.method == "POST" and path == f"{base}{CONVERSATION}/turns/{TURN}/rating/":
            body = json.loads(request.post_data or "{}")
            self.ratings.append(body)
            return self._json(route, 201, {"turn": str(TURN), "value": body.get("value"),
                                           "comment": body.get("comment", ""), "rated_at": "2025-01-01T00:00:05Z"})
        if request.method == "POST" and path == f"{base}{CONVERSATION}/turns/":
            if self.hold:
                self.held.append(route)
                return None
            if self.refusal:
                status, body = self.refusal
                self.refusal = None
                return self._json(route, status, body)
            return self._json(route, 202, self.summary())
        if request.method == "GET" and path == f"{base}{CONVERSATION}/turns/{TURN}/":
            self.polls += 1
            current = self.state or state("queued", version=1)
            etag = f'"v{current["version"]}"'
            if request.headers.get("if-none-match") == etag:
                return route.fulfill(status=304, headers={"ETag": etag})
            return self._json(route, 200, current, {"ETag": etag})
        if request.method == "POST" and path == f"{base}{CONVERSATION}/turns/{TURN}/cancel/":
            self.cancels += 1
            return self._json(route, 202, {"detail": "Stopping."})
        return self._json(route, 404, {"detail": "Not found."})

    @staticmethod
    def summary():
        turns = f"/api/conversations/{CONVERSATION}/turns/{TURN}/"
        return {"id": TURN, "conversation": CONVERSATION, "status": "queued", "done": False,
                "poll_url": turns, "cancel_url": turns + "cancel/", "rating_url": turns + "rating/"}

    def release(self):
        """Answer the held turn POSTs with a 202."""
        held, self.held, self.hold = self.held, [], False
        for route in held:
            self._json(route, 202, self.summary())

    @staticmethod
    def _json(route, status, body, headers=None):
        route.fulfill(status=status, content_type="application/json", body=json.dumps(body), headers=headers)
