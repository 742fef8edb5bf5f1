"""Tools the model may call.

``@tool`` turns a plain function into a ``Tool``: its name from the function, its description
from the docstring, its JSON schema from the type hints. The first parameter may be named
``context`` to receive a ``ToolContext`` (the conversation, its owner, the time left); it is
not part of the schema. Tools are listed by dotted path in ``CONVERSATIONS["TOOLS"]``.

A tool never crashes a turn: unknown names, invalid arguments, exceptions and time-outs all
become error results that go back to the model. What an exception says stays with the
operator (logs, admin): the model and the visitor read that the tool failed, unless the tool
raised ``ToolError``, whose message is written for them.
"""

import hashlib
import inspect
import json
import logging
import re
import threading
import types
import typing
from dataclasses import dataclass

from django.db import connections
from django.utils.module_loading import import_string

from .core.types import Outcome, ToolResult
from .redaction import hide_quoted, quoting, texts_in

logger = logging.getLogger("conversations.tools")

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclass
class ToolContext:
    """What a tool may know about the turn that runs it.

    ``user`` is the owning user (or None for an anonymous visitor, who is identified by
    ``owner_token``); scope any data a tool reads to them. ``remaining()`` is the seconds this
    tool may still take.
    """

    conversation: object = None
    turn: object = None
    user: object = None
    owner_token: str = ""
    deadline: float = 0.0  # on the budget's clock
    clock: typing.Callable = None

    def remaining(self):
        """Seconds this tool may still take (its limit counts down while it runs)."""
        return max(0.0, self.deadline - self.clock()) if self.clock else 0.0

    @property
    def owner(self):
        """The conversation's owner: the user if signed in, else the anonymous visitor's token."""
        return self.user if self.user is not None else self.owner_token


@dataclass
class Tool:
    """A function the model can call. ``parameters`` is a JSON schema object."""

    name: str
    description: str
    parameters: dict
    function: typing.Callable
    takes_context: bool = False
    timeout: float | None = None
    # Whether running it twice for one call does no harm (it only reads, or its effect is the
    # same): a tool a stopped worker interrupted is run again only then.
    idempotent: bool = False
    # Whether a person must approve a call before it runs: True, or a callable
    # ``(arguments, visitor) -> bool`` deciding per call (``needs_approval``).
    approval: object = False
    # Who may approve it: "visitor" (the conversation's owner, in the widget) or "staff" (in the
    # admin, with the ``conversations.approve_toolcall`` permission).
    approver: str = "visitor"
    # ``summary(arguments) -> str``: what the call will do, in a short plain-text sentence the
    # person approving reads (shown as text, never HTML).
    summary: typing.Callable = None

    @property
    def required(self):
        """The names of the parameters without a default."""
        return self.parameters.get("required", [])

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)

    def needs_approval(self, arguments, visitor=None):
        """Whether a call with ``arguments`` (validated) from ``visitor`` (the conversation's user,
        or None for an anonymous visitor) must be approved before it runs. A callable that raises
        asks for an approval: an error never lets a call through."""
        if not callable(self.approval):
            return bool(self.approval)
        try:
            return bool(self.approval(arguments, visitor))
        except Exception:  # noqa: BLE001 - fail closed
            logger.warning("Tool %s: its approval rule raised; the call needs an approval", self.name, exc_info=True)
            return True

    def describe(self, arguments):
        """What a call with ``arguments`` will do, as plain text of at most ``SUMMARY_MAX_CHARS``:
        the tool's ``summary``, or its name when it has none (or it raised)."""
        text = ""
        if self.summary is not None:
            try:
                text = str(self.summary(arguments) or "")
            except Exception:  # noqa: BLE001 - the arguments are shown anyway
                logger.warning("Tool %s: its summary raised", self.name, exc_info=True)
        text = " ".join(text.split()) or self.name
        return text[:SUMMARY_MAX_CHARS]


# The longest summary of a call waiting for an approval.
SUMMARY_MAX_CHARS = 300
APPROVERS = ("visitor", "staff")


def canonical_arguments(arguments):
    """``arguments`` as one canonical JSON text (keys sorted, no spaces): what an approval's hash is of."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def arguments_hash(arguments):
    """The SHA-256 (hex) of ``canonical_arguments(arguments)``: an approval names the exact arguments it approves."""
    return hashlib.sha256(canonical_arguments(arguments).encode("utf-8")).hexdigest()


class ToolError(Exception):
    """Raise it from a tool to tell the model (and the visitor, who sees tool results) why the
    tool could not do its job: ``raise ToolError("No booking was found for that date.")``.
    Any other exception's text is kept from them, since it may name internals."""


