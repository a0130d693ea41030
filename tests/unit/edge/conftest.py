"""The whole ingress app in-process, for the edge's checks: limits, errors and the PII policy.

Real memory service (two hybrid shards, the hashing embedder as a MiniLM double), real
experience service, real session store and context manager with the extractive summariser, real
turn-trace store and the console's routes; the
model is a scripted engine (these tests isolate what the edge and the write paths do with a
request, not what a model answers). Four tenants: one per PII policy, acme (default: mask),
strict (reject), lab (allow), and globex (default policy), acme's neighbour in tests/security.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient

from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.retrieval import local_hybrid_coordinator
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.context import ContextConfig, ContextManager, SessionStore
from recallserve.serve.context import build_router as build_session_router
from recallserve.serve.engine import ChatMessage, GenerationParams
from recallserve.serve.experience import ExperienceConfig, ExperienceService, ExperienceStore
from recallserve.serve.experience import build_router as build_experience_router
from recallserve.serve.memory_api import MemoryService, build_router
from recallserve.serve.console import build_console_router, tenant_records
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings
from recallserve.serve.statedb import Database
from recallserve.serve.traces import TraceRecorder, TraceStore
from recallserve.serve.traces import build_router as build_turn_router
from tests.unit.agent.conftest import ScriptedEngine

KEYS = {"sk-acme": "acme", "sk-strict": "strict", "sk-lab": "lab", "sk-globex": "globex"}
PII_POLICY = {"strict": "reject", "lab": "allow"}
ANSWER = "Noted: order 104208 and ticket T-88 are on file."
# Personal data in every form the masker covers, and the raw fragments that must not be stored.
PII_TEXT = ("My card is 4111 1111 1111 1111, phone +1 415 555 0100, SSN 123-45-6789, ID card 11010519491231002X, "
            "mail jane.doe@example.com, IBAN DE89 3704 0044 0532 0130 00, and my password is hunter2.")
RAW = ["4111 1111 1111 1111", "555 0100", "123-45-6789", "11010519491231002X", "jane.doe@example.com",
       "DE89 3704", "hunter2"]
# Ids the agent needs: never personal data.
IDS_TEXT = "Order 104208, ticket T-88, batch B-2207, loyalty LC-448812."
IDS = ["104208", "T-88", "B-2207", "LC-448812"]


class FixedEngine(ScriptedEngine):
    """Answers every call with :data:`ANSWER` (no script to run out)."""

    def __init__(self) -> None:
        super().__init__([])

    def _next(self, messages: Sequence[ChatMessage], params: GenerationParams) -> str:
        self.calls.append((list(messages), params))
        return ANSWER


def boom_router() -> APIRouter:
    """A route that fails the way a bug would (the unexpected-exception check)."""
    router = APIRouter()

    @router.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("bug while handling card 4111 1111 1111 1111")

    return router


def build_app(tmp_path: Path, *, max_body_bytes: int | None = None, engine: FixedEngine | None = None,
              settings: PipelineSettings | None = None, context_config: ContextConfig | None = None,
              experience_config: dict[str, Any] | None = None, db: Database | None = None) -> tuple[FastAPI, MemoryService]:
    """The ingress app with the three routers of ``deployments/ingress.py`` (and :func:`boom_router`);
    ``engine`` (default a fresh :class:`FixedEngine`) records every prompt; ``settings`` the ``chat``
    section; ``context_config`` the ``context`` section; ``experience_config`` settings of the ``experience`` one;
    ``db`` the state database of the session, experience and trace stores (None: SQLite files under ``tmp_path``)."""
    emb = HashingEmbedder(384)
    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=tmp_path / "memory")

    async def embed(texts: list[str]):  # type: ignore[no-untyped-def]
        return await asyncio.to_thread(emb.embed, texts)

    auth = Authenticator(KEYS, pii=PII_POLICY)
    memory = MemoryService(coord, embed, top_k=16, threshold=0.0, pii_for=auth.pii_for)
    context = ContextManager(SessionStore(tmp_path / "sessions.sqlite3", db=db),
                             context_config or ContextConfig(summary_keep_recent=1), pii_for=auth.pii_for)
    experiences = ExperienceService(ExperienceConfig(data_dir=tmp_path / "exp", **(experience_config or {})), emb.embed,
                                    memory=memory, pii_for=auth.pii_for,
                                    store=ExperienceStore(tmp_path / "exp", db=db))
    traces = TraceRecorder(TraceStore(tmp_path / "turns.sqlite3", db=db))
    pipeline = ChatPipeline(engine or FixedEngine(), settings or PipelineSettings(), memory=memory, context=context,
                            experiences=experiences, traces=traces)
    routers = [build_router(memory, auth), build_experience_router(experiences, auth),
               build_session_router(context, auth), build_turn_router(traces.store, auth),
               build_console_router(auth, tenant_records(coord.stats)), boom_router()]
    extra = {} if max_body_bytes is None else {"max_body_bytes": max_body_bytes}
    return create_app(pipeline, auth, routers=routers, **extra), memory


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app, memory = build_app(tmp_path)
    # NOTE: raise_server_exceptions=False: the client must see what a real one would (the 500 body).
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c
    for shard_client in memory.coordinator.shards:
        shard_client.shard.close()


def headers(tenant: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer sk-{tenant}", **extra}


def wait_for_source(c: TestClient, tenant: str, source_id: str, timeout_s: float = 10.0) -> list[dict]:
    """The memories with ``source_id`` once a background write-back has stored them."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = c.get("/v1/memories", params={"source_id": source_id}, headers=headers(tenant))
        assert r.status_code == 200, r.text
        if r.json()["data"] or time.monotonic() > deadline:
            return r.json()["data"]
        time.sleep(0.05)


def assert_envelope(r, status: int, param: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    """``r`` is ``status`` in the JSON error envelope (naming ``param`` when given), with a request id."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    if param is not None:
        assert body["error"]["param"] == param, body
    assert r.headers.get("x-request-id"), r.headers
    return body["error"]
