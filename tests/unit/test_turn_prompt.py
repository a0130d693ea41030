"""What reaches the engine: the turn's parts are in the prompt on every chat path.

A recording engine stands in for the model (this isolates the pipeline's rendering; the real
model's answer from a long session is checked in tests/integration/test_cluster_cpu_local.py).
Every assertion is on the messages the engine received, for agent auto / on / off, streaming or
not, and segmented reasoning: the client's system prompt, the pinned constraint, the rolling
summary's lines, the entity table's values and the recalled memory.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.records import MemoryRecord
from recallserve.serve.agent import Agent, AgentConfig, default_registry
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.context import ContextConfig, ContextManager, SessionStore
from recallserve.serve.engine import ChatMessage, GenerationParams
from recallserve.serve.experience import ExperienceConfig, ExperienceService
from recallserve.serve.memory import MemoryHit, MemoryWrite
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings
from recallserve.serve.turn import RecallConfig
from tests.unit.agent.conftest import ScriptedEngine

KEYS = {"sk-acme": "acme", "sk-globex": "globex"}
CLIENT_SYSTEM = "You work for Acme Coffee; sign every answer with -- Acme."
CONSTRAINT = "Never call me after 6pm, only email me."
CARD = "LC-448812"
MEMORY = "Ticket T-88: the grinder G-2 jammed; fixed by cleaning the burrs."
_SEGMENTED = """Context: card on file
Reasoning:
1. look up the card [principle: recall]
Verification:
- boundary_test: 1 in [0, 2]
Outcome: LC-448812
Confidence: high"""


class RecordingEngine(ScriptedEngine):
    """Records every prompt; replies by the kind of call (router JSON, step JSON, segmented, text)."""

    def __init__(self) -> None:
        super().__init__([], chunk=7)

    @property
    def context_window(self) -> int:
        return 2048

    def _next(self, messages: Sequence[ChatMessage], params: GenerationParams) -> str:
        self.calls.append((list(messages), params))
        schema = params.json_schema
        # NOTE: the card only in the answer to the card question, so the history cannot carry it.
        answer = f"Your card is {CARD}. -- Acme" if "loyalty card number?" in messages[-1].content else "Noted."
        if messages and messages[0].content.startswith("Solve the problem"):
            return _SEGMENTED
        if schema is None:
            return answer
        if "tools" in schema.get("properties", {}):
            return json.dumps({"tools": []})
        return json.dumps({"thought": "known", "type": "final", "answer": answer})

    @property
    def prompts(self) -> list[list[ChatMessage]]:
        return [messages for messages, _ in self.calls]


class OneMemory:
    """A memory backend with one ticket for tenant acme, recording each search."""

    def __init__(self) -> None:
        self.searches: list[tuple[str, str, int | None]] = []

    async def search(self, tenant: str, query: str, k: int | None = None, *, threshold: float | None = None,
                     kinds: Sequence[str] | None = None, topic_prefix: str | None = None,
                     user: str | None = None) -> list[MemoryHit]:
        self.searches.append((tenant, query, k))
        if tenant != "acme":
            return []
        record = MemoryRecord(id="m1", tenant=tenant, source_id="ticket:T-88", kind="text", text=MEMORY, created_at=0.0)
        return [MemoryHit(record=record, score=0.8, similarity=0.8, time_factor=1.0, part_index=0, shard=0)]

    async def write(self, tenant: str, items: Sequence[MemoryWrite]) -> list[str]:
        return [f"w{i}" for i in range(len(items))]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[TestClient, RecordingEngine, ContextManager, OneMemory]]:
    emb = HashingEmbedder(384)
    engine = RecordingEngine()
    memory = OneMemory()
    # NOTE: keep 2 recent messages out of the summary so a forced refresh covers the early turns.
    context = ContextManager(SessionStore(tmp_path / "sessions.sqlite3"),
                             ContextConfig(summary_keep_recent=2), embed=emb.embed)
    agent = Agent(engine, default_registry(demo=True), memory=memory, config=AgentConfig(max_steps=2))
    experiences = ExperienceService(ExperienceConfig(data_dir=tmp_path / "exp", max_tokens=96), emb.embed)
    # NOTE: a 2048-token window with small reserves: the 13 seeded turns do not fit it, so the
    # constraint and the card leave the recent window and must come through the block.
    settings = PipelineSettings(write_back=False, agent_overhead_tokens=400, recall=RecallConfig(prompt_chars=800))
    pipeline = ChatPipeline(engine, settings, memory=memory, context=context, agent=agent, experiences=experiences)
    with TestClient(create_app(pipeline, Authenticator(KEYS))) as c:
        yield c, engine, context, memory
    experiences.close()


def _post(c: TestClient, messages: list[dict[str, Any]], key: str = "sk-acme", **meta: str) -> dict[str, Any]:
    r = c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
               json={"model": "recallserve", "user": "u1", "max_tokens": 64, "metadata": meta, "messages": messages})
    assert r.status_code == 200, r.text
    return r.json()


def _stream(c: TestClient, messages: list[dict[str, Any]], **meta: str) -> tuple[str, dict[str, Any]]:
    body = {"model": "recallserve", "user": "u1", "max_tokens": 64, "stream": True, "metadata": meta,
            "messages": messages}
    with c.stream("POST", "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-acme"}) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    return text, chunks[-1]["recallserve"]


def _seed_session(c: TestClient, context: ContextManager, session_id: str) -> str:
    """Turn 1 gives the constraint and the card, turn 2 a fact (the summary's material), 12 long
    turns follow, then the rolling summary is folded; returns the summary text."""
    _post(c, [{"role": "system", "content": CLIENT_SYSTEM},
              {"role": "user", "content": f"{CONSTRAINT} My loyalty card number is {CARD}."}],
          session_id=session_id, agent="off")
    _post(c, [{"role": "user", "content": "My espresso machine is a Gaggia Classic, bought on 3 May 2024 with order 104208."}],
          session_id=session_id, agent="off")
    filler = "The espresso shot from my machine tastes a bit sour; is grind size, dose or water temperature to blame? "
    for i in range(12):
        _post(c, [{"role": "user", "content": f"Question {i}: {filler * 4}"}], session_id=session_id, agent="off")

    async def fold() -> str:
        # NOTE: each turn starts a background refresh on the app's loop; wait for the last one, then
        # force a fold of what is left (None when that refresh already folded everything).
        for _ in range(300):
            session = await context.open_session("acme", "u1", session_id)
            if not context.is_refreshing(session):
                break
            await asyncio.sleep(0.05)
        state = await context.refresh_summary(session, force=True)
        text = state.text if state is not None else (await context.open_session("acme", "u1", session_id)).summary.text
        assert text
        return text

    return asyncio.run(fold())


def _prompt_text(messages: list[ChatMessage]) -> str:
    return "\n".join(f"{m.role}: {m.content}" for m in messages)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [{"agent": "auto"}, {"agent": "on"}, {"agent": "off"}, {"reasoning": "segmented"}])
def test_every_path_sends_the_assembled_context(rig: Any, path: dict[str, str], stream: bool) -> None:
    c, engine, context, memory = rig
    sid = f"s-{'-'.join(path.values())}-{stream}"
    summary = _seed_session(c, context, sid)
    engine.calls.clear()
    question = [{"role": "system", "content": CLIENT_SYSTEM}, {"role": "user", "content": "What is my loyalty card number?"}]
    # NOTE: summary mode puts the constraint, the summary and the entity table in the block.
    meta = {"session_id": sid, "context_mode": "summary", **path}
    if stream:
        answer, rs = _stream(c, question, **meta)
    else:
        body = _post(c, question, **meta)
        answer, rs = body["choices"][0]["message"]["content"], body["recallserve"]
    assert CARD in answer and rs["context"]["mode"] == "summary"
    assert engine.calls, "no engine call"
    summary_lines = [line for line in summary.splitlines() if line.strip() and CONSTRAINT not in line]
    for prompt in engine.prompts:
        text = _prompt_text(prompt)
        assert CLIENT_SYSTEM in prompt[0].content, text
        # NOTE: on the agent paths (their tool prompt is reserved) turn 1 leaves the recent window,
        # and the constraint and the card come through the block; segmented fits it verbatim.
        assert CONSTRAINT in text and CARD in text, text
        if "agent" in path:
            assert CONSTRAINT in prompt[0].content and CARD in prompt[0].content, text
        assert any(line in text for line in summary_lines), text
        assert MEMORY in prompt[-1].content, text
        assert "What is my loyalty card number?" in prompt[-1].content
    # One recall per turn, with the profile's k (None = the memory tier's configured top_k).
    asked = [s for s in memory.searches if s[1] == "What is my loyalty card number?"]
    assert asked == [("acme", "What is my loyalty card number?", None)]


def test_sessionless_history_is_budgeted_not_cut_by_count(rig: Any) -> None:
    """Without a session the client's messages are the history: all of them while they fit (no
    count limit), the constraint pinned, the client's system prompt kept."""
    c, engine, _, _ = rig
    msgs: list[dict[str, Any]] = [{"role": "system", "content": CLIENT_SYSTEM},
                                  {"role": "user", "content": f"{CONSTRAINT} My loyalty card number is {CARD}."},
                                  {"role": "assistant", "content": "Noted."}]
    for i in range(10):
        msgs += [{"role": "user", "content": f"Question {i} about espresso?"}, {"role": "assistant", "content": f"Answer {i}."}]
    msgs.append({"role": "user", "content": "What is my loyalty card number?"})
    engine.calls.clear()
    body = _post(c, msgs, agent="off")
    prompt = engine.prompts[-1]
    assert body["recallserve"]["context"]["mode"] == "full"
    assert [m.content for m in prompt[1:-1]] == [m["content"] for m in msgs[1:-1]]
    assert CLIENT_SYSTEM in prompt[0].content and CARD in prompt[1].content