class InvalidArguments(ValueError):
    """The model's arguments do not match the tool's schema; the message says how, for the model."""


# The name prefix of a thread given up on while it still runs (a tool past its limit here; a turn
# past its job timeout in conversations.engine.worker).
ABANDONED_THREAD_PREFIX = "abandoned-"


def _schema_for(annotation):
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    if origin is typing.Literal:
        values = list(args)
        kinds = {type(v) for v in values}
        schema = {"enum": values}
        if len(kinds) == 1 and next(iter(kinds)) in _JSON_TYPES:
            schema["type"] = _JSON_TYPES[next(iter(kinds))]
        return schema
    if origin in (list, typing.List) or annotation is list:
        schema = {"type": "array"}
        if args:
            schema["items"] = _schema_for(args[0])
        return schema
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:
            return _schema_for(members[0])
        return {"anyOf": [_schema_for(a) for a in members]}
    if annotation is dict or origin is dict:
        return {"type": "object"}
    if annotation is inspect.Parameter.empty:
        return {"type": "string"}
    raise TypeError(f"unsupported tool parameter type: {annotation!r}")


def tool(function=None, *, name=None, description=None, timeout=None, idempotent=False, approval=False,
         approver="visitor", summary=None):
    """Decorator: make ``function`` a ``Tool`` (usable bare, ``@tool``, or with options,
    ``@tool(timeout=5, idempotent=True)``). ``approval``: True, or ``(arguments, visitor) -> bool``,
    for a call that runs only once a person approved it; ``approver``: "visitor" or "staff";
    ``summary``: ``(arguments) -> str``, what the call will do, for the person approving."""
    if approver not in APPROVERS:
        raise ValueError(f"approver must be one of {APPROVERS}, not {approver!r}")
    if not (isinstance(approval, bool) or callable(approval)):
        raise TypeError("approval must be True, False or a callable (arguments, visitor) -> bool")

    def wrap(fn):
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=False)
        params = list(signature.parameters.values())
        takes_context = bool(params) and params[0].name == "context"
        if takes_context:
            params = params[1:]
        properties, required = {}, []
        for param in params:
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {fn.__name__}: *args/**kwargs are not supported")
            schema = _schema_for(hints.get(param.name, param.annotation))
            if param.default is param.empty:
                required.append(param.name)
            elif param.default is not None:
                schema["default"] = param.default
            properties[param.name] = schema
        parameters = {"type": "object", "properties": properties, "required": required,
                      "additionalProperties": False}
        doc = inspect.getdoc(fn) or ""
        return Tool(
            name=name or fn.__name__,
            description=description or doc.strip(),
            parameters=parameters,
            function=fn,
            takes_context=takes_context,
            timeout=timeout,
            idempotent=idempotent,
            approval=approval,
            approver=approver,
            summary=summary,
        )

    return wrap(function) if function is not None else wrap


# What OpenAI and Anthropic both accept as a tool name.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def load_tools(paths):
    """Import each dotted path; a plain function is wrapped with ``@tool``. Returns {name: Tool}.

    Called by the runner at the start of every turn and by the system check at start-up;
    raises ImportError, TypeError (an unsupported type hint) or ValueError (a bad or repeated name).
    """
    loaded = {}
    for path in paths:
        obj = import_string(path)
        t = obj if isinstance(obj, Tool) else tool(obj)
        if not _NAME.match(t.name):
            raise ValueError(f"{path}: tool name {t.name!r} must be 1-64 letters, digits, '_' or '-'")
        if t.name in loaded:
            raise ValueError(f"{path}: two tools are named {t.name!r}")
        loaded[t.name] = t
    return loaded


def _check_value(name, value, schema):
    if "enum" in schema:
        if value not in schema["enum"]:
            raise InvalidArguments(f"{name} must be one of {schema['enum']}")
        return value
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            try:
                return _check_value(name, value, option)
            except InvalidArguments:
                pass
        raise InvalidArguments(f"{name} has the wrong type")
    kind = schema.get("type")
    if kind == "string" and not isinstance(value, str):
        raise InvalidArguments(f"{name} must be a string")
    if kind == "boolean" and not isinstance(value, bool):
        raise InvalidArguments(f"{name} must be true or false")
    if kind == "integer":
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise InvalidArguments(f"{name} must be an integer")
        return int(value)
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArguments(f"{name} must be a number")
        return float(value)
    if kind == "array":
        if not isinstance(value, list):
            raise InvalidArguments(f"{name} must be a list")
        items = schema.get("items")
        return [_check_value(f"{name}[{i}]", v, items) for i, v in enumerate(value)] if items else value
    if kind == "object" and not isinstance(value, dict):
        raise InvalidArguments(f"{name} must be an object")
    return value


def validate_arguments(t, arguments):
    """Return the arguments checked against ``t.parameters`` (ints coerced); raise InvalidArguments."""
    if not isinstance(arguments, dict) or "__invalid_json__" in arguments:
        raise InvalidArguments("arguments must be a JSON object")
    properties = t.parameters.get("properties", {})
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        raise InvalidArguments(f"unknown argument(s): {', '.join(unknown)}")
    # Models often send null for an optional argument they mean to leave out: the default applies.
    arguments = {n: v for n, v in arguments.items() if not (v is None and n not in t.required)}
    missing = [n for n in t.required if arguments.get(n) is None]
    if missing:
        raise InvalidArguments(f"missing argument(s): {', '.join(missing)}")
    return {n: _check_value(n, v, properties[n]) for n, v in arguments.items()}


def _to_text(value):
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def cap(text, limit):
    """Cut ``text`` to ``limit`` characters, saying so, so the model knows it saw only part."""
    if len(text) <= limit:
        return text
    kept = limit
    for _ in range(2):  # the note's own length depends on the number it states
        note = f"… [cut: {len(text) - kept} more characters]"
        kept = max(0, limit - len(note))
    return text[:kept] + note


def interrupted_result(call):
    """The result of a call that was running when its worker stopped, for a tool that is not
    ``idempotent``: it is not run twice, and the model is told so."""
    return ToolResult(call.id, call.name, f"Error: the tool {call.name} was interrupted (its worker stopped) and "
                      "was not run again, since running it twice may not be safe.", outcome=Outcome.ERROR,
                      detail="interrupted when its worker stopped; not idempotent, so not run again")


def too_many_calls_message(limit):
    """The result the model gets for each tool call of one reply past ``MAX_TOOL_CALLS_PER_STEP``
    (for the model, like every tool result: not translated)."""
    return (f"Error: this tool call was not run: one reply may ask for at most {limit} tool calls. Ask again for "
            "what is still needed.")


def run_tool(t, call, context, limit, max_chars):
    """Run tool ``t`` for ``call`` within ``limit`` seconds; always return a ``ToolResult``.

    The tool runs in a thread of its own so that one that hangs can be abandoned: the turn
    goes on and reaches its final write; the thread is left to finish (or to die with the
    work horse).
    """
    if t is None:
        return ToolResult(call.id, call.name, f"Error: there is no tool named {call.name!r}.", is_error=True)
    try:
        arguments = validate_arguments(t, call.arguments)
    except InvalidArguments as exc:
        return ToolResult(call.id, call.name, f"Error: invalid arguments: {exc}.", is_error=True)

    outcome = {}

    def target():
        try:
            args = (context,) if t.takes_context else ()
            outcome["value"] = t.function(*args, **arguments)
        except BaseException as exc:  # noqa: BLE001 - everything a tool raises goes back to the model
            outcome["error"] = exc
        finally:
            connections.close_all()  # this thread's own database connections

    thread = threading.Thread(target=target, name=f"tool-{t.name}", daemon=True)
    thread.start()
    thread.join(max(0.0, limit))
    if thread.is_alive():
        logger.warning("Tool %s abandoned after %.1fs", t.name, limit)
        # In a forking worker it dies with the work horse; a ConcurrentWorker counts the ones alive.
        thread.name = f"{ABANDONED_THREAD_PREFIX}{thread.name}"
        return ToolResult(call.id, t.name, f"Error: the tool {t.name} timed out after {limit:.0f} seconds.",
                          outcome=Outcome.TIMEOUT)
    if "error" in outcome:
        exc = outcome["error"]
        with quoting(texts_in(arguments)):  # an error quoting its arguments (the visitor's words) does not, unless DEBUG
            detail = hide_quoted(f"{type(exc).__name__}: {exc}")
        logger.warning("Tool %s raised %s", t.name, detail)
        if isinstance(exc, ToolError):
            return ToolResult(call.id, t.name, cap(f"Error: {exc}", max_chars), is_error=True, detail=detail)
        return ToolResult(call.id, t.name, f"Error: the tool {t.name} failed.", is_error=True, detail=detail)
    return ToolResult(call.id, t.name, cap(_to_text(outcome.get("value")), max_chars))


__all__ = ["Tool", "ToolContext", "ToolError", "tool", "load_tools", "run_tool", "validate_arguments",
           "arguments_hash", "canonical_arguments"]
