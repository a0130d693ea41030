"""An in-process memory API: two hybrid shards on disk, the hashing embedder, three API keys.

The hashing embedder is a test double for MiniLM (deterministic, no model load); every other
piece (shards with WAL, BM25, fusion, service, router, auth, error handlers) is the real code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.retrieval import local_hybrid_coordinator
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.api.errors import install_error_handlers
from recallserve.serve.memory_api import MemoryService, build_router

KEYS = {"sk-acme": "acme", "sk-globex": "globex", "sk-shared": "shared"}


def make_service(data_root: Path, threshold: float = 0.35) -> MemoryService:
    emb = HashingEmbedder(384)
    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=data_root)

    async def embed(texts: list[str]):
        return await asyncio.to_thread(emb.embed, texts)

    return MemoryService(coord, embed, top_k=16, threshold=threshold)


def close_service(service: MemoryService) -> None:
    for client in service.coordinator.shards:
        client.shard.close()


def make_app(service: MemoryService) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(build_router(service, Authenticator(KEYS)))
    return app


@pytest.fixture
def service(tmp_path: Path) -> Iterator[MemoryService]:
    svc = make_service(tmp_path / "memory")
    yield svc
    close_service(svc)


@pytest.fixture
def client(service: MemoryService) -> Iterator[TestClient]:
    with TestClient(make_app(service)) as c:
        yield c


def auth(tenant_key: str) -> dict[str, str]:
    """Headers for one of ``KEYS``."""
    return {"Authorization": f"Bearer {tenant_key}"}


def search_ids(client: TestClient, query: str, k: int, key: str = "sk-acme") -> list[str]:
    """Ids of a ``POST /v1/memories/search`` answer, ranked, with no decay and no threshold (only the ranking counts)."""
    body = {"query": query, "k": k, "decay": {"decay": "none"}, "threshold": 0.0}
    r = client.post("/v1/memories/search", json=body, headers=auth(key))
    assert r.status_code == 200, r.text
    return [hit["id"] for hit in r.json()["data"]]
