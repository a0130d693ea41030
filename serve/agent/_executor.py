"""Executes the calls of one step: scope check, validation, repeat refusal, cache, parallel waves.

Dependencies: an argument string ``"$c1.field"`` (or ``"$c1"``) is a reference to the result of
call ``c1`` in the same step. Calls are run in waves: every call whose references are resolved
runs concurrently (``asyncio.gather``); a call that depends on a failed or unknown call is
rejected without running. A wave that makes no progress (a cycle) rejects what is left.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from recallserve.serve.agent._cache import TTLCache, cache_key
from recallserve.serve.agent._protocol import ParsedCall
from recallserve.serve.agent.given_numbers import numbers_in, ungrounded
from recallserve.serve.agent.guards import wrap_untrusted
from recallserve.serve.agent.schemas import ToolCallRecord
from recallserve.serve.agent.tools import ToolArgsError, ToolContext, ToolError, ToolSet
from recallserve.serve.turn import similar_key

__all__ = ["StepExecutor", "dedupe_calls"]

_REF = re.compile(r"^\$(c[1-9])(?:\.([A-Za-z0-9_.\[\]]+))?$")


def _refs(value: Any) -> set[str]:
    if isinstance(value, str):
        m = _REF.match(value)
        return {m.group(1)} if m else set()
    if isinstance(value, dict):
        return set().union(*(_refs(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_refs(v) for v in value)) if value else set()
    return set()


def _rename_refs(value: Any, alias: dict[str, str]) -> Any:
    """``value`` with references to an aliased call id pointing at the kept call."""
    if isinstance(value, str):
        m = _REF.match(value)
        if m and m.group(1) in alias:
            return f"${alias[m.group(1)]}" + (f".{m.group(2)}" if m.group(2) else "")
        return value
    if isinstance(value, dict):
        return {k: _rename_refs(v, alias) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename_refs(v, alias) for v in value]
    return value


def dedupe_calls(calls: list[ParsedCall]) -> list[ParsedCall]:
    """The calls of one step without repeats of an earlier call of the same step (same tool,
    same raw arguments); references to a dropped call point at the kept one.

    NOTE: measured on cpu-local: the 1.5B model sometimes emits one call twice in a
    ``tool_calls`` step; refusing the copy as a repeat made it loop on the refusal text.
    """
    first: dict[tuple[str, str], str] = {}
    alias: dict[str, str] = {}
    kept: list[ParsedCall] = []
    for c in calls:
        key = (c.name, json.dumps(c.args, sort_keys=True, default=str))
        if key in first:
            alias[c.id] = first[key]
            continue
        first[key] = c.id
        kept.append(c)
    if not alias:
        return kept
    return [ParsedCall(id=c.id, name=c.name, args=_rename_refs(c.args, alias)) for c in kept]


def _lookup(result: Any, path: str | None) -> Any:
    if not path:
        return result
    cur = result
    for key in path.replace("[", ".").replace("]", "").split("."):
        if isinstance(cur, list) and key.isdigit() and int(key) < len(cur):
            cur = cur[int(key)]
        elif isinstance(cur, list) and cur and isinstance(cur[0], dict) and key in cur[0]:
            cur = cur[0][key]  # NOTE: "$c1.order_id" on a list means the first row's field.
        elif isinstance(cur, dict) and key in cur:
            cur = cur[key]
        else:
            raise KeyError(path)
    return cur


def _resolve(value: Any, results: dict[str, Any]) -> Any:
    if isinstance(value, str):
        m = _REF.match(value)
        if m:
            return _lookup(results[m.group(1)], m.group(2))
        return value
    if isinstance(value, dict):
        return {k: _resolve(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, results) for v in value]
    return value


class StepExecutor:
    """Runs tool calls for one request; remembers (name, args) pairs already called in it.

    ``evidence`` is the text the turn's prompt gives (messages, memories, image notes); with the
    observations of the calls run so far it grounds the numbers of a tool's ``grounded`` arguments.
    """

    def __init__(self, tools: ToolSet, ctx: ToolContext, cache: TTLCache, observation_max_chars: int,
                 evidence: str = "") -> None:
        self.tools = tools
        self.numbers = numbers_in(evidence)
        self.ctx = ctx
        self.cache = cache
        self.cap = observation_max_chars
        self.seen: set[str] = set()
        self._earlier: dict[str, str] = {}  # key -> the observation of its first call
        self._rejected: set[str] = set()  # keys of calls rejected for their arguments
        self.counter = 0
        self.uses: dict[str, int] = {}  # tool -> calls run (for Tool.max_calls)

    def _cap(self, text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= self.cap else text[: self.cap - 15] + " ...[truncated]"

    async def run_step(self, step: int, calls: list[ParsedCall]) -> list[ToolCallRecord]:
        """Run the calls of one step (repeats within the step dropped, see :func:`dedupe_calls`);
        returns one record per remaining call, in the order asked."""
        calls = dedupe_calls(calls)
        ids = {c.id for c in calls}
        records: dict[str, ToolCallRecord] = {}
        results: dict[str, Any] = {}
        pending = list(calls)
        while pending:
            ready, blocked = [], []
            for c in pending:
                deps = _refs(c.args)
                unknown = deps - ids
                failed = [d for d in deps if d in records and records[d].status not in ("ok", "cached")]
                if unknown or failed:
                    bad = sorted(unknown) + sorted(failed)
                    records[c.id] = self._record(step, c, c.args, "invalid",
                                                 f"Rejected: depends on {', '.join(bad)}, which is unknown or failed.")
                elif deps <= set(results):
                    ready.append(c)
                else:
                    blocked.append(c)
            if not ready:
                for c in blocked:
                    records[c.id] = self._record(step, c, c.args, "invalid", "Rejected: circular dependency between calls.")
                break
            done = await asyncio.gather(*(self._one(step, c, results) for c in ready))
            for c, rec in zip(ready, done, strict=True):
                records[c.id] = rec
                if rec.status in ("ok", "cached"):
                    self.numbers |= numbers_in(rec.observation)
                if rec.status in ("ok", "cached", "error", "timeout"):
                    self._earlier.setdefault(cache_key(rec.name, rec.args), rec.observation)
                if rec.status in ("ok", "cached"):
                    results[c.id] = rec.result
            pending = [c for c in blocked if c.id not in records]
        return [records[c.id] for c in calls]

    def _record(self, step: int, call: ParsedCall, args: dict[str, Any], status: str, obs: str,
                elapsed_ms: float = 0.0, result: Any = None) -> ToolCallRecord:
        self.counter += 1
        return ToolCallRecord(id=f"c{self.counter}", step=step, name=call.name, args=args, status=status,
                              observation=obs, elapsed_ms=elapsed_ms, result=result)

    async def _one(self, step: int, call: ParsedCall, results: dict[str, Any]) -> ToolCallRecord:
        t0 = time.perf_counter()
        tool = self.tools.get(call.name)
        if tool is None:
            avail = ", ".join(self.tools) or "none"
            return self._record(step, call, call.args, "refused",
                                f"Refused: tool '{call.name}' is not available to you. Available tools: {avail}.")
        try:
            raw = _resolve(call.args, results)
        except KeyError as exc:
            return self._record(step, call, call.args, "invalid", f"Rejected: reference {exc} not found in the result.")
        # NOTE: the same rejected arguments asked again end in "refused", which stops the calling
        # (the loop's step of refusals only may answer). Measured: the 1.5B model sent one
        # calculator expression with an invented number five times, to the step limit.
        asked = cache_key(tool.name, raw)
        again = asked in self._rejected
        try:
            args = tool.validate(raw)
        except ToolArgsError as exc:
            self._rejected.add(asked)
            return self._record(step, call, raw, "refused" if again else "invalid",
                                f"Invalid arguments for {tool.name}: {exc}. "
                                + ("These were rejected before: answer without this tool." if again
                                   else "Fix them or answer without this tool."))
        clean = args.model_dump(mode="json")
        for name in tool.grounded:
            bad = ungrounded(str(clean.get(name, "")), self.numbers)
            if bad:
                # A number a later result gives grounds the same arguments: only a still-ungrounded
                # repeat is refused.
                self._rejected.add(asked)
                return self._record(step, call, clean, "refused" if again else "invalid",
                                    f"Invalid arguments for {tool.name}: {name} uses {', '.join(bad)}, which neither "
                                    "the question nor the results give. "
                                    + ("These were rejected before: answer without this tool." if again
                                       else "Use only the numbers given."))
        key = cache_key(tool.name, clean)
        if key in self.seen:
            # NOTE: the earlier result is repeated in the refusal: measured with the 1.5B model, a
            # bare refusal was the last thing it read and it copied the refusal into its answer.
            earlier = self._earlier.get(key)
            tail = f" Its result was: {earlier}" if earlier else ""
            return self._record(step, call, clean, "refused",
                                f"Refused: {tool.name} was already called with these arguments in this conversation."
                                f"{tail} Answer from it now.")
        if tool.max_calls is not None and self.uses.get(tool.name, 0) >= tool.max_calls:
            # NOTE: also within one step: the 1.5B model asked for two memory searches in parallel.
            return self._record(step, call, clean, "refused",
                                f"Refused: {tool.name} may be called at most {tool.max_calls} time(s) per request. "
                                "Answer from the results you have.")
        self.uses[tool.name] = self.uses.get(tool.name, 0) + 1
        self.seen.add(key)
        # NOTE: the end user too: a memory tool's result is scoped to them (ToolContext.user).
        tenant_key = similar_key((self.ctx.tenant, self.ctx.user), tool.name, clean)
        if tool.cacheable:
            found, value = self.cache.get(tenant_key)
            if found:
                return self._record(step, call, clean, "cached", value[1], result=value[0],
                                    elapsed_ms=(time.perf_counter() - t0) * 1e3)
        try:
            result = await tool.invoke(args, self.ctx)
        except TimeoutError:
            return self._record(step, call, clean, "timeout", f"Error: {tool.name} timed out after {tool.timeout_s:g} s.",
                                elapsed_ms=(time.perf_counter() - t0) * 1e3)
        except (ToolError, ValueError, LookupError, OSError) as exc:
            return self._record(step, call, clean, "error", f"Error: {exc}",
                                elapsed_ms=(time.perf_counter() - t0) * 1e3)
        obs, _flagged = wrap_untrusted(self._cap(tool.summarise(result)))
        if tool.cacheable:
            self.cache.put(tenant_key, (result, obs))
        return self._record(step, call, clean, "ok", obs, elapsed_ms=(time.perf_counter() - t0) * 1e3, result=result)
