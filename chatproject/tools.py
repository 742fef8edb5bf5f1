"""The demo site's tools: listed in ``CONVERSATIONS["TOOLS"]``."""

import json
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from conversations.knowledge.text import STOP_WORDS
from conversations.tools import ToolError, tool

ZONES = {
    "utc": "UTC", "london": "Europe/London", "paris": "Europe/Paris", "madrid": "Europe/Madrid",
    "berlin": "Europe/Berlin", "new york": "America/New_York", "chicago": "America/Chicago",
    "los angeles": "America/Los_Angeles", "san francisco": "America/Los_Angeles", "toronto": "America/Toronto",
    "mexico city": "America/Mexico_City", "buenos aires": "America/Argentina/Buenos_Aires",
    "sao paulo": "America/Sao_Paulo", "tokyo": "Asia/Tokyo", "singapore": "Asia/Singapore",
    "mumbai": "Asia/Kolkata", "sydney": "Australia/Sydney",
}


@tool(idempotent=True)  # read-only
def current_time(city: str) -> str:
    """The current local time in a city (e.g. "Tokyo", "New York") or "UTC"."""
    key = city.strip().lower()
    zone = ZONES.get(key)
    if zone is None:
        known = sorted("UTC" if name == "utc" else name.title() for name in ZONES)
        raise ToolError(f"unknown city {city!r}; known: {', '.join(known)}")
    try:
        now = datetime.now(ZoneInfo(zone))
    except ZoneInfoNotFoundError:
        raise ValueError(f"no time zone data for {zone}") from None
    return f"{now:%H:%M} on {now:%A %d %B} in {'UTC' if key == 'utc' else key.title()}"


# Words that say nothing of what a question is about ("when", "does", "my"): an entry that shares
# only those with a question does not answer it (the app's own list, used by its site search).
_STOP_WORDS = set().union(*STOP_WORDS.values())


def _words(text):
    return {w for w in re.findall(r"[a-z]{3,}", text.lower())} - _STOP_WORDS


@lru_cache(maxsize=1)
def _faq():
    """The FAQ entries, each with the set of words a query is matched against."""
    entries = json.loads((Path(__file__).with_name("faq.json")).read_text(encoding="utf-8"))
    return [(_words(e["question"] + " " + " ".join(e.get("keywords", []))), e) for e in entries]


@tool(idempotent=True)  # read-only
def search_faq(query: str, limit: int = 2) -> str:
    """Search the site's frequently asked questions; returns the best matching answers."""
    wanted = _words(query)
    scored = []
    for words, entry in _faq():
        score = len(wanted & words)
        if score:
            scored.append((score, entry))
    scored.sort(key=lambda pair: -pair[0])
    if not scored:
        return "No FAQ entry matches that question."
    return "\n\n".join(f"{e['question']}\n{e['answer']}" for _, e in scored[: max(1, min(limit, 5))])


# Where the demo sends mail for a visitor who is not signed in (its mail only reaches the console).
DEMO_ADDRESS = "visitor@example.com"


def _email_summary(arguments):
    text = " ".join(str(arguments.get("text", "")).split())
    return f"Send you an email with this answer: “{text[:200]}{'…' if len(text) > 200 else ''}”"


@tool(approval=True, summary=_email_summary)
def email_answer(context, text: str) -> str:
    """Email an answer to the visitor, when they ask ("email me this answer"): ``text`` is the answer.
    It goes to the signed-in visitor's own address (the demo's placeholder for anyone else), never
    to an address the model chooses, and only once the visitor approves it."""
    from django.core.mail import send_mail

    user = context.user
    address = (getattr(user, "email", "") if user is not None else "") or DEMO_ADDRESS
    send_mail("Your answer from the assistant", text[:5000], None, [address])
    return f"Sent the answer to {address}."