def test_tool_scopes_come_from_the_auth_config(tmp_path: Path) -> None:
    engine = RecordingEngine()
    agent = Agent(engine, default_registry(demo=True), config=AgentConfig(max_steps=1, use_router=False))
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), agent=agent)
    auth = Authenticator(KEYS, {"acme": ["basic"]})
    with TestClient(create_app(pipeline, auth)) as c:
        _post(c, [{"role": "user", "content": "What is the status of order 104208?"}], agent="on")
        acme_prompt = engine.prompts[-1][0].content
        _post(c, [{"role": "user", "content": "What is the status of order 104208?"}], key="sk-globex", agent="on")
        globex_prompt = engine.prompts[-1][0].content
    # acme has only the basic tools; globex gets the read-only default, order lookups included.
    assert "order_status" not in acme_prompt and "calculator" in acme_prompt
    assert "order_status" in globex_prompt


def test_a_refund_request_is_declined_in_the_http_answer_and_the_stream(rig) -> None:
    """No tool issues refunds: the rules' reply declines it, with no lookup and no engine call."""
    c, engine, _, _ = rig
    body = _post(c, [{"role": "user", "content": "i want a refund for order #104478 right now"}])
    answer = body["choices"][0]["message"]["content"]
    assert answer.startswith("I'm sorry, but I can't issue a refund from here, so nothing has been changed")
    assert "colleague" in answer and not engine.prompts
    text, _meta = _stream(c, [{"role": "user", "content": "i want a refund for order #104478 right now"}])
    assert text == answer


