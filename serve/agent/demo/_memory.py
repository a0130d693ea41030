"""In-process :class:`~serve.memory.MemoryBackend` over ``memory_shards`` for the demo and the eval.

The served cluster reaches its memory through the deployments' backend; the demo and
``recallserve demo`` / ``recallserve eval agent`` run in one process, so they wrap a local coordinator and the
MiniLM embedder the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence
from typing import Any

from serve.memory import MemoryHit, MemoryWrite

__all__ = ["LocalMemory"]


class LocalMemory:
    """MemoryBackend over ``memory_shards.local_coordinator`` with an embedder."""

    #: Results when the caller gives no k (the chat's recall uses the backend's default).
    top_k = 16

    def __init__(self, embedder: Any | None = None, n_shards: int = 1) -> None:
        from memory_shards.coordinator import local_coordinator
        from memory_shards.embedders import MiniLMEmbedder

        self.embedder = embedder or MiniLMEmbedder()
        self.coordinator = local_coordinator(n_shards, self.embedder.model_id, self.embedder.dim)

    async def search(
        self, tenant: str, query: str, k: int | None = None, *, threshold: float | None = None,
        kinds: Sequence[str] | None = None, topic_prefix: str | None = None,
    ) -> list[MemoryHit]:
        k = k or self.top_k
        from kernels import ScoreParams
        from memory_shards.config import SearchFilters

        vec = await asyncio.to_thread(self.embedder.embed, [query])
        params = ScoreParams(threshold=threshold) if threshold is not None else ScoreParams()
        filters = SearchFilters(kinds=list(kinds) if kinds else None, topic_prefix=topic_prefix) \
            if (kinds or topic_prefix) else None
        hits = (await self.coordinator.search(tenant, vec, k, params=params, filters=filters))[0]
        return list(hits)

    async def write(self, tenant: str, items: Sequence[MemoryWrite]) -> list[str]:
        from memory_shards.coordinator import embed_records
        from memory_shards.records import MemoryRecord

        now = time.time()
        records = []
        for it in items:
            meta = {k: v for k, v in it.metadata.items() if isinstance(v, (str, int, float, bool))}
            records.append(MemoryRecord(
                tenant=tenant, source_id=it.source_id or "text:" + hashlib.sha256(it.text.encode()).hexdigest()[:24], kind=it.kind, text=it.text,
                metadata=meta, topic_path=it.topic or "", created_at=it.created_at or now, expires_at=it.expires_at,
                image_hash=str(it.metadata.get("image_sha256")) if it.metadata.get("image_sha256") else None,
            ))
        embedded = await asyncio.to_thread(embed_records, self.embedder, records)
        return await self.coordinator.upsert(embedded)
