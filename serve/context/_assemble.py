"""Assemble one request's context inside its token budget, in one of five modes.

Budget (tokens left for history)::

    budget = context_window - reserved_output - system - pending

where ``system`` is the caller's system prompt and ``pending`` the request's new messages (each
message also pays a fixed :data:`MESSAGE_OVERHEAD` for its role and separators).

Modes (retention-3 messages, system constraints, are pinned in every mode; if they alone exceed
the budget the request is refused with :class:`ContextBudgetError`, never truncated; outside
``full``, retention-2 messages, the user's explicit instructions, are kept next, newest first while
they fit; 003's levels):

* ``full``: every message verbatim, in order; over budget, messages are dropped lowest retention
  first, oldest first within a retention level.
* ``sliding``: pinned messages + the newest contiguous messages that fit.
* ``summary``: pinned + rolling summary (<= summary_share) + entity table (<= entity_share) +
  the newest messages.
* ``retrieval``: pinned + the newest ``recent_min_messages`` + past messages most similar to the
  query (cosine, >= retrieval_threshold, at most retrieval_k) + newest messages for the rest.
* ``hybrid``: pinned + entity table + summary + recent minimum + retrieved (<= retrieved_share)
  + newest messages for the rest.

Outside ``full``, what is not in the contiguous recent window (pinned constraints, summary,
entities, retrieved messages) goes into one "conversation memory" block appended to the system
message; the recent window follows verbatim with its original roles, then the pending messages.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from recallserve.serve.context._entities import Entity, format_entity
from recallserve.serve.context._metrics import CONTEXT_BUDGET_REFUSALS_TOTAL
from recallserve.serve.context._retrieval import EmbeddingCache, query_discreteness
from recallserve.serve.context._types import (
    AutoSignals,
    ContextBudgetError,
    ContextConfig,
    ContextError,
    Message,
    ModeName,
    ResolvedMode,
    SummaryState,
    TokenBreakdown,
)
from recallserve.serve.engine import ChatMessage
from recallserve.serve.tokens import TokenCounter

__all__ = ["MESSAGE_OVERHEAD", "AssemblyInput", "Assembly", "assemble", "resolve_mode"]

# NOTE: OpenAI's cookbook counts 3-4 tokens per chat message for role and separators; Qwen's
# ChatML template adds 4-5 (<|im_start|>role\n ... <|im_end|>\n). 4 is the usual middle.
MESSAGE_OVERHEAD = 4
_HEAD = "## Conversation memory\nThe conversation is longer than the messages below; this is what matters from its earlier part."
_H_CONSTRAINTS = "Constraints and facts the user set earlier (verbatim, still binding):"
_H_SUMMARY = "Summary of the earlier conversation:"
_H_ENTITIES = "Entities mentioned earlier (verbatim):"
_H_RETRIEVED = "Earlier messages relevant to the current question:"


@dataclass
class AssemblyInput:
    """Everything one assembly reads (loaded by the manager)."""

    history: list[Message]
    pending: list[Message]
    entities: list[Entity]
    summary: SummaryState
    system: str | None
    context_window: int
    reserved_output: int
    requested: ModeName


@dataclass
class Assembly:
    """What :func:`assemble` returns (the manager wraps it into a ContextResult).

    What the chat turn needs and nothing more: ``block`` (the conversation-memory block, '' in
    full mode) and ``window`` (the history messages kept verbatim); the turn renders them into
    every engine prompt (:func:`recallserve.serve.turn.render_prompt`), under the path's own head.
    """

    mode: ResolvedMode
    budget: int
    breakdown: TokenBreakdown
    signals: AutoSignals
    dropped: int
    included_ids: set[str] = field(default_factory=set)
    block: str = ""
    window: list[ChatMessage] = field(default_factory=list)


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def _line(m: Message) -> str:
    origin = " (from an earlier session)" if m.source_session else ""
    return f"- [{_stamp(m.timestamp)}]{origin} {m.role}: {m.content}"


async def resolve_mode(
    requested: ModeName, history: Sequence[Message], pending: Sequence[Message], context_window: int,
    config: ContextConfig, cache: EmbeddingCache | None,
) -> tuple[ResolvedMode, AutoSignals]:
    """The mode to use and the signals behind it (003's ``decide_mode``).

    auto: history tokens / context window (003: ``history_tokens / max_tokens``, the whole window)
    < full_ratio -> full; else fact density (share of the session's user messages that are
    constraints or facts; 003 counts the last N messages, a measured departure) <
    sliding_fact_density -> sliding; else
    discreteness of the recent user queries (1 - mean cosine of consecutive ones) >=
    discreteness_threshold -> hybrid; else summary. Without an embedder discreteness is unknown and
    auto picks summary. Discreteness is only computed for auto (it costs an embedding of the pending
    query).
    """
    tokens = sum(m.tokens for m in history)
    ratio = tokens / context_window if context_window > 0 else float("inf") if tokens else 0.0
    # NOTE: density over the whole session's user messages, not 003's "last N messages": measured on
    # held-out retention conversations (seeds 10-14, facts planted at turns 1-50, asked at 60), the
    # last 20 messages hold 0-10% facts, so auto picked sliding and lost the early facts (present
    # 1.00 -> 0.54 at 4096 tokens, docs/design-sources.md). Constraints and facts come from the
    # user: counting the agent's replies and tool outputs would dilute it by the agent's verbosity.
    said = [m for m in history if m.role == "user"]
    density = sum(m.category in ("constraint", "fact") for m in said) / len(said) if said else 0.0
    discreteness = None
    # NOTE: only auto pays for embedding the queries; explicit modes report None.
    if cache is not None and requested == "auto":
        # NOTE: queries = the user's questions and requests (category chat); statements of
        # facts and constraints in between are not topic changes.
        queries = [m for m in [*history, *pending] if m.role == "user" and m.category == "chat"]
        queries = queries[-config.discreteness_queries :]
        discreteness = await query_discreteness(cache, queries)
    if requested != "auto":
        reason = f"mode {requested!r} requested"
        mode: ResolvedMode = requested
    elif ratio < config.full_ratio:
        mode, reason = "full", f"history is {ratio:.2f} of the context window (< {config.full_ratio})"
    elif density < config.sliding_fact_density:
        mode, reason = "sliding", f"fact density {density:.2f} < {config.sliding_fact_density}"
    elif discreteness is not None and discreteness >= config.discreteness_threshold:
        mode, reason = "hybrid", f"recent queries are discrete ({discreteness:.2f} >= {config.discreteness_threshold})"
    else:
        why = "no embedder to judge query discreteness" if discreteness is None else (
            f"recent queries stay on topic ({discreteness:.2f} < {config.discreteness_threshold})")
        mode, reason = "summary", why
    signals = AutoSignals(
        history_ratio=min(ratio, 1e9), fact_density=density, discreteness=discreteness, reason=reason
    )
    return mode, signals


class _Picker:
    """Token accounting of one selection."""

    def __init__(self, counter: TokenCounter, budget: int) -> None:
        self.counter = counter
        self.remaining = budget
        self._line_cache: dict[str, int] = {}

    async def line_cost(self, m: Message) -> int:
        if m.id not in self._line_cache:
            self._line_cache[m.id] = await self.counter.count(_line(m)) + 1
        return self._line_cache[m.id]


async def _text_cost(counter: TokenCounter, lines: Sequence[str]) -> int:
    return sum([await counter.count(line) + 1 for line in lines])


async def assemble(
    inp: AssemblyInput, config: ContextConfig, counter: TokenCounter, cache: EmbeddingCache | None,
) -> Assembly:
    """Select and render the context; see the module docstring for the modes.

    Raises:
        ContextBudgetError: system + pending + reserved output exceed the window, or the
            retention-3 messages do not fit the budget.
        ContextError: mode ``retrieval`` without an embedder.
    """
    sys_tokens = (await counter.count(inp.system) + MESSAGE_OVERHEAD) if inp.system else 0
    pending_tokens = sum(m.tokens for m in inp.pending)
    limit = inp.context_window - inp.reserved_output
    budget = limit - sys_tokens - pending_tokens
    if budget < 0:
        CONTEXT_BUDGET_REFUSALS_TOTAL.inc()
        raise ContextBudgetError(
            f"the system prompt ({sys_tokens} tokens) and the new messages ({pending_tokens} tokens) leave "
            f"no room in the context window ({inp.context_window} tokens, {inp.reserved_output} reserved "
            "for the answer): shorten them or lower max_tokens",
            budget=budget, required=sys_tokens + pending_tokens,
        )
    history = inp.history
    mode, signals = await resolve_mode(inp.requested, history, inp.pending, inp.context_window, config, cache)
    if mode == "retrieval" and cache is None:
        raise ContextError("mode 'retrieval' needs an embedder; none is configured for context assembly")
    pinned = [m for m in history if m.retention >= 3]
    picker = _Picker(counter, budget)
    pinned_cost = {m.id: (m.tokens if mode == "full" else await picker.line_cost(m)) for m in pinned}
    # NOTE: outside full mode the memory block's headers (and a system message of its own when
    # the caller sent none) are paid up front: a few dozen tokens, unused if the block stays empty.
    block_overhead = 0
    if mode != "full":
        block_overhead = 2 * MESSAGE_OVERHEAD + await _text_cost(
            counter, [_HEAD, _H_CONSTRAINTS, _H_SUMMARY, _H_ENTITIES, _H_RETRIEVED])
    required = sum(pinned_cost.values()) + (block_overhead if pinned else 0)
    if required > budget:
        CONTEXT_BUDGET_REFUSALS_TOTAL.inc()
        raise ContextBudgetError(
            f"the {len(pinned)} never-drop (retention 3) messages need {required} tokens but only {budget} "
            f"are left for history (context window {inp.context_window}, reserved output {inp.reserved_output}, "
            f"system {sys_tokens}, new messages {pending_tokens}): raise the context window, lower max_tokens, "
            "or lower the retention of some constraints",
            budget=budget, required=required,
        )
    if mode == "full":
        return await _render_full(inp, history, budget, counter, signals, sys_tokens, pending_tokens)
    picker.remaining -= sum(pinned_cost.values()) + block_overhead
    # NOTE: 003's retention 2 (the user's explicit instructions): kept as long as possible, so
    # newest first while they fit, before any other history; unlike retention 3, one that does
    # not fit is dropped, never a refusal.
    kept = []
    for m in reversed([m for m in history if m.retention == 2]):
        cost = await picker.line_cost(m)
        if cost <= picker.remaining:
            picker.remaining -= cost
            pinned_cost[m.id] = cost
            kept.append(m)
    pinned = sorted([*pinned, *kept], key=lambda m: m.seq)
    window: list[Message] = []  # newest first
    in_window: set[str] = set()
    retrieved: list[Message] = []
    retrieved_ids: set[str] = set()

    async def extend_window(max_count: int | None, reserve: int) -> None:
        for m in reversed(history):
            if m.id in in_window:
                continue
            if max_count is not None and len(window) >= max_count:
                return
            if window and m.seq != window[-1].seq - 1:
                return  # NOTE: the window stays contiguous; a gap ends it.
            if m.id in pinned_cost:
                cost = m.tokens - pinned_cost[m.id]  # moves from the block into the window
            elif m.id in retrieved_ids:
                cost = m.tokens - await picker.line_cost(m)
            else:
                cost = m.tokens
            if cost > picker.remaining - reserve:
                return
            picker.remaining -= cost
            window.append(m)
            in_window.add(m.id)
            if m.id in retrieved_ids:
                retrieved_ids.discard(m.id)
                retrieved.remove(m)

    await extend_window(config.recent_min_messages, 0)
    use_memory = mode in ("summary", "hybrid")
    entity_lines_all = [format_entity(e) for e in inp.entities] if use_memory else []
    entity_reserve = min(int(config.entity_share * budget), await _text_cost(counter, entity_lines_all))
    entity_reserve = min(entity_reserve, max(0, picker.remaining))

    summary_lines: list[str] = []
    if use_memory and inp.summary.text:
        cap = min(int(config.summary_share * budget), picker.remaining - entity_reserve)
        pinned_texts = [m.content for m in pinned]
        used = 0
        for line in inp.summary.text.splitlines():
            if not line.strip() or any(t and t in line for t in pinned_texts):
                continue  # NOTE: a line quoting a pinned message verbatim would be paid twice.
            cost = await counter.count(line) + 1
            if used + cost > cap:
                break
            summary_lines.append(line)
            used += cost
        picker.remaining -= used

    if mode in ("retrieval", "hybrid") and cache is not None:
        share = config.retrieved_share if mode == "hybrid" else max(config.retrieved_share, 0.5)
        cap = min(int(share * budget), picker.remaining - entity_reserve)
        query = next((m.content for m in reversed([*history, *inp.pending]) if m.role == "user"), "")
        candidates = [m for m in history if m.id not in in_window and m.id not in pinned_cost
                      and m.category != "greeting"]
        used = 0
        for sim, m in await cache.rank(query, candidates):
            if sim < config.retrieval_threshold or len(retrieved) >= config.retrieval_k:
                break
            cost = await picker.line_cost(m)
            if used + cost <= cap:
                retrieved.append(m)
                retrieved_ids.add(m.id)
                used += cost
        picker.remaining -= used

    await extend_window(None, entity_reserve)

    entity_lines: list[str] = []
    if entity_lines_all:
        present = "\n".join([*(m.content for m in window), *(m.content for m in pinned),
                             *(m.content for m in retrieved), *summary_lines])
        used = 0
        for ent, line in zip(inp.entities, entity_lines_all):
            if ent.value in present:
                continue  # NOTE: already verbatim elsewhere in the context.
            cost = await counter.count(line) + 1
            if used + cost > picker.remaining:
                continue
            entity_lines.append(line)
            used += cost
        picker.remaining -= used

    window.reverse()
    block_pinned = [m for m in pinned if m.id not in in_window]
    retrieved.sort(key=lambda m: m.seq)
    sections: list[tuple[str, list[str]]] = [
        (_H_CONSTRAINTS, [_line(m) for m in block_pinned]),
        (_H_SUMMARY, summary_lines),
        (_H_ENTITIES, entity_lines),
        (_H_RETRIEVED, [_line(m) for m in retrieved]),
    ]
    block_parts = [_HEAD] + [f"{head}\n" + "\n".join(lines) for head, lines in sections if lines]
    block = "\n\n".join(block_parts) if len(block_parts) > 1 else ""
    system_text = "\n\n".join(p for p in (inp.system, block) if p)
    kept = [ChatMessage(role=m.role, content=m.content) for m in window]

    part = {
        "constraints": await _text_cost(counter, sections[0][1]) + sum(m.tokens for m in window if m.retention >= 2),
        "summary": await _text_cost(counter, summary_lines),
        "entities": await _text_cost(counter, entity_lines),
        "retrieved": await _text_cost(counter, sections[3][1]),
        "recent": sum(m.tokens for m in window if m.retention < 2),
    }
    # NOTE: the context's own share of a prompt (system text with the block, window, pending); the
    # chat turn replaces the total with its rendered prompt's tokens (serve.turn.TurnContext).
    system_cost = await counter.count(system_text) + MESSAGE_OVERHEAD if system_text else 0
    total = system_cost + sum(m.tokens for m in window) + pending_tokens
    breakdown = TokenBreakdown(
        system=max(0, total - pending_tokens - sum(part.values())), pending=pending_tokens, total=total, **part,
    )
    included = {m.id for m in window} | {m.id for m in block_pinned} | {m.id for m in retrieved}
    return Assembly(
        mode=mode, budget=budget, breakdown=breakdown, signals=signals,
        dropped=len(history) - len(included), included_ids=included, block=block, window=kept,
    )


async def _render_full(
    inp: AssemblyInput, history: list[Message], budget: int, counter: TokenCounter, signals: AutoSignals,
    sys_tokens: int, pending_tokens: int,
) -> Assembly:
    kept = {m.id for m in history}
    used = sum(m.tokens for m in history)
    # NOTE: drop order = lowest retention first, oldest first within a level; retention 3 never.
    for m in sorted(history, key=lambda m: (m.retention, m.seq)):
        if used <= budget:
            break
        if m.retention >= 3:
            continue
        kept.discard(m.id)
        used -= m.tokens
    selected = [m for m in history if m.id in kept]
    window = [ChatMessage(role=m.role, content=m.content) for m in selected]
    breakdown = TokenBreakdown(
        system=sys_tokens,
        constraints=sum(m.tokens for m in selected if m.retention >= 3),
        recent=sum(m.tokens for m in selected if m.retention < 3),
        pending=pending_tokens,
        total=sys_tokens + used + pending_tokens,
    )
    return Assembly(
        mode="full", budget=budget, breakdown=breakdown, signals=signals,
        dropped=len(history) - len(selected), included_ids=kept, window=window,
    )