def test_the_direct_answer_prompt_says_who_the_assistant_is(rig) -> None:
    c, engine, _, _ = rig
    body = _post(c, [{"role": "user", "content": "who are you and what kind of things can you help me with?"}])
    # asked about itself, the rules answer from the tenant's tools, with no engine call
    assert not engine.prompts
    assert body["choices"][0]["message"]["content"].startswith(
        "I'm this company's customer-service assistant. I can help you with: batch info, calculator, current time")
    _post(c, [{"role": "user", "content": "Good morning! How are you today?"}])
    system = engine.prompts[-1][0].content
    assert system.startswith("You are this company's customer-service assistant. You help customers with: ")
    assert "order status" in system and "ticket history" in system and '"type"' not in system


class LoopingEngine(RecordingEngine):
    """A model caught in a greedy loop: its answer repeats one sentence to the token cap."""

    LOOP = "The issue was escalated to engineering for further investigation."

    def _next(self, messages: Sequence[ChatMessage], params: GenerationParams) -> str:
        self.calls.append((list(messages), params))
        answer = "Yes, C-1010 wrote in before. " + " ".join([self.LOOP] * 6)
        if params.json_schema is None:
            return answer
        if "tools" in params.json_schema.get("properties", {}):
            return json.dumps({"tools": []})
        return json.dumps({"thought": "known", "type": "final", "answer": answer})


@pytest.mark.parametrize("agent", ["on", "off"])
def test_an_answer_that_loops_stops_at_its_first_repeat_in_the_http_answer_and_the_stream(agent: str) -> None:
    """What the user gets from a looping model: the sentence once, in the answer and the stream
    alike, and the trace says why (agent on: the JSON step; off: the direct answer)."""
    engine = LoopingEngine()
    loop_agent = Agent(engine, default_registry(demo=True), config=AgentConfig(max_steps=1, use_router=False))
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), agent=loop_agent)
    msgs = [{"role": "user", "content": "Has customer C-1010 contacted support before?"}]
    with TestClient(create_app(pipeline, Authenticator(KEYS))) as c:
        body = _post(c, msgs, agent=agent)
        text, _meta = _stream(c, msgs, agent=agent)
    want = f"Yes, C-1010 wrote in before. {LoopingEngine.LOOP}"
    assert body["choices"][0]["message"]["content"] == want
    assert text.strip() == want and text.count(LoopingEngine.LOOP) == 1
    if agent == "on":
        guard = [s for s in body["recallserve"]["agent"]["steps"] if s["kind"] == "guard"]
        assert guard and guard[0]["data"]["repeated"] == LoopingEngine.LOOP
