"""Context assembly: budget formula, never-drop rule, the five modes, auto, result schema, metrics."""

from __future__ import annotations

import json
import random

import pytest
from prometheus_client import REGISTRY

from recallserve.serve.context import (
    ContextBudgetError,
    ContextConfig,
    ContextError,
    ContextManager,
    ContextResult,
    MessageIn,
    SessionStore,
)
from recallserve.serve.engine import ChatMessage
from recallserve.serve.tokens import count_tokens

from .conftest import hashing_embed, run

_FILLER = ("Standard shipping normally takes three to five working days depending on the region and the "
           "carrier load, and tracking pages sometimes pause between depots. ")


def _conversation(mgr: ContextManager, turns: int = 40, sid: str = "s") -> object:
    async def go() -> object:
        s = await mgr.open_session("t", "u", sid)
        await mgr.append(s, [MessageIn(role="user", content="Please never call me before 10:45am."),
                             MessageIn(role="assistant", content="Noted.")])
        await mgr.append(s, [MessageIn(role="user", content="My order number is ORD-9934935."),
                             MessageIn(role="assistant", content="Thanks.")])
        for i in range(turns):
            await mgr.append(s, [MessageIn(role="user", content=f"Question {i}: how does the return label work?"),
                                 MessageIn(role="assistant", content=_FILLER * 2)])
        await mgr.append(s, [MessageIn(role="user", content="The espresso machine is model RI-4410X."),
                             MessageIn(role="assistant", content=_FILLER)])
        return s

    return run(go())


def _prompt(res: ContextResult, system: str | None = "Be helpful.", question: str = "What is my order number?") -> list[ChatMessage]:
    """The prompt a caller renders of ``res`` (context-mode returns only its block and window)."""
    system_text = "\n\n".join(p for p in (system, res.block) if p)
    return [*([ChatMessage(role="system", content=system_text)] if system_text else []), *res.window,
            ChatMessage(role="user", content=question)]


def _ctx(res: ContextResult) -> str:
    return "\n".join(m.content for m in _prompt(res))


def _assemble(mgr: ContextManager, s: object, mode: str, window: int = 1500, reserved: int = 200,
              question: str = "What is my order number?", system: str | None = "Be helpful.") -> ContextResult:
    return run(mgr.assemble(s, [MessageIn(role="user", content=question)], context_window=window,
                            reserved_output=reserved, system=system, mode=mode))


@pytest.mark.parametrize("mode", ["full", "sliding", "summary", "retrieval", "hybrid", "auto"])
@pytest.mark.parametrize("window", [700, 1500, 20000])
def test_fits_window_and_keeps_retention3(manager: ContextManager, mode: str, window: int) -> None:
    s = _conversation(manager)
    res = _assemble(manager, s, mode, window=window)
    # the real prompt size (content + per-message overhead) stays inside window - reserved
    prompt = _prompt(res)
    real = sum(count_tokens(m.content) + 4 for m in prompt)
    assert real <= window - 200, (real, res.breakdown)
    assert res.breakdown.total == real
    parts = res.breakdown.model_dump()
    assert sum(v for k, v in parts.items() if k != "total") == parts["total"]
    assert "Please never call me before 10:45am." in _ctx(res)
    assert "What is my order number?" not in [m.content for m in res.window]
    assert res.budget == window - 200 - (count_tokens("Be helpful.") + 4) - (count_tokens("What is my order number?") + 4)


def test_budget_errors(manager: ContextManager) -> None:
    s = _conversation(manager, turns=2)
    # 003: system constraints are the never-drop level (3); the user's (2) are dropped when they do not fit.
    run(manager.append(s, [MessageIn(role="system", content="Never share another customer's order, address or "
                                                              "phone number, and always confirm the account first.")]))
    with pytest.raises(ContextBudgetError, match="never-drop") as err:
        _assemble(manager, s, "hybrid", window=260, reserved=200, system=None)
    assert err.value.required > err.value.budget
    with pytest.raises(ContextBudgetError, match="leave no room"):
        _assemble(manager, s, "full", window=300, reserved=290)
    with pytest.raises(ValueError, match="reserved_output"):
        _assemble(manager, s, "full", window=300, reserved=300)


