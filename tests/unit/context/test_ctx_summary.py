"""Rolling summary: trigger and cooldown, batching, tool results, the prompt, off-path scheduling."""

from __future__ import annotations

import asyncio

import pytest

from recallserve.serve.context import (
    ContextConfig,
    ContextManager,
    ExtractiveSummariser,
    LLMSummariser,
    MessageIn,
    SessionStore,
)
from recallserve.serve.context._summary import (
    SUMMARY_PROMPT,
    plan_batches,
    render_messages,
    summary_candidates,
)
from recallserve.serve.context._types import Message, Session, SummaryState

from .conftest import StubEngine, run


def _msgs(n: int, tokens: int = 100) -> list[Message]:
    return [Message(seq=i, role="user" if i % 2 == 0 else "assistant", content=f"m{i}", tokens=tokens,
                    timestamp=1000.0 + i) for i in range(n)]


def _session(until: int = -1, updated: float = 0.0) -> Session:
    return Session(id="s", tenant="t", user="u", created_at=0,
                   summary=SummaryState(text="", until_seq=until, updated_at=updated))


def test_trigger_threshold_and_keep_recent() -> None:
    cfg = ContextConfig(summary_trigger_tokens=1000, summary_keep_recent=4)
    assert summary_candidates(_session(), _msgs(13), cfg, now=0) == []  # 9 x 100 < 1000
    due = summary_candidates(_session(), _msgs(14), cfg, now=0)
    assert [m.seq for m in due] == list(range(10))  # the newest 4 stay verbatim
    assert [m.seq for m in summary_candidates(_session(), _msgs(6), cfg, now=0, force=True)] == [0, 1]


def test_cooldown_by_time_or_messages() -> None:
    cfg = ContextConfig(summary_trigger_tokens=500, summary_keep_recent=0, summary_cooldown_s=1800,
                        summary_cooldown_messages=20)
    msgs = _msgs(40)
    recent = _session(until=29, updated=10_000.0)  # 10 new messages = 1000 tokens, over the trigger
    assert summary_candidates(recent, msgs, cfg, now=10_000.0 + 60) == []  # cooled down neither way
    assert len(summary_candidates(recent, msgs, cfg, now=10_000.0 + 1800)) == 10  # 30 min passed
    older = _session(until=19, updated=10_000.0)  # 20 new messages
    assert len(summary_candidates(older, msgs, cfg, now=10_000.0 + 60)) == 20


def test_batches_respect_the_token_limit() -> None:
    cfg = ContextConfig(summary_batch_tokens=4000, summary_max_tokens=600)
    msgs = _msgs(100, tokens=150)
    batches = plan_batches(msgs, cfg)
    assert [m.seq for b in batches for m in b] == list(range(100))
    for b in batches:
        # lines + previous summary + instructions fit in one 4000-token call
        assert sum(m.tokens + 16 for m in b) + 600 + 300 <= 4000
    assert len(batches) == 6
    huge = [Message(seq=0, role="user", content="x", tokens=9000)]
    assert plan_batches(huge, cfg) == [huge]


def test_tool_results_become_question_and_time() -> None:
    msgs = [
        Message(seq=0, role="user", content="Is the blender in stock?", timestamp=0),
        Message(seq=1, role="tool", content='{"sku": "SP-1", "available": 3}', category="tool_result",
                tool_name="check_stock", timestamp=60),
        Message(seq=2, role="user", content="Never call me.", category="constraint", retention=3, timestamp=120),
    ]
    lines = render_messages(msgs)
    assert lines[1] == ('[1970-01-01 00:01] tool check_stock was consulted to answer: '
                        '"Is the blender in stock?" (output not summarised)')
    assert "SP-1" not in "\n".join(lines)
    assert lines[2].endswith("user (constraint, pinned): Never call me.")
    # the question can come from before the batch
    assert '"Is the blender in stock?"' in render_messages(msgs[1:2], history=msgs[:1])[0]


