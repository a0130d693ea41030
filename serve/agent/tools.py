"""Tool registry: name, description, pydantic parameters, scope, validators, timeout, summariser.

A :class:`Tool` is what the model may call. Its parameters are a pydantic model (strict: unknown
arguments are rejected) rendered as JSON schema twice: as a one-line signature in the stable
system prompt, and as the ``args`` schema inside the constrained-decoding grammar. Validation
runs again in code before the call (types, patterns such as "an order id is 6 digits",
whitelists, extra validators), so a model that escapes the grammar or an injected instruction
never reaches a tool with bad arguments.

A tenant gets a :class:`ToolSet` — the tools whose ``scope`` is in its scopes — fixed before the
loop starts; nothing the model reads later can add to it (least privilege). Destructive or bulk
tools live under their own write scopes, which no tenant has by default.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from recallserve.serve.agent.hints import RoutingHint
from recallserve.serve.memory import MemoryBackend

__all__ = ["Tool", "ToolContext", "ToolError", "ToolArgsError", "ToolRegistry", "ToolSet", "default_summary"]

_NAME = re.compile(r"^[a-z][a-z0-9_]{1,47}$")


class ToolError(RuntimeError):
    """A tool failed in a way the model should hear about (not found, upstream error)."""


class ToolArgsError(ValueError):
    """Arguments failed validation; the message names every bad field."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool function may see about the request (never the model's prompt)."""

    tenant: str
    scopes: frozenset[str]
    memory: MemoryBackend | None = None
    user: str | None = None
    """The end user's stored key: memory tools search only their memories and the tenant's unowned ones."""


def default_summary(result: Any) -> str:
    """Compact JSON of a result (strings as they are)."""
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, separators=(", ", ": "), default=str)


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's ``title`` keys and inline ``$defs`` so the grammar converter sees a flat schema."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                ref = node["$ref"].rsplit("/", 1)[-1]
                return walk(defs[ref])
            return {k: walk(v) for k, v in node.items() if k not in ("title", "$defs")}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


