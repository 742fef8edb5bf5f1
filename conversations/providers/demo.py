"""The offline demo model: no key, no network, deterministic.

It recognises questions its tools can serve (the demo site's ``current_time`` and
``search_faq``, and the built-in ``search_site``: the site's pages first, the FAQ when they have
nothing, once per turn), asks for those tools, several at once when a question asks several
things, and answers from their results, errors included, quoting the best page ``search_site``
found with its link, or saying it could not find that on this site; otherwise it says what it is and what it can
do — naming only the questions its tools can answer, and saying so when the site gives it none.
It takes ``DEMO_DELAY`` seconds per reply (never past the turn's budget) so the widget shows
each step land, and streams its answers word by word over that time, as a real model would
(``STREAM``). Stop ends it at once. Each reply is recorded as one provider call attempt, as
the HTTP providers' attempts are, so the admin's timeline shows where the turn's time went.
"""

import json
import re
import time

from django.utils.translation import gettext as _

from ..infra.http import CallCancelled
from ..infra.watchdog import stopped
from ..core.types import Finish, ModelReply, Outcome, ToolCall, Usage, record_call
from .base import BaseProvider

CITIES = ("london", "paris", "madrid", "new york", "tokyo", "sydney", "berlin", "buenos aires", "mexico city",
          "los angeles", "san francisco", "chicago", "toronto", "sao paulo", "mumbai", "singapore", "utc")
TIME_WORDS = re.compile(r"\b(time|clock|hour|hora)\b", re.I)
# "in Atlantis", "in New York": a place the visitor named, known to the demo or not.
PLACE = re.compile(r"\bin ([A-Z][\w'-]*(?: [A-Z][\w'-]*)*)")
FAQ_WORDS = re.compile(r"\b(how|what|why|can|does|do|refund|refunds|return|shipping|ship|deliver|delivery|price|"
                       r"pricing|cost|account|password|support|contact|open|hours|widget|install|deadline|"
                       r"timeout)\b", re.I)
# "Email me this answer": the demo site's email_answer tool, which waits for the visitor's approval.
EMAIL_ME = re.compile(r"\b(e-?mail|mail) (me|it to me|this|that|it)\b", re.I)
GREETING = re.compile(r"^\s*(hi|hello|hey|hola|good (morning|afternoon|evening))\b", re.I)
ABOUT_ME = re.compile(r"\b(who are you|what are you|what can you do|about you|yourself|help me|are you (a|an) )",
                      re.I)
MAX_CITIES = 3
# A question each demo tool answers, offered only when the site has that tool.
EXAMPLES = (("current_time", '"What time is it in Tokyo?"'), ("search_faq", '"How do refunds work?"'))