def test_full_mode_drops_lowest_retention_oldest_first(manager: ContextManager) -> None:
    s = _conversation(manager, turns=10)
    everything = _assemble(manager, s, "full", window=20000)
    assert everything.dropped_messages == 0
    tight = _assemble(manager, s, "full", window=900)
    text = _ctx(tight)
    assert tight.dropped_messages > 0
    # 003's levels: the user's constraint (2) survives; facts (1) go with the filler, oldest first
    assert "10:45am" in text and "RI-4410X" in text and "ORD-9934935" not in text
    assert "Question 0:" not in text and "Question 9:" in text


def test_sliding_is_contiguous_newest(manager: ContextManager) -> None:
    s = _conversation(manager, turns=30)
    res = _assemble(manager, s, "sliding", window=1200)
    text = _ctx(res)
    assert "ORD-9934935" not in text  # a fact outside the window is gone in sliding
    shown = [int(line.split()[1].rstrip(":")) for line in text.splitlines() if line.startswith("Question ")]
    assert shown == list(range(shown[0], 30)) and shown[0] > 0


def test_summary_and_hybrid_keep_facts_through_summary_and_entities(manager: ContextManager) -> None:
    s = _conversation(manager, turns=30)
    manager.config = ContextConfig(summary_trigger_tokens=500)
    assert run(manager.refresh_summary(s)) is not None
    for mode in ("summary", "hybrid"):
        res = _assemble(manager, s, mode, window=1200)
        text = _ctx(res)
        assert "ORD-9934935" in text and "RI-4410X" in text
        assert res.breakdown.summary > 0 and res.summary_covers_until >= 0
        # the pinned constraint appears once, not again inside the summary
        assert text.count("never call me before 10:45am") == 1


def test_retrieval_finds_the_relevant_past_turn(manager: ContextManager) -> None:
    s = _conversation(manager, turns=30)
    res = _assemble(manager, s, "retrieval", window=1200, question="Which espresso machine model is mine?")
    assert "RI-4410X" in _ctx(res)
    res = _assemble(manager, s, "retrieval", window=1200, question="remind me of my order number")
    assert res.breakdown.retrieved > 0 and "ORD-9934935" in _ctx(res)


def test_retrieval_without_embedder_is_an_error(store: SessionStore) -> None:
    mgr = ContextManager(store)
    s = _conversation(mgr, turns=2)
    with pytest.raises(ContextError, match="needs an embedder"):
        _assemble(mgr, s, "retrieval")


def test_auto_decisions(store: SessionStore) -> None:
    mgr = ContextManager(store, embed=hashing_embed)
    s = _conversation(mgr, turns=3, sid="small")
    res = _assemble(mgr, s, "auto", window=8000)
    assert res.mode == "full" and res.signals.history_ratio < 0.4
    # long and chatty: low fact density -> sliding
    s = _conversation(mgr, turns=40, sid="chatty")
    res = _assemble(mgr, s, "auto", window=1500)
    assert res.mode == "sliding" and res.signals.fact_density < 0.2

    async def dense(sid: str, questions: list[str]) -> object:
        sess = await mgr.open_session("t", "u", sid)
        for i, q in enumerate(questions * 4):
            await mgr.append(sess, [MessageIn(role="user", content=f"My order number is ORD-{1000000 + i}."),
                                    MessageIn(role="user", content=q), MessageIn(role="assistant", content=_FILLER * 3)])
        return sess

    same = run(dense("ontopic", ["printer paper jam tray", "printer paper jam tray again", "printer paper jam tray still"]))
    res = _assemble(mgr, same, "auto", window=1500, question="printer paper jam tray help")
    assert res.mode == "summary" and res.signals.discreteness is not None and res.signals.discreteness < 0.55
    jumpy = run(dense("jumpy", ["refund status voucher", "firmware blinking light", "weekend opening hours"]))
    res = _assemble(mgr, jumpy, "auto", window=1500, question="courier building address")
    assert res.mode == "hybrid" and res.signals.discreteness >= 0.55
    # session default mode is used when the request gives none
    run(mgr.set_mode(jumpy, "sliding"))
    res = run(mgr.assemble(jumpy, [MessageIn(role="user", content="x")], context_window=1500, reserved_output=100))
    assert (res.mode, res.requested_mode) == ("sliding", "sliding")