def test_llm_prompt_rules_and_extractive_cap() -> None:
    engine = StubEngine(["- updated"])
    out = run(LLMSummariser(engine).summarise("- old", ["[x] user (fact): Dr. Ana Ruiz paid $5"], 200))
    assert out == "- updated"
    system, user = engine.prompts[0]
    assert "full name with its title" in system.content and "never merge" in system.content.lower()
    assert "Tool uses are not facts" in system.content
    assert "- old" in user.content and "Dr. Ana Ruiz paid $5" in user.content
    assert engine.params[0].max_tokens == 200 and engine.params[0].temperature == 0.0
    assert "{words}" in SUMMARY_PROMPT

    ext = ExtractiveSummariser()
    lines = [f"[2026-01-01 00:0{i}] user (fact): fact number {i} with some words" for i in range(8)]
    lines += ["[2026-01-01 00:09] user (constraint, pinned): Never call me.", "[x] assistant (chat): hello"]
    full = run(ext.summarise("", lines, 1000))
    assert "Never call me" not in full and "hello" not in full and full.count("\n") == 7
    capped = run(ext.summarise("", lines, 40))
    assert "fact number 7" in capped and "fact number 0" not in capped  # oldest dropped first


def test_refresh_is_off_path_stored_and_not_duplicated(tmp_path) -> None:
    async def go() -> None:
        store = SessionStore(tmp_path / "s.sqlite3")
        engine = StubEngine(["- batch one", "- batch two"] * 10)
        now = [0.0]
        mgr = ContextManager(store, ContextConfig(summary_trigger_tokens=300, summary_keep_recent=2,
                                                  summary_batch_tokens=1200, summary_max_tokens=200),
                             summariser=LLMSummariser(engine), clock=lambda: now[0])
        s = await mgr.open_session("t", "u", "s")
        for i in range(12):
            await mgr.append(s, [MessageIn(role="user", content=f"question {i} " + "word " * 60)])
        task = mgr.start_summary(s)
        assert isinstance(task, asyncio.Task) and not task.done()  # the caller did not wait
        await asyncio.sleep(0)  # let the task start (it claims the session first thing)
        second = await mgr.refresh_summary(s)  # while the first runs: refused, not duplicated
        state = await task
        assert second is None
        assert state is not None and state.until_seq == 9 and state.summariser == "stub-model"
        assert len(engine.prompts) >= 2  # 10 messages x ~65 tokens do not fit one 1200-token batch
        # the second batch's prompt carries the first batch's summary forward
        assert "- batch one" in engine.prompts[1][1].content
        stored = await store.get("t", "u", "s")
        assert stored.summary.text == state.text and stored.summary.until_seq == 9
        # not due again right after (nothing new)
        assert await mgr.refresh_summary(s) is None
        store.close()

    run(go())


def test_failed_refresh_is_logged_and_state_kept(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    class Broken(StubEngine):
        async def chat(self, messages, params):  # type: ignore[override]
            raise RuntimeError("model crashed")

    async def go() -> None:
        store = SessionStore(tmp_path / "s.sqlite3")
        mgr = ContextManager(store, ContextConfig(summary_trigger_tokens=10, summary_keep_recent=0),
                             summariser=LLMSummariser(Broken([])))
        s = await mgr.open_session("t", "u", "s")
        await mgr.append(s, [MessageIn(role="user", content="word " * 40)])
        task = mgr.start_summary(s)
        with pytest.raises(RuntimeError):
            await task
        await asyncio.sleep(0)
        assert (await store.get("t", "u", "s")).summary.until_seq == -1
        store.close()

    with caplog.at_level("WARNING"):
        run(go())
    assert "rolling summary failed" in caplog.text


def test_llm_summary_loses_repeated_lines_but_keeps_distinct_ones() -> None:
    from recallserve.serve.context._summary import drop_repeated_lines

    looped = "- **Returns**:\n  - **Returns within 30 days**\n  - Opened items are fine\n" \
             "  - **returns within 30 days**\n  -   Opened items are FINE\n\n- Order 104208 (not 104209)\n- Order 104209"
    assert drop_repeated_lines(looped).splitlines() == [
        "- **Returns**:", "  - **Returns within 30 days**", "  - Opened items are fine", "",
        "- Order 104208 (not 104209)", "- Order 104209"]
