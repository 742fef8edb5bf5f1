"""The offline demo model: no key, no network, deterministic.

It recognises questions its tools can serve (the demo site's ``current_time`` and
``search_faq``), asks for those tools, sometimes several at once, and answers from their
results; otherwise it explains what it is. It pauses ``DEMO_DELAY`` seconds per reply so the
widget shows each step land.
"""

import re
import time

from ..types import ModelReply, ToolCall, Usage
from .base import BaseProvider

CITIES = ("london", "paris", "madrid", "new york", "tokyo", "sydney", "berlin", "buenos aires", "mexico city",
          "los angeles", "san francisco", "chicago", "toronto", "sao paulo", "mumbai", "singapore", "utc")
TIME_WORDS = re.compile(r"\b(time|clock|hour|hora)\b", re.I)
FAQ_WORDS = re.compile(r"\b(how|what|why|can|does|do|refund|return|shipping|ship|deliver|price|pricing|cost|"
                       r"account|password|support|contact|open|hours|widget|install|deadline|timeout)\b", re.I)


class DemoProvider(BaseProvider):
    name = "demo"
    default_model = "demo"
    sleep = staticmethod(time.sleep)

    def complete(self, messages, tools):
        delay = float(self.config.get("DEMO_DELAY", 0))
        if delay and self.budget is not None:
            delay = min(delay, max(0.0, self.budget.remaining() - 1))
        if delay:
            self.sleep(delay)
        available = {t.name for t in tools}
        last_user = next((m for m in reversed(messages) if m.role == "user"), None)
        question = last_user.content if last_user else ""
        results = []
        for message in reversed(messages):
            if message.role != "tool":
                break
            results.insert(0, message)
        usage = Usage(input_tokens=sum(len(m.content) for m in messages) // 4, output_tokens=0)
        if results:
            reply = self.answer_from(results)
        else:
            calls = self.plan(question, available)
            if calls:
                return ModelReply(text="", tool_calls=calls, finish="tool_calls", usage=usage)
            reply = self.about_me(question, available)
        usage.output_tokens = len(reply) // 4
        return ModelReply(text=reply, finish="stop", usage=usage)

    def plan(self, question, available):
        calls = []
        lowered = question.lower()
        if "current_time" in available and TIME_WORDS.search(question):
            cities = [c for c in CITIES if c in lowered] or ["UTC"]
            for city in cities[:3]:
                calls.append(ToolCall(id=f"call_{len(calls) + 1}", name="current_time",
                                      arguments={"city": city.title() if city != "utc" else "UTC"}))
        if "search_faq" in available and FAQ_WORDS.search(question) and not (calls and not self._faq_part(question)):
            calls.append(ToolCall(id=f"call_{len(calls) + 1}", name="search_faq",
                                  arguments={"query": self._faq_part(question) or question[:200]}))
        return calls

    @staticmethod
    def _faq_part(question):
        """The part of a question that is not about time, for a question that asks two things."""
        parts = re.split(r"\band\b|[?;]", question, flags=re.I)
        rest = [p.strip() for p in parts if p.strip() and not TIME_WORDS.search(p) and FAQ_WORDS.search(p)]
        return " ".join(rest)

    @staticmethod
    def answer_from(results):
        lines = []
        for result in results:
            if result.is_error:
                lines.append(f"I tried {result.name or 'a tool'}, but it failed: {result.content}")
            elif result.name == "current_time":
                lines.append(f"The time is {result.content}.")
            else:
                lines.append(result.content)
        return "\n\n".join(lines) if lines else "I have nothing to add."

    @staticmethod
    def about_me(question, available):
        tools = ", ".join(sorted(available)) or "no tools"
        if not question.strip():
            return "Hello! Ask me something."
        return (
            "I am the demo model of this site: I run offline, with no API key. "
            f"I can use these tools: {tools}. Try \"What time is it in Tokyo?\" or "
            "\"How do refunds work?\", or both in one message."
        )