class DemoProvider(BaseProvider):
    """The default provider: answers every turn offline, so the demo runs with no key."""

    name = "demo"
    default_model = "demo"
    sleep = staticmethod(time.sleep)

    @classmethod
    def check_model(cls, model):
        """The demo model is the only one here."""
        if model in ("", cls.default_model):
            return None
        return _("the demo provider has no model “%(model)s”: leave the model empty.") % {"model": model}

    def streams(self, on_text):
        return on_text is not None and bool(self.config["STREAM"])

    def complete(self, messages, tools, on_text=None):
        """Reply offline (streamed to ``on_text`` when ``streams()``), and record the reply as one
        call attempt with the recorder the turn's ``BudgetedHTTP`` holds, when there is one."""
        reply = self.reply(messages, tools)
        if self.budget is None or self.http is None:  # outside a turn: nothing to record
            self.deliver(reply, on_text)
            return reply
        started_offset, remaining = self.budget.elapsed(), self.budget.remaining()
        started, outcome = time.monotonic(), Outcome.OK
        try:
            self.deliver(reply, on_text)
        except CallCancelled:
            outcome = Outcome.CANCELLED
            raise
        finally:
            record_call(self.http.recorder, "model", self.http.name or self.model, outcome,
                        started_offset=started_offset, remaining_before=remaining,
                        timeout=self.budget.call_timeout(self.config["CALL_TIMEOUT"]),
                        duration=time.monotonic() - started)
        return reply

    def deliver(self, reply, on_text):
        """Take ``DEMO_DELAY`` (never past the budget), handing the answer's words to ``on_text``
        one by one over its second half when streaming (the first half is the time a real model
        takes to its first word); ``CallCancelled`` when the turn is stopped."""
        delay = float(self.config["DEMO_DELAY"])
        if delay and self.budget is not None:
            delay = min(delay, max(0.0, self.budget.remaining() - 1))
        pieces = re.findall(r"\S+\s*|\s+", reply.text) if reply.text and self.streams(on_text) else []
        steps = max(1, len(pieces))
        sent = ""
        for number in range(steps):
            if self.http is not None and stopped(self.http.cancelled):
                stop = CallCancelled()
                stop.reply = ModelReply(text=sent, finish=Finish.CUT) if sent else None
                raise stop
            if delay:
                self.sleep(delay / 2 / steps + (delay / 2 if number == 0 else 0))
            if pieces:
                sent += pieces[number]
                on_text(pieces[number])

    def reply(self, messages, tools):
        """The ``ModelReply`` to ``messages``: tool calls, an answer from tool results, or an answer about itself."""
        available = {t.name for t in tools}
        last_user = next((m for m in reversed(messages) if m.role == "user"), None)
        question = last_user.content if last_user else ""
        results = []
        for message in reversed(messages):
            if message.role != "tool":
                break
            results.insert(0, message)
        usage = Usage(input_tokens=sum(len(m.content) for m in messages) // 4, output_tokens=0)
        step = sum(1 for m in messages if m.role == "assistant") + 1
        if results:
            this_turn = self.this_turn(messages)
            more = self.search_further(question, this_turn, available, step)
            if more:
                return ModelReply(text="", tool_calls=more, finish=Finish.TOOL_CALLS, usage=usage)
            reply = self.answer_from([m for m in this_turn if m.role == "tool"])
        else:
            calls = self.plan(question, available, step, messages)
            if calls:
                usage.output_tokens = sum(len(str(c.arguments)) for c in calls) // 4
                return ModelReply(text="", tool_calls=calls, finish=Finish.TOOL_CALLS, usage=usage)
            reply = self.about_me(question, available)
        usage.output_tokens = len(reply) // 4
        return ModelReply(text=reply, finish=Finish.STOP, usage=usage)

    @staticmethod
    def last_question(messages):
        """The index of the visitor's last message in ``messages``, or -1."""
        return max((number for number, m in enumerate(messages) if m.role == "user"), default=-1)

    @classmethod
    def last_answer(cls, messages):
        """The text of the last assistant answer before the visitor's last message, or ""."""
        last = cls.last_question(messages)
        return next((m.content for m in reversed(messages[:max(last, 0)]) if m.role == "assistant" and m.content), "")

    @classmethod
    def this_turn(cls, messages):
        """The messages after the visitor's last one: what this turn has done so far."""
        return messages[cls.last_question(messages) + 1:]

    def plan(self, question, available, step=1, messages=()):
        """The tool calls a question asks for (possibly several), or [] to answer directly;
        ``messages``: the conversation so far ("email me this answer" sends its last answer)."""
        if ABOUT_ME.search(question) or (GREETING.search(question) and len(question) < 40):
            return []
        calls = []

        def call(name, **arguments):
            calls.append(ToolCall(id=f"demo_{step}_{len(calls) + 1}", name=name, arguments=arguments))
        if "email_answer" in available and EMAIL_ME.search(question):
            answer = self.last_answer(messages)
            if answer:
                call("email_answer", text=answer[:2000])
                return calls

        if "current_time" in available and TIME_WORDS.search(question):
            for city in self.places(question)[:MAX_CITIES]:
                call("current_time", city=city)
        faq_part = self._faq_part(question)
        asks = FAQ_WORDS.search(question) or "?" in question
        # The site's pages first: their search leaves out what matches too little, where one
        # word in common ("long", "when") is enough for an FAQ entry to come back.
        if "search_site" in available and asks and (faq_part or not calls):
            call("search_site", query=(faq_part or question)[:200])
        elif "search_faq" in available and FAQ_WORDS.search(question) and (faq_part or not calls):
            call("search_faq", query=(faq_part or question)[:200])
        return calls

    def search_further(self, question, this_turn, available, step):
        """The FAQ is searched when the site's pages had nothing for this turn's question (once
        per turn: ``this_turn`` holds only the messages since the visitor's): ``[ToolCall]`` or []."""
        asked = {m.name for m in this_turn if m.role == "tool"}
        if "search_faq" not in available or "search_faq" in asked or "search_site" not in asked:
            return []
        if any(m.role == "tool" and m.name == "search_site" and self.found_on_site(m.content) for m in this_turn):
            return []
        query = (self._faq_part(question) or question)[:200]
        return [ToolCall(id=f"demo_{step}_1", name="search_faq", arguments={"query": query})]

    @staticmethod
    def found_on_site(content):
        """The results of a ``search_site`` result (none when it is not one)."""
        try:
            return json.loads(content).get("results") or []
        except (ValueError, AttributeError):
            return []

    @staticmethod
    def places(question):
        """The cities a question names, in its order; a capitalised unknown place too (so the tool
        can say it does not know it); UTC when it names none."""
        lowered = question.lower()
        found = sorted((lowered.index(c), c) for c in CITIES if re.search(rf"\b{c}\b", lowered))
        names = [("UTC" if c == "utc" else c.title()) for _, c in found]
        for place in PLACE.findall(question):
            if place.lower() not in CITIES and not any(place.lower().startswith(c) for c in CITIES):
                names.append(place)
        return names or ["UTC"]

    @staticmethod
    def _faq_part(question):
        """The part of a question that is not about time, for a question that asks two things."""
        parts = re.split(r"\band\b|[?;]", question, flags=re.I)
        rest = [p.strip(" ,.") for p in parts if p.strip() and not TIME_WORDS.search(p) and FAQ_WORDS.search(p)]
        return " ".join(rest)

    @staticmethod
    def answer_from(results):
        """The final answer, written from the tool results (errors included) of the last step."""
        lines = []
        for result in results:
            if result.name == "email_answer":  # declined (or failed): it says so in its own words
                lines.append("Done: " + result.content if not result.is_error and result.content.startswith("Sent")
                             else "All right: I did not send the email.")
            elif result.is_error:
                reason = re.sub(r"^Error: (\w+Error: )?", "", result.content)
                lines.append(f"I asked the {result.name or 'tool'} tool, but it could not help: {reason}")
            elif result.name == "current_time":
                lines.append(f"It is {result.content}.")
            elif result.name == "search_site":
                faq_answered = any(r.name == "search_faq" and not r.is_error and not r.content.startswith("No FAQ entry")
                                   for r in results)
                if DemoProvider.found_on_site(result.content) or not faq_answered:
                    lines.append(DemoProvider.quote_best(result.content))
            elif result.name == "search_faq":
                if result.content.startswith("No FAQ entry") and any(r.name == "search_site" for r in results):
                    continue
                if result.content.startswith("No FAQ entry"):
                    lines.append("I searched the FAQ but found nothing on that. Try asking about refunds, shipping, "
                                 "prices, passwords, support or the chat widget.")
                else:
                    lines.append(f"Here is what the FAQ says:\n\n{result.content}")
            else:
                lines.append(f"{result.name} says: {result.content}")
        return "\n\n".join(lines) if lines else "I have nothing to add."

    @staticmethod
    def quote_best(content):
        """The best passage ``search_site`` found, quoted with its title and link."""
        found = DemoProvider.found_on_site(content)
        if not found:
            return _("I could not find that on this site.")
        best = found[0]
        text = best.get("text", "")
        text = text if len(text) <= 400 else text[:400].rsplit(" ", 1)[0] + "…"
        return f"From “{best.get('title', '')}” ({best.get('url', '')}):\n\n“{text}”"

    @staticmethod
    def about_me(question, available):
        """The answer when no tool fits: a greeting, or what the demo model is and can do — with
        examples only of questions its tools can answer, and none when the site gives it no tools."""
        examples = [example for name, example in EXAMPLES if name in available]
        if not examples:
            what = ("This site gives me no tools, so I cannot look anything up: I can only greet you and say what I "
                    "am. Set CONVERSATIONS_PROVIDER to use a real model.")
            if not question.strip() or GREETING.search(question):
                return f"Hello! I am the demo assistant of this site, an offline stand-in for a real model. {what}"
            if ABOUT_ME.search(question):
                return f"I am the demo model of this site: I run offline, with no API key. {what}"
            return f"I am only the demo model, so I cannot answer that myself. {what}"
        tools = ", ".join(sorted(available))
        both = ", or both in one message" if len(examples) > 1 else ""
        examples = f"Try {' or '.join(examples)}{both}."
        if not question.strip() or GREETING.search(question):
            return f"Hello! I am the demo assistant of this site. {examples}"
        if ABOUT_ME.search(question):
            return ("I am the demo model of this site: I run offline, with no API key, and answer by calling the "
                    f"site's tools ({tools}). {examples} Set CONVERSATIONS_PROVIDER to use a real model.")
        return f"I am only the demo model, so I cannot answer that myself: I can use these tools: {tools}. {examples}"