@dataclass(frozen=True)
class Tool:
    """One callable tool.

    Attributes:
        name: snake_case name the model uses.
        description: one or two sentences for the model: what it returns and when to use it.
        params: pydantic model of the arguments (use ``extra="forbid"``; patterns/Literals in fields).
        fn: ``fn(args, ctx)`` returning a JSON-able result, sync (run in a thread) or async.
        scope: permission scope a tenant needs, e.g. ``"orders:read"``.
        timeout_s: wall-clock limit of one call.
        summarise: result -> short text for the observation (default: compact JSON).
        validators: extra checks ``check(args)`` raising ``ValueError`` with a message naming the field.
        cacheable: whether results may be served from the TTL cache (False for clocks and writes).
        destructive: changes state; such tools must sit under a write scope.
        routing: when a question calls for the tool (:mod:`recallserve.serve.agent.routing`); None = only
            the router model can pick it.
        max_calls: calls per request after which the tool leaves the step grammar (None: no
            limit beyond the loop's steps and the refusal of repeated arguments).
        covered_by_recall: the turn's memory recall already does what the tool does (a memory
            search): when recall found memories and the rules route the turn, the tool is offered
            only as the rules' first step (the user asked to search).
        grounded: arguments whose numbers must come from the conversation (the prompt and the
            turn's observations; :mod:`recallserve.serve.agent.given_numbers`): a call using another number is
            rejected with a message naming it (the calculator's expression).
    """

    name: str
    description: str
    params: type[BaseModel]
    fn: Callable[[Any, ToolContext], Any]
    scope: str
    timeout_s: float = 10.0
    summarise: Callable[[Any], str] = default_summary
    validators: tuple[Callable[[Any], None], ...] = ()
    cacheable: bool = True
    destructive: bool = False
    routing: RoutingHint | None = None
    max_calls: int | None = None
    covered_by_recall: bool = False
    grounded: tuple[str, ...] = ()
    _schema: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"tool name {self.name!r}: must match {_NAME.pattern}")
        if not self.description.strip():
            raise ValueError(f"tool {self.name}: description must not be empty")
        if not self.scope or not re.match(r"^[a-z][a-z0-9_:.-]*$", self.scope):
            raise ValueError(f"tool {self.name}: scope {self.scope!r} must be a lowercase scope like 'orders:read'")
        if self.timeout_s <= 0:
            raise ValueError(f"tool {self.name}: timeout_s must be > 0, got {self.timeout_s}")
        if self.max_calls is not None and self.max_calls < 1:
            raise ValueError(f"tool {self.name}: max_calls must be >= 1 or None, got {self.max_calls}")
        if self.destructive and not self.scope.endswith(":write"):
            raise ValueError(f"tool {self.name}: a destructive tool needs a ':write' scope, got {self.scope!r}")
        object.__setattr__(self, "_schema", _clean_schema(self.params.model_json_schema()))

    @property
    def args_schema(self) -> dict[str, Any]:
        """JSON schema of the arguments (flat, no titles)."""
        return self._schema

    def signature(self) -> str:
        """One prompt line: ``name(arg: type [pattern/enum], ...) - description``."""
        props = self._schema.get("properties", {})
        required = set(self._schema.get("required", []))
        parts = []
        for pname, spec in props.items():
            kind = spec.get("type", "any")
            if "anyOf" in spec:
                kind = "|".join(s.get("type", "any") for s in spec["anyOf"] if s.get("type") != "null")
            extra = []
            if "enum" in spec:
                extra.append("one of " + "/".join(map(str, spec["enum"])))
            # NOTE: only short patterns (ids like ^\d{6}$) help the model; long ones are noise.
            if "pattern" in spec and len(spec["pattern"]) <= 24:
                extra.append(f"format {spec['pattern']}")
            if "description" in spec:
                extra.append(spec["description"])
            opt = "" if pname in required else "?"
            parts.append(f"{pname}{opt}: {kind}" + (f" ({'; '.join(extra)})" if extra else ""))
        return f"{self.name}({', '.join(parts)}) - {self.description}"

    def validate(self, args: Mapping[str, Any]) -> BaseModel:
        """Validate raw arguments; raises :class:`ToolArgsError` naming each bad field."""
        if not isinstance(args, Mapping):
            raise ToolArgsError(f"args: expected an object, got {type(args).__name__}")
        try:
            model = self.params.model_validate(dict(args))
        except ValidationError as exc:
            msgs = []
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"]) or "args"
                msgs.append(f"{loc}: {err['msg']}")
            raise ToolArgsError("; ".join(msgs)) from None
        for check in self.validators:
            try:
                check(model)
            except ValueError as exc:
                raise ToolArgsError(str(exc)) from None
        return model

    async def invoke(self, args: BaseModel, ctx: ToolContext) -> Any:
        """Run the tool within its timeout (sync functions in a worker thread)."""
        if inspect.iscoroutinefunction(self.fn):
            coro: Awaitable[Any] = self.fn(args, ctx)
        else:
            coro = asyncio.to_thread(self.fn, args, ctx)
        return await asyncio.wait_for(coro, timeout=self.timeout_s)


class ToolSet(Mapping[str, Tool]):
    """The frozen, name-sorted tools one request may use."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools = {t.name: t for t in sorted(tools, key=lambda t: t.name)}

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def subset(self, names: Iterable[str]) -> ToolSet:
        """Only the named tools that are in this set (unknown names are ignored: never widens)."""
        wanted = set(names)
        return ToolSet(t for n, t in self._tools.items() if n in wanted)


class ToolRegistry:
    """All tools known to the server; hands each tenant the subset its scopes allow.

    Example:
        >>> reg = ToolRegistry()
        >>> from recallserve.serve.agent.builtin import calculator_tool
        >>> reg.register(calculator_tool())
        >>> list(reg.for_scopes(["basic"]))
        ['calculator']
    """

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, tool: Tool) -> None:
        """Add a tool; a second tool with the same name is an error."""
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def names(self) -> list[str]:
        """All tool names, sorted."""
        return sorted(self._tools)

    def get(self, name: str) -> Tool | None:  # type: ignore[override]
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def all(self) -> list[Tool]:
        """Every registered tool, sorted by name (scopes ignored: for routing, never for calling)."""
        return [self._tools[n] for n in sorted(self._tools)]

    def for_scopes(self, scopes: Iterable[str]) -> ToolSet:
        """The tools whose scope is in ``scopes`` (``"*"`` is not special: list scopes explicitly)."""
        allowed = set(scopes)
        return ToolSet(t for t in self._tools.values() if t.scope in allowed)
