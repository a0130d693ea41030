"""Chat recalls the tenant's memories and writes the exchange back, in-process with the tiny real model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from recallserve.deployments.engines import LlamaCppConfig, LlamaCppEngine
from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.retrieval import local_hybrid_coordinator
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.memory_api import MemoryService, build_router
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings

KEYS = {"sk-acme": "acme", "sk-globex": "globex"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, MemoryService]]:
    # NOTE: the hashing embedder isolates the chat wiring from MiniLM's load time; recall quality
    # is measured by `recallserve eval locomo` with the real embedder.
    emb = HashingEmbedder(384)
    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=tmp_path / "memory")

    async def embed(texts: list[str]):  # type: ignore[no-untyped-def]
        return await asyncio.to_thread(emb.embed, texts)

    service = MemoryService(coord, embed, top_k=16, threshold=0.0)
    engine = LlamaCppEngine(LlamaCppConfig(model="smollm2-135m-instruct-q4_1", n_ctx=2048, n_threads=1))
    pipeline = ChatPipeline(engine, PipelineSettings(), memory=service)
    auth = Authenticator(KEYS)
    with TestClient(create_app(pipeline, auth, routers=[build_router(service, auth)])) as c:
        yield c, service
    for shard_client in coord.shards:
        shard_client.shard.close()


def _chat(c: TestClient, key: str, text: str) -> dict:
    r = c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
               json={"model": "recallserve", "user": "u1", "max_tokens": 8,
                     "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_recalls_only_own_tenant_and_writes_back(client: tuple[TestClient, MemoryService]) -> None:
    c, _ = client
    r = c.post("/v1/memories", headers={"Authorization": "Bearer sk-acme"},
               json={"memories": [{"text": "Printer P-200 error E31 was fixed by replacing the fuser unit.",
                                   "source_id": "ticket-31", "kind": "text"}]})
    assert r.status_code == 200, r.text

    acme = _chat(c, "sk-acme", "Printer P-200 shows error E31, how was it fixed before?")
    assert [m["source_id"] for m in acme["recallserve"]["memories"]][:1] == ["ticket-31"]

    globex = _chat(c, "sk-globex", "Printer P-200 shows error E31, how was it fixed before?")
    assert "ticket-31" not in [m["source_id"] for m in globex["recallserve"]["memories"]]

    # The write filter (chat.write_filter, default "facts"): the question above and a greeting are
    # not stored, a statement is, off the request path: poll until it is searchable.
    _chat(c, "sk-acme", "Hi! Thanks a lot.")
    _chat(c, "sk-acme", "Printer P-200 on floor 3 showed error E31 again this morning.")
    deadline = time.monotonic() + 20
    found = []
    while time.monotonic() < deadline and not found:
        s = c.post("/v1/memories/search", headers={"Authorization": "Bearer sk-acme"},
                   json={"query": "Printer P-200 error E31 fixed before floor 3 thanks", "k": 10, "threshold": -1})
        found = [h for h in s.json()["data"] if h["kind"] == "message"]
        time.sleep(0.2)
    assert found, "write-back never became searchable"
    assert found[0]["metadata"]["user"] == "u1"
    assert len(found) == 1 and found[0]["text"].startswith("user: Printer P-200 on floor 3 showed error E31 again")


def test_a_question_longer_than_a_memory_is_written_back_clipped(client: tuple[TestClient, MemoryService]) -> None:
    """A chat message may be far longer than a memory (32,000 characters) where the model's context is long
    (vLLM profiles): the write-back (``MemoryService.write``, what the pipeline calls off the request path)
    stores its exchange with its start and its end and ``metadata.clipped_chars``; before, it failed in the
    background and the exchange was not stored. (The test model's 2k context refuses such a chat with a 400.)"""
    from recallserve.serve.pii import for_write_back
    from recallserve.serve.write_filter import exchange_write, worth_storing

    c, service = client
    line = "Printer P-200 on floor 3 showed error E31 again this morning after the fuser swap. "
    question = "Serial log follows. " + line * 600 + "Last line: the tray 2 sensor reads 41 degrees."
    kept = worth_storing(question, "Replace the tray 2 sensor.")
    assert kept is not None and len(kept) > 45_000
    item = exchange_write(kept, speaker="user", user="u1", request_id="r-long", session="", pii=for_write_back("mask"))
    [rid] = asyncio.run(service.write("acme", [item]))
    s = c.post("/v1/memories/search", headers={"Authorization": "Bearer sk-acme"},
               json={"query": "tray 2 sensor 41 degrees serial log", "k": 10, "threshold": -1})
    [found] = [h for h in s.json()["data"] if h["kind"] == "message"]
    text, meta = found["text"], found["metadata"]
    assert found["id"] == rid and len(text) <= 32_000 and text.startswith("user: Serial log follows.")
    assert meta["clipped_chars"] == len(kept) - len(text) + len(f"\n[… {meta['clipped_chars']} characters left out …]\n")
    # the end survives: the question's last line and the answer
    assert text.endswith("Last line: the tray 2 sensor reads 41 degrees.\nassistant: Replace the tray 2 sensor.")
