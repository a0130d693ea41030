"""Turn traces: what the pipeline stores for each answered turn, and the store's bounds.

The pipeline checks go through the edge rig's whole app (``tests/unit/edge/conftest.py``): the
trace is read back over HTTP and compared with the prompt the engine really received.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recallserve.serve.engine import ChatMessage
from recallserve.serve.pii import mask_pii
from recallserve.serve.traces import TraceConfig, TraceNotFoundError, TraceStore, TurnTrace, build_trace
from recallserve.serve.traces._build import MAX_ITEMS
from recallserve.serve.turn import Turn
from tests.unit.edge.conftest import FixedEngine, build_app, headers

PII = "reach me at jane.doe@example.com or +1 415 555 0100"


def _trace(i: int, created_at: float, session_id: str | None = "s1") -> TurnTrace:
    return TurnTrace(id=f"r{i}", created_at=created_at, user="u1", session_id=session_id, path="plain",
                     question=f"question {i}", answer="a", finish_reason="stop")


def _wait_trace(c: TestClient, tenant: str, turn_id: str) -> dict:
    deadline = time.monotonic() + 30
    while (r := c.get(f"/v1/turns/{turn_id}", headers=headers(tenant))).status_code != 200:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.05)
    return r.json()


def test_the_trace_holds_the_prompt_the_engine_received_masked(tmp_path: Path) -> None:
    engine = FixedEngine()
    app, memory = build_app(tmp_path, engine=engine)
    with TestClient(app) as c:
        r_mem = c.post("/v1/memories", headers=headers("acme"), json={"memories": [{"text": "Order 104208 ships by DPD."}]})
        assert r_mem.status_code == 200
        body = {"model": "recallserve", "user": "jane", "metadata": {"session_id": "s9"},
                "messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": f"Where is order 104208? {PII}"}]}
        r = c.post("/v1/chat/completions", headers=headers("acme"), json=body)
        assert r.status_code == 200, r.text
        trace = _wait_trace(c, "acme", r.json()["recallserve"]["request_id"])
        sent = engine.calls[-1][0]
        assert trace["prompt"] == [{"role": m.role, "content": mask_pii(m.content)} for m in sent]
        assert "Be brief." in trace["prompt"][0]["content"] and "Order 104208 ships by DPD." in trace["prompt"][-1]["content"]
        assert "jane.doe@example.com" not in str(trace) and "555 0100" not in str(trace)
        assert trace["question"] == mask_pii(f"Where is order 104208? {PII}")
        assert trace["session_id"] == "s9" and trace["user"] == "jane" and trace["path"] == "plain"
        assert [m["text"] for m in trace["memories"]] == ["Order 104208 ships by DPD."]
        assert [m["id"] for m in trace["memories"]] == r_mem.json()["ids"]  # ids are never masked
        assert trace["context"]["breakdown"]["total"] > 0 and trace["timings_ms"]["total"] >= trace["timings_ms"]["recall"]
        listed = c.get("/v1/turns", params={"session_id": "s9"}, headers=headers("acme")).json()["data"]
        assert [t["id"] for t in listed] == [trace["id"]]
        sessions = c.get("/v1/turns/sessions", headers=headers("acme")).json()["data"]
        assert [(s["session_id"], s["last_turn_id"], s["turns"]) for s in sessions] == [("s9", trace["id"], 1)]
        # streaming answers are traced too
        with c.stream("POST", "/v1/chat/completions", headers=headers("acme"), json={**body, "stream": True}) as s:
            assert s.status_code == 200
            rid = s.headers["x-request-id"]
            s.read()
        assert _wait_trace(c, "acme", rid)["stream"] is True
    for shard_client in memory.coordinator.shards:
        shard_client.shard.close()


def test_an_agent_turns_trace_holds_its_route_tool_call_and_step_prompt(tmp_path: Path) -> None:
    """The stored prompt is the one the first loop step received, and the tool call is there with
    its arguments, status and observation (no raw result)."""
    from loadtests._console_app import build_console_app

    app, coord, engine = build_console_app(tmp_path, {"sk-acme": "acme"})
    with TestClient(app) as c:
        r = c.post("/v1/chat/completions", headers=headers("acme"),
                   json={"model": "recallserve", "messages": [{"role": "user", "content": f"Where is order 104208? {PII}"}]})
        assert r.status_code == 200, r.text
        trace = _wait_trace(c, "acme", r.json()["recallserve"]["request_id"])
        assert trace["path"] == "agent" and trace["route"]["route"] == "tools" and trace["finish_reason"] == "final"
        (call,) = trace["tool_calls"]
        assert call["name"] == "order_status" and call["args"] == {"order_id": "104208"} and call["status"] == "ok"
        assert '"status": "delivered"' in call["observation"] and "result" not in call
        assert [s["kind"] for s in trace["steps"]][-1] == "final"
        # NOTE: the rules fixed step 1's call, so the loop's one engine call is the answer step: its
        # prompt is the stored one, then the step and its observation
        (step,) = [m for m, p in engine.calls if p.json_schema]
        assert [m.role for m in step[len(trace["prompt"]):]] == ["assistant", "user"]
        assert trace["prompt"] == [{"role": m.role, "content": mask_pii(m.content)} for m in step[:len(trace["prompt"])]]
        assert trace["prompt"][-1]["content"].endswith("Question: Where is order 104208? reach me at [EMAIL] or [PHONE]")
    for shard_client in coord.shards:
        shard_client.shard.close()


def test_texts_and_the_prompt_are_cut_to_the_configured_sizes() -> None:
    config = TraceConfig(text_chars=100, prompt_chars=600)
    turn = Turn(question="q" * 500)
    prompt = [ChatMessage(role="system", content="s" * 400), ChatMessage(role="user", content="u" * 400),
              ChatMessage(role="user", content="last")]
    steps = [{"step": i, "kind": "thought", "content": "t"} for i in range(150)]
    trace = build_trace(turn, request_id="r" * 128, user="u", path="plain", stream=False, answer="a" * 5000,
                        finish="stop", prompt_tokens=1, completion_tokens=1, prompt=prompt,
                        agent_meta={"steps": steps}, started=time.perf_counter(), config=config)
    assert [s["step"] for s in trace.steps] == list(range(MAX_ITEMS))
    assert trace.truncated and trace.id == "r" * 128
    assert len(trace.question) == 100 and len(trace.answer) == 100 and trace.answer.endswith("[...cut]")
    assert sum(len(m["content"]) for m in trace.prompt) <= 600 + len(" [...cut]")
    assert trace.prompt[0]["content"] == "s" * 400 and trace.prompt[1]["content"].endswith("[...cut]")


def test_tool_arguments_and_observations_are_masked() -> None:
    meta = {"route": {"route": "tools", "tools": ["lookup"], "source": "rules"}, "finish_reason": "final",
            "steps": [{"step": 1, "kind": "observation", "content": f"Observation(lookup): {PII}"}],
            "tool_calls": [{"id": "c1", "step": 1, "name": "lookup", "args": {"email": "jane.doe@example.com"},
                            "status": "ok", "observation": PII, "elapsed_ms": 1.0}], "elapsed_ms": 3.0}
    trace = build_trace(Turn(question="hi"), request_id="r1", user="u", path="agent", stream=False, answer="ok",
                        finish="stop", prompt_tokens=1, completion_tokens=1, prompt=[], agent_meta=meta,
                        started=time.perf_counter(), config=TraceConfig())
    assert trace.tool_calls[0]["args"] == {"email": "[EMAIL]"} and "[PHONE]" in trace.tool_calls[0]["observation"]
    assert "jane.doe" not in trace.model_dump_json() and trace.finish_reason == "final"


def test_the_store_keeps_a_tenants_newest_traces_within_the_cap_and_the_days(tmp_path: Path, state_db: Any) -> None:
    store = TraceStore(tmp_path / "t.sqlite3", TraceConfig(max_per_tenant=3, retention_days=1), db=state_db)
    now = time.time()

    async def scenario() -> None:
        await store.put("acme", _trace(0, now - 2 * 86400))  # past retention
        assert await store.recent("acme") == [] and await store.count("acme") == 1  # hidden before it is pruned
        with pytest.raises(TraceNotFoundError):
            await store.get("acme", "r0")
        for i in range(1, 6):
            await store.put("acme", _trace(i, now + i))
        await store.put("globex", _trace(9, now))
        assert [t.id for t in await store.recent("acme")] == ["r5", "r4", "r3"]
        assert await store.count("acme") == 3 and await store.count("globex") == 1
        assert [t.id for t in await store.recent("acme", 10, before=now + 5)] == ["r4", "r3"]
        with pytest.raises(TraceNotFoundError):
            await store.get("globex", "r5")
        assert [s.session_id for s in await store.sessions("globex")] == ["s1"]

    asyncio.run(scenario())
    store.close()


def test_tracing_can_be_switched_off(tmp_path: Path) -> None:
    from recallserve.serve.traces import TraceRecorder

    store = TraceStore(tmp_path / "t.sqlite3")
    recorder = TraceRecorder(store, TraceConfig(enabled=False))
    asyncio.run(recorder.record("acme", Turn(question="q"), request_id="r1", user="u", path="plain", stream=False,
                                answer="a", finish="stop", prompt_tokens=0, completion_tokens=0, prompt=[],
                                agent_meta=None, started=time.perf_counter()))
    assert asyncio.run(store.count("acme")) == 0
    store.close()
