"""The full in-process pipeline: sessions (context-mode) and the agent loop, with the tiny real model.

SmolLM2-135M is useless as an agent (broken JSON), which is what these tests want: the loop's
retry, partial-answer and metadata plumbing must hold with a model that misbehaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from recallserve.deployments.engines import LlamaCppConfig, LlamaCppEngine
from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.retrieval import local_hybrid_coordinator
from recallserve.serve.agent import Agent, AgentConfig, default_registry
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.context import ContextConfig, ContextManager, LLMSummariser, SessionStore
from recallserve.serve.context import build_router as build_session_router
from recallserve.serve.memory_api import MemoryService, build_router
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings

KEYS = {"sk-acme": "acme", "sk-globex": "globex"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    emb = HashingEmbedder(384)
    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=tmp_path / "memory")

    async def embed(texts: list[str]):  # type: ignore[no-untyped-def]
        return await asyncio.to_thread(emb.embed, texts)

    service = MemoryService(coord, embed, top_k=16, threshold=0.0)
    engine = LlamaCppEngine(LlamaCppConfig(model="smollm2-135m-instruct-q4_1", n_ctx=2048, n_threads=1))
    # NOTE: a 2-message recent window and a short summary keep the forced refresh small.
    context = ContextManager(SessionStore(tmp_path / "sessions.sqlite3"),
                             ContextConfig(summary_keep_recent=2, summary_max_tokens=64), embed=emb.embed,
                             summariser=LLMSummariser(engine))
    agent = Agent(engine, default_registry(demo=True), memory=service,
                  config=AgentConfig(max_steps=2, step_max_tokens=48, router_max_tokens=32))
    pipeline = ChatPipeline(engine, PipelineSettings(max_request_tokens=64, agent_overhead_tokens=600),
                            memory=service, context=context, agent=agent)
    auth = Authenticator(KEYS)
    routers = [build_router(service, auth), build_session_router(context, auth)]
    with TestClient(create_app(pipeline, auth, routers=routers)) as c:
        yield c
    for shard_client in coord.shards:
        shard_client.shard.close()


def _chat(c: TestClient, key: str, text: str, **meta: str) -> dict:
    r = c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
               json={"model": "recallserve", "user": "u1", "max_tokens": 16, "metadata": meta,
                     "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r.json()


def test_session_turns_are_kept_and_reported(client: TestClient) -> None:
    first = _chat(client, "sk-acme", "My order number is 88231 and I must never be called after 6pm.",
                  session_id="s1", agent="off")
    ctx = first["recallserve"]["context"]
    assert ctx["session_id"] == "s1" and ctx["mode"] in ("full", "sliding", "summary", "retrieval", "hybrid")
    assert set(ctx["breakdown"]) >= {"system", "constraints", "entities", "summary", "recent", "retrieved"}
    assert first["recallserve"]["agent"]["route"]["route"] == "direct"

    second = _chat(client, "sk-acme", "What was my order number?", session_id="s1", agent="off",
                   context_mode="full")
    assert second["recallserve"]["context"]["mode"] == "full"
    # The first turn (user + assistant) is now history: more tokens than the first turn had.
    assert second["recallserve"]["context"]["breakdown"]["recent"] > first["recallserve"]["context"]["breakdown"]["recent"]


def test_session_ids_are_per_tenant_and_owned_by_one_user(client: TestClient) -> None:
    _chat(client, "sk-acme", "hello", session_id="private-1", agent="off")
    # another tenant's "private-1" is its own session: it sees nothing of acme's
    _chat(client, "sk-globex", "what did I say?", session_id="private-1", agent="off")
    for key in ("sk-acme", "sk-globex"):
        got = client.get("/v1/sessions/private-1", params={"user": "u1"}, headers={"Authorization": f"Bearer {key}"})
        assert got.status_code == 200 and got.json()["message_count"] == 2
    # inside a tenant the id stays the first user's
    r = client.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-acme"},
                    json={"model": "recallserve", "user": "u2", "max_tokens": 8, "metadata": {"session_id": "private-1"},
                          "messages": [{"role": "user", "content": "what did I say?"}]})
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "metadata.session_id"


@pytest.mark.parametrize(("user", "session_id", "param"), [("u1", "s" * 129, "metadata.session_id"),
                                                           ("u" * 200, "s-long-user", "user")])
def test_session_fields_a_session_cannot_hold_are_a_400(client: TestClient, user: str, session_id: str,
                                                        param: str) -> None:
    r = client.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-acme"},
                    json={"model": "recallserve", "user": user, "max_tokens": 8, "metadata": {"session_id": session_id},
                          "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and "128" in r.json()["error"]["message"]


def test_agent_loop_runs_and_reports_its_trace(client: TestClient) -> None:
    reply = _chat(client, "sk-acme", "What is 12.5 * 8? Use the calculator.", agent="on")
    agent = reply["recallserve"]["agent"]
    assert agent["route"]["route"] == "tools"
    assert agent["steps"], "the loop left no trace"
    assert agent["usage"]["engine_calls"] >= 1
    assert reply["choices"][0]["message"]["content"].strip()


def test_agent_streams_the_answer(client: TestClient) -> None:
    import json

    body = {"model": "recallserve", "max_tokens": 16, "stream": True, "metadata": {"agent": "off"},
            "messages": [{"role": "user", "content": "Say hi."}]}
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-acme"}) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]).strip()
    assert chunks[-1]["recallserve"]["agent"]["route"]["route"] == "direct"


def test_segmented_reasoning_without_experience_memory_is_a_clear_400(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-acme"},
                    json={"model": "recallserve", "max_tokens": 8, "metadata": {"reasoning": "segmented"},
                          "messages": [{"role": "user", "content": "2+2?"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "metadata.reasoning"


def test_sessions_api_shows_the_session_and_forces_a_summary(client: TestClient) -> None:
    key = {"Authorization": "Bearer sk-acme"}
    _chat(client, "sk-acme", "My order number is 88231 and I must never be called after 6pm.", session_id="s9",
          agent="off")
    _chat(client, "sk-acme", "Also, the invoice total was 129.90 EUR.", session_id="s9", agent="off")
    got = client.get("/v1/sessions/s9", params={"user": "u1"}, headers=key)
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["message_count"] == 4 and body["summary"]["until_seq"] == -1
    assert "129.90 EUR" in {e["value"] for e in body["entities"]}

    r = client.post("/v1/sessions/s9/summary", params={"user": "u1"}, headers=key)
    assert r.status_code == 200, r.text
    out = r.json()
    # The real (tiny) model wrote it through LLMSummariser; it covers the first turn (seq 0-1),
    # the 2-message recent window stays verbatim.
    assert out["refreshed"] is True and out["summary"]["text"].strip()
    assert out["summary"]["summariser"] == "smollm2-135m-instruct-q4_1" and out["summary"]["until_seq"] == 1
    again = client.post("/v1/sessions/s9/summary", params={"user": "u1"}, headers=key).json()
    assert again["refreshed"] is False and again["summary"] == out["summary"]


def test_sessions_api_is_per_tenant_and_user(client: TestClient) -> None:
    _chat(client, "sk-acme", "hello", session_id="mine", agent="off")
    for headers, user in (({"Authorization": "Bearer sk-globex"}, "u1"), ({"Authorization": "Bearer sk-acme"}, "u2")):
        r = client.get("/v1/sessions/mine", params={"user": user}, headers=headers)
        assert r.status_code == 404 and r.json()["error"]["param"] == "session_id"
        assert client.post("/v1/sessions/mine/summary", params={"user": user}, headers=headers).status_code == 404
    assert client.get("/v1/sessions/mine", params={"user": "u1"}).status_code == 401
