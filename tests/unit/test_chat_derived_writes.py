"""Write-backs that help and cannot mislead (issue 40), over HTTP with the tiny real model: an answer
is stored as a derived memory, ranks below the record it came from in /v1/memories/search, and
comes back in a later chat's recall only beside a record it cited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recallserve.deployments.engines import LlamaCppConfig, LlamaCppEngine
from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.retrieval import local_hybrid_coordinator
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.memory import MemoryWrite, derived_metadata
from recallserve.serve.memory_api import MemoryService, build_router
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings
from recallserve.serve.write_filter import WriteFilterConfig

pytestmark = pytest.mark.slow  # NOTE: the tiny real model (llama.cpp)

KEY = {"Authorization": "Bearer sk-acme"}
TICKET = "Ticket T-1121 (batch B-2320): the display flickers and goes blank. Fix: reseated the loose LCD ribbon cable."
QUESTION = "My display flickers, batch B-2320. Has this happened before?"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, MemoryService]]:
    emb = HashingEmbedder(384)
    coord = local_hybrid_coordinator(1, emb.model_id, emb.dim, data_root=tmp_path / "memory")

    async def embed(texts: list[str]) -> Any:
        return await asyncio.to_thread(emb.embed, texts)

    service = MemoryService(coord, embed, top_k=16, threshold=0.0)
    engine = LlamaCppEngine(LlamaCppConfig(model="smollm2-135m-instruct-q4_1", n_ctx=2048, n_threads=1))
    # NOTE: write_filter all: the question alone is no statement, and the test needs its exchange stored.
    pipeline = ChatPipeline(engine, PipelineSettings(write_filter=WriteFilterConfig(mode="all")), memory=service)
    auth = Authenticator({"sk-acme": "acme"})
    with TestClient(create_app(pipeline, auth, routers=[build_router(service, auth)])) as c:
        yield c, service
    for shard_client in coord.shards:
        shard_client.shard.close()


def _chat(c: TestClient, text: str) -> dict[str, Any]:
    r = c.post("/v1/chat/completions", headers=KEY, json={"model": "recallserve", "user": "u1", "max_tokens": 24,
                                                            "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r.json()


def _search(c: TestClient, query: str) -> list[dict[str, Any]]:
    r = c.post("/v1/memories/search", headers=KEY, json={"query": query, "k": 10, "threshold": -1})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_an_answer_asked_again_ranks_below_its_source_and_a_citing_one_helps_later(
        client: tuple[TestClient, MemoryService]) -> None:
    c, service = client
    r = c.post("/v1/memories", headers=KEY, json={"memories": [{"text": TICKET, "source_id": "ticket:T-1121"}]})
    assert r.status_code == 200, r.text
    _chat(c, QUESTION)  # whatever the model answered (it cites no record) is written back off the request path
    deadline, hits = time.monotonic() + 20, []
    while time.monotonic() < deadline and not any(h["kind"] == "message" for h in hits):
        hits = _search(c, QUESTION)
        time.sleep(0.2)
    exchange = next(h for h in hits if h["kind"] == "message")
    assert exchange["metadata"]["derived"] is True and exchange["metadata"]["cites"] == ""
    # the exchange repeats the question's words and matches it closer than the ticket, yet ranks below
    assert exchange["similarity"] > next(h for h in hits if h["source_id"] == "ticket:T-1121")["similarity"]
    assert hits[0]["source_id"] == "ticket:T-1121"
    # a later conversation: the uncited answer is not recalled; a conclusion citing the ticket (the
    # agent's write-back form) comes back after the ticket, never in its place
    asyncio.run(service.write("acme", [MemoryWrite(
        text=f"User asked: {QUESTION}\nAgent answered: Yes, ticket T-1121: the loose LCD ribbon cable was reseated.",
        kind="message", source_id="exchange:right", metadata=derived_metadata(["ticket:T-1121"]))]))
    later = _chat(c, "What was done about the display that flickers on batch B-2320?")
    recalled = [m["source_id"] for m in later["recallserve"]["memories"]]
    assert recalled[0] == "ticket:T-1121" and "exchange:right" in recalled
    assert exchange["source_id"] not in recalled
