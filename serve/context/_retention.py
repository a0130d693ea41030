"""Retention evaluation: how many planted constraints and facts survive into the turn-60 context.

For each conversation (:mod:`recallserve.serve.context._eval_data`) the 59 turns are replayed into a fresh
session through :class:`ContextManager` exactly as the ingress would (append each turn, then
let the rolling summary refresh when its trigger fires; here the refresh is awaited between
turns, standing in for the off-path job finishing before the next message). Then, for every
planted item, the customer's turn-60 question about it is the pending message and the context
is assembled per mode and budget. An item counts as present when every one of its keys appears
in the context (system block, history, not the question itself), after :func:`normalise` -
verbatim, in the summary, or in the entity table.

Which context: with a ``prompt`` function (what ``recallserve eval retention`` passes), the prompt
the engine receives on the chosen chat path (the pipeline's turn rendered by
:func:`recallserve.serve.turn.render_prompt`, the question's own text taken out); without one, the assembled
context of :meth:`ContextManager.assemble` alone (a unit-level figure, blind to what the serving
path drops on its way to the engine).

The budget is the model's context window; ``reserved_output`` tokens are kept for the answer.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from recallserve.serve.context._eval_data import Conversation, PlantedItem, normalise
from recallserve.serve.context._manager import ContextManager
from recallserve.serve.context._types import ContextBudgetError, MessageIn, Session

__all__ = [
    "RetentionRow", "RetentionReport", "replay", "item_present", "evaluate_retention", "percentile", "GENERIC_QUESTION",
    "EVAL_SYSTEM", "PromptFn",
]

GENERIC_QUESTION = (
    "Before we wrap up, can you go over everything about my case: my details, my order, and what I asked you to "
    "respect?"
)

EVAL_SYSTEM = (
    "You are a customer-service assistant for an online electronics shop. Be accurate, respect every "
    "constraint the customer has set, and quote ids, amounts and dates exactly."
)
# NOTE: one turn every 90 s of simulated time: 60 turns = 90 minutes, long enough for the
# 30-minute summary cooldown to matter alongside the message-count cooldown.
_TURN_SECONDS = 90.0
#: ``prompt(session, question, budget, mode) -> (context text, resolved mode, latency ms)``: the
#: context the engine receives for ``question`` (without the question) on a chat path.
PromptFn = Callable[[Session, str, int, str], Awaitable[tuple[str, str, float]]]
_T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC


@dataclass
class RetentionRow:
    """Share of planted items present, for one mode and budget over all conversations."""

    mode: str
    budget: int
    items: int
    present: int
    retention3_items: int
    retention3_present: int
    constraints_present: float
    facts_present: float
    refused: int
    auto_modes: dict[str, int] = field(default_factory=dict)

    @property
    def share(self) -> float:
        """Present / items (0 when no items)."""
        return self.present / self.items if self.items else 0.0

    @property
    def retention3_share(self) -> float | None:
        """Present / items among retention-3 items (None when there are none)."""
        return self.retention3_present / self.retention3_items if self.retention3_items else None


@dataclass
class RetentionReport:
    """All rows plus the assembly latencies, per mode, in milliseconds."""

    rows: list[RetentionRow]
    latencies_ms: dict[str, list[float]]
    summaries: list[dict[str, object]]

    def latency(self, mode: str | None = None) -> tuple[float, float]:
        """(p50, p95) assembly latency in ms for ``mode`` (None = all modes)."""
        values = [v for m, vs in self.latencies_ms.items() if mode in (None, m) for v in vs]
        return percentile(values, 50), percentile(values, 95)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation, as numpy's default); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def item_present(item: PlantedItem, context: str) -> bool:
    """Every key of ``item`` has one alternative in ``context`` (normalised).

    Example:
        >>> item_present(PlantedItem("fact", "My order is ORD-1.", (("ORD-1",),), "?"), "- id: ORD-1")
        True
    """
    norm = normalise(context)
    return all(any(normalise(alt) in norm for alt in key) for key in item.keys)


async def replay(
    conv: Conversation, manager: ContextManager, clock: list[float], *, summarise: bool,
    categories: bool = True, on_turn: Callable[[int], None] | None = None,
) -> Session:
    """Store the conversation's 59 turns in a new session; refresh the summary when due.

    Args:
        conv: the conversation.
        manager: a manager whose clock reads ``clock[0]``.
        clock: one-element list holding the simulated time (advanced here).
        summarise: run the rolling summary when its trigger fires.
        categories: False stores every user/assistant message as plain ``chat`` (retention 1),
            the ablation that shows what categorisation buys.
        on_turn: progress callback, called with the turn number.
    """
    session = await manager.open_session("eval", f"customer-{conv.seed}", f"retention-{conv.seed}")
    for turn in conv.turns:
        clock[0] = _T0 + turn.number * _TURN_SECONDS
        forced = None if categories else "chat"
        batch = [MessageIn(role="user", content=text, timestamp=clock[0], category=forced) for text in turn.user]
        if turn.tool is not None:
            batch.append(MessageIn(role="tool", content=turn.tool[1], tool_name=turn.tool[0], timestamp=clock[0] + 5))
        batch.append(MessageIn(role="assistant", content=turn.reply, timestamp=clock[0] + 10, category=forced))
        await manager.append(session, batch)
        if summarise:
            clock[0] += 20
            await manager.refresh_summary(session)
        if on_turn is not None:
            on_turn(turn.number)
    clock[0] = _T0 + 60 * _TURN_SECONDS
    return session


async def evaluate_retention(
    conversations: Sequence[Conversation], managers: Sequence[ContextManager], sessions: Sequence[Session],
    *, modes: Sequence[str], budgets: Sequence[int], reserved_output: int = 256, question: str | None = None,
    prompt: PromptFn | None = None,
) -> RetentionReport:
    """Assemble the turn-60 context per item, mode and budget; count the items present.

    Args:
        conversations: the conversations, already replayed into ``sessions``.
        managers: the manager each session lives in (same order).
        sessions: the replayed sessions.
        modes: modes to evaluate (``auto`` included if wanted).
        budgets: context windows in tokens.
        reserved_output: tokens reserved for the answer in every budget.
        question: one question asked for every item (e.g. :data:`GENERIC_QUESTION`); None asks
            each item's own question (what retrieval can latch on to).
        prompt: scores the engine's prompt on a chat path (see the module docstring); None scores
            the assembled context.
    """
    rows: list[RetentionRow] = []
    latencies: dict[str, list[float]] = {m: [] for m in modes}
    for mode in modes:
        for budget in budgets:
            items = present = r3_items = r3_present = refused = 0
            by_kind: dict[str, list[bool]] = {"constraint": [], "fact": []}
            picked: Counter[str] = Counter()
            for conv, manager, session in zip(conversations, managers, sessions):
                retention = {m.content: m.retention for m in await manager.store.messages(
                    session.tenant, session.user, session.id)}
                for item in conv.items:
                    items += 1
                    is_r3 = retention.get(item.text, 0) >= 3
                    r3_items += is_r3
                    asked = question or item.question
                    try:
                        if prompt is not None:
                            context, resolved, latency = await prompt(session, asked, budget, mode)
                        else:
                            result = await manager.assemble(
                                session, [MessageIn(role="user", content=asked)], context_window=budget,
                                reserved_output=reserved_output, system=EVAL_SYSTEM, mode=mode,  # type: ignore[arg-type]
                            )
                            resolved, latency = result.mode, result.latency_ms
                            context = "\n".join([EVAL_SYSTEM, result.block, *(m.content for m in result.window)])
                    except ContextBudgetError:
                        refused += 1
                        by_kind[item.kind].append(False)
                        continue
                    latencies[mode].append(latency)
                    picked[resolved] += 1
                    ok = item_present(item, context)
                    present += ok
                    r3_present += ok and is_r3
                    by_kind[item.kind].append(ok)
            rows.append(RetentionRow(
                mode=mode, budget=budget, items=items, present=present, retention3_items=r3_items,
                retention3_present=r3_present,
                constraints_present=_share(by_kind["constraint"]), facts_present=_share(by_kind["fact"]),
                refused=refused, auto_modes=dict(picked) if mode == "auto" else {},
            ))
    summaries = []
    for conv, manager, session in zip(conversations, managers, sessions):
        fresh = await manager.store.get(session.tenant, session.user, session.id)
        summaries.append({"seed": conv.seed, "summariser": fresh.summary.summariser,
                          "covers_until": fresh.summary.until_seq, "tokens": fresh.summary.tokens,
                          "text": fresh.summary.text})
    return RetentionReport(rows=rows, latencies_ms=latencies, summaries=summaries)


def _share(flags: list[bool]) -> float:
    return statistics.fmean(flags) if flags else 0.0

