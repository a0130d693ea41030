"""What the routing bindings leave the loop to call.

The routing rules (:mod:`recallserve.serve.agent.routing`) bind a tool's arguments to the values the question
gives (``bindings``: tool -> argument -> values). From those bindings these functions decide
which calls are fixed without an engine step (:func:`determined_calls`), which tools have a single
possible call (:func:`single_call_tools`) and which tools have nothing new left to call
(:func:`spent_tools`), so the step grammar can drop them.
"""

from __future__ import annotations

from recallserve.serve.agent._protocol import ParsedCall
from recallserve.serve.agent.routing import bind_schema
from recallserve.serve.agent.schemas import ToolCallRecord
from recallserve.serve.agent.tools import Tool, ToolSet

__all__ = ["Bindings", "MAX_FIXED_CALLS", "bound_values", "determined_calls", "single_call_tools", "spent_tools"]

Bindings = dict[str, dict[str, list[str]]]
"""tool name -> argument -> the values the question gives for it."""


def bound_values(tool: Tool, found: dict[str, list[str]]) -> dict[str, list[str]]:
    """Argument -> the values the decoding grammar allows for ``tool`` (``bind_schema``'s enums:
    the values found in the question, upper-cased where only that fits the parameter's pattern)."""
    assert tool.routing is not None
    props = bind_schema(tool.args_schema, tool.routing.bind, found).get("properties", {})
    return {p: [str(v) for v in spec["enum"]] for p, spec in props.items() if "enum" in spec}


#: Most calls the rules fix for one step (a question naming several ids for the same tool).
MAX_FIXED_CALLS = 4


def _fixed_calls(name: str, tool: Tool, found: dict[str, list[str]] | None) -> list[ParsedCall] | None:
    """The calls of ``tool`` the bindings fix (one per value of its one multi-valued argument), or None."""
    if tool.destructive or tool.routing is None or found is None:
        return None
    props = tool.args_schema.get("properties", {})
    required = set(tool.args_schema.get("required", []))
    values = bound_values(tool, found)
    if any(p not in tool.routing.bind for p in props) or any(p in required and not values.get(p) for p in props):
        return None
    multi = [p for p, v in values.items() if len(v) > 1]
    if len(multi) > 1 or (multi and len(values[multi[0]]) > MAX_FIXED_CALLS):
        return None
    base = {p: v[0] for p, v in values.items() if p not in multi}
    if not multi:
        return [ParsedCall(id="c1", name=name, args=base)]
    return [ParsedCall(id=f"c{i}", name=name, args={**base, multi[0]: v}) for i, v in enumerate(values[multi[0]], 1)]


def determined_calls(tools: ToolSet, bindings: Bindings, *, several: bool = True,
                     candidates: ToolSet | None = None) -> list[ParsedCall]:
    """The calls the rules fix completely for step 1, or [].

    ``tools`` are the tools the first step must choose from; the calls are determined when there is
    exactly one of them, it changes nothing (a destructive call always goes through the model's
    own step), every argument is bound (none free, such as a query) and each required one has a
    value, and at most one argument has several values: one call per value of that argument, at
    most :data:`MAX_FIXED_CALLS` (``several``: the step may hold several calls; else only a single
    possible call, :func:`single_call_tools`). With ``several``, when every tool of ``candidates``
    (all the tools the rules found evidence for) is determined that way, the step holds the calls of
    all of them (a question naming an order and a customer: both look-ups). Their arguments are the
    grammar's values, so the calls are those the model's step would have been held to; that step
    could only have added a thought, so they run without an engine step.

    NOTE: measured on the compound eval: given two order ids, the 1.5B model made one order_status
    call and answered for both orders; given an order and a customer, it called one of the two look-ups.
    """
    if several and candidates is not None and len(candidates) > 1:
        fixed = [_fixed_calls(n, t, bindings.get(n)) for n, t in candidates.items()]
        calls = [c for f in fixed if f is not None for c in f]
        if all(f is not None for f in fixed) and len(calls) <= MAX_FIXED_CALLS:
            return [ParsedCall(id=f"c{i}", name=c.name, args=c.args) for i, c in enumerate(calls, 1)]
    if len(tools) != 1:
        return []
    name, tool = next(iter(tools.items()))
    if not several:
        if tool.destructive or not single_call_tools(tools, bindings):
            return []
        return [ParsedCall(id="c1", name=name, args={p: v[0] for p, v in bound_values(tool, bindings[name]).items()})]
    return _fixed_calls(name, tool, bindings.get(name)) or []


def spent_tools(tools: ToolSet, bindings: Bindings, calls: list[ToolCallRecord]) -> set[str]:
    """Tools of ``tools`` that have nothing new left to call: their ``max_calls`` are used, or,
    under the routing bindings, every value the question gives.

    A tool whose every argument is bound by the rules is spent once its attempted calls (any
    outcome but refused or invalid: the executor refuses a repeat of those arguments whatever
    their result was) have used every value the grammar allows for it: a single-call tool after
    its call, ``inventory_changes`` of "between 2025-04-01 and 2025-04-30" once a call used both
    dates. A further call could only repeat one or recombine the same values. NOTE: measured on
    the eval's inventory questions, the 1.5B model repeated such a call once before answering
    (refused as a repeat: one more step, ~60 generated tokens).
    """
    out: set[str] = set()
    for name, tool in tools.items():
        done = [c for c in calls if c.name == name and c.status not in ("refused", "invalid")]
        if tool.max_calls is not None and len(done) >= tool.max_calls:
            out.add(name)  # NOTE: the tool's own budget (memory_search: one search a request)
            continue
        found = bindings.get(name)
        if tool.routing is None or found is None:
            continue
        if not all(p in tool.routing.bind for p in tool.args_schema.get("properties", {})):
            continue  # NOTE: a free argument (a query, an expression) can always make a new call
        used = {str(v) for c in done for v in c.args.values() if v is not None}
        allowed = bound_values(tool, found)
        if done and all(v in used for values in allowed.values() for v in values):
            out.add(name)
    return out


def single_call_tools(tools: ToolSet, bindings: Bindings) -> set[str]:
    """Tools of ``tools`` with exactly one possible call under the routing bindings: every
    argument is bound to one value found in the question, or is optional and left out."""
    out: set[str] = set()
    for name, tool in tools.items():
        found = bindings.get(name)
        if tool.routing is None or found is None:
            continue
        required = set(tool.args_schema.get("required", []))
        declared = set(tool.routing.bind)
        props = tool.args_schema.get("properties", {})
        if all(p in declared and (len(found.get(p, [])) == 1 or (not found.get(p) and p not in required))
               for p in props):
            out.add(name)
    return out