def test_result_is_json_metadata_and_metrics_move(manager: ContextManager) -> None:
    s = _conversation(manager, turns=5)
    before = REGISTRY.get_sample_value("recallserve_context_mode_total", {"mode": "hybrid", "requested": "hybrid"}) or 0
    res = _assemble(manager, s, "hybrid")
    payload = json.loads(res.model_dump_json())
    assert set(payload["breakdown"]) == {"system", "constraints", "entities", "summary", "recent", "retrieved",
                                         "pending", "total"}
    assert ContextResult.model_validate(payload) == res
    meta = res.response_metadata()
    assert "messages" not in meta and meta["mode"] == "hybrid" and json.dumps(meta)
    after = REGISTRY.get_sample_value("recallserve_context_mode_total", {"mode": "hybrid", "requested": "hybrid"})
    assert after == before + 1
    assert REGISTRY.get_sample_value("recallserve_context_assembly_seconds_count", {"mode": "hybrid"}) >= 1
    assert REGISTRY.get_sample_value("recallserve_context_tokens_count", {"part": "recent"}) >= 1


def test_metrics_module_reload_is_safe() -> None:
    import importlib

    import recallserve.serve.context._metrics as metrics

    first = metrics.CONTEXT_MODE_TOTAL
    importlib.reload(metrics)
    assert metrics.CONTEXT_MODE_TOTAL is first


def test_random_conversations_never_overflow(store: SessionStore) -> None:
    rnd = random.Random(7)
    mgr = ContextManager(store, embed=hashing_embed)

    async def build(i: int) -> object:
        s = await mgr.open_session("t", "u", f"r{i}")
        for _ in range(rnd.randint(1, 60)):
            role = rnd.choice(["user", "assistant", "tool"])
            words = " ".join(rnd.choice(["alpha", "ORD-1234567", "$12.50", "never", "ok", "data"]) for _ in range(rnd.randint(1, 80)))
            await mgr.append(s, [MessageIn(role=role, content=words, tool_name="t" if role == "tool" else None)])
        return s

    for i in range(8):
        s = run(build(i))
        for mode in ("full", "sliding", "summary", "retrieval", "hybrid", "auto"):
            window = rnd.randint(300, 4000)
            try:
                res = _assemble(mgr, s, mode, window=window, reserved=100)
            except ContextBudgetError:
                continue
            assert sum(count_tokens(m.content) + 4 for m in _prompt(res)) <= window - 100


def test_auto_switching_ratio_is_over_the_window(store: SessionStore) -> None:
    """003's decide_mode: the history ratio is over the whole window (max_tokens), not the history
    budget; fact density stays over the session's user messages (a measured departure)."""
    mgr = ContextManager(store, embed=hashing_embed)

    async def session(sid: str, facts: int, chats: int) -> object:
        s = await mgr.open_session("t", "u", sid)
        for i in range(facts):
            await mgr.append(s, [MessageIn(role="user", content=f"My order number is ORD-{2000000 + i}.")])
        for i in range(chats):
            await mgr.append(s, [MessageIn(role="user", content=f"Question {i}: how does the return label work?"),
                                 MessageIn(role="assistant", content=_FILLER)])
        return s

    # Facts early, then chatty turns: the session's density (2/3) keeps auto off sliding.
    s = run(session("early-facts", facts=40, chats=20))
    res = _assemble(mgr, s, "auto", window=1500)
    assert res.signals.fact_density == pytest.approx(40 / 60) and res.mode != "sliding"
    # The ratio divides by the window: a large reserve shrinks the budget, not the ratio.
    small = run(session("small", facts=2, chats=1))
    a = _assemble(mgr, small, "auto", window=4000, reserved=100)
    b = _assemble(mgr, small, "auto", window=4000, reserved=3000)
    assert a.signals.history_ratio == b.signals.history_ratio < 0.4 and a.mode == b.mode == "full"
