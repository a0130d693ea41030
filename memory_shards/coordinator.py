"""The sharded coordinator: routing, fan-out and one heap merge of the shards' top-k.

Routing (N shards, keys from :mod:`memory_shards.records`)::

    private record of tenant t  -> shard  uint64(tenant_key(t)) mod N   (a tenant lives on one shard)
    shared record (tenant "shared") -> shard uint64(source_key(source_id)) mod N   (spread by source)

A search fans out to every shard (shared records may be anywhere); each shard returns its
deduplicated top-k and the coordinator merges them with ``heapq.merge`` on
``(-score, shard, rank in shard)``, keeping the first hit per source id, until k. Because a
source's best row on a shard is in that shard's top-k whenever the source is in the global
top-k, the merge equals an unsharded exact search (up to the order of exactly tied scores).

Shards are reached through the async :class:`ShardClient` protocol, so a Ray deployment handle
can stand in for :class:`LocalShardClient` without changing the coordinator.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from kernels import ScoreParams

from .config import SearchFilters, SearchHit, ShardConfig
from .embedders import Embedder
from .records import SHARED_TENANT_NAME, EmbeddedRecord, MemoryRecord, source_key, tenant_key
from .shard import MemoryShard

__all__ = ["ShardClient", "LocalShardClient", "MemoryCoordinator", "embed_records", "local_coordinator"]

_U64 = 1 << 64


@runtime_checkable
class ShardClient(Protocol):
    """What the coordinator needs from a shard (in-process, or a Ray handle adapter)."""

    async def upsert(self, items: Sequence[EmbeddedRecord]) -> list[str]: ...

    async def delete(self, tenant: str, ids: Sequence[str]) -> list[str]: ...

    async def get(self, tenant: str, record_id: str) -> MemoryRecord | None: ...

    async def list_by_source(self, tenant: str, source_id: str) -> list[MemoryRecord]: ...

    async def list_records(self, tenant: str, filters: SearchFilters | None, include_shared: bool) -> list[MemoryRecord]: ...

    async def search(
        self, queries: np.ndarray, tenant: str, k: int, params: ScoreParams,
        filters: SearchFilters | None, now: float, touch: bool,
    ) -> list[list[SearchHit]]: ...

    async def touch(self, ids: Sequence[str], at: Sequence[float]) -> None: ...

    async def flush(self) -> None: ...

    async def snapshot(self) -> None: ...

    async def stats(self) -> dict[str, Any]: ...


class LocalShardClient:
    """In-process :class:`ShardClient`: runs each shard call in a worker thread.

    Threads let N shards scan concurrently (torch and FAISS release the GIL) while the event
    loop stays free; every call goes through a thread because even a ``get`` may wait for the
    shard's lock while a long scan holds it.
    """

    def __init__(self, shard: MemoryShard) -> None:
        self.shard = shard

    async def upsert(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        return await asyncio.to_thread(self.shard.upsert, items)

    async def delete(self, tenant: str, ids: Sequence[str]) -> list[str]:
        return await asyncio.to_thread(self.shard.delete, tenant, ids)

    async def get(self, tenant: str, record_id: str) -> MemoryRecord | None:
        return await asyncio.to_thread(self.shard.get, tenant, record_id)

    async def list_by_source(self, tenant: str, source_id: str) -> list[MemoryRecord]:
        return await asyncio.to_thread(self.shard.list_by_source, tenant, source_id)

    async def list_records(self, tenant: str, filters: SearchFilters | None, include_shared: bool) -> list[MemoryRecord]:
        return await asyncio.to_thread(self.shard.list_records, tenant, filters, include_shared)

    async def search(self, queries, tenant, k, params, filters, now, touch):
        return await asyncio.to_thread(self.shard.search, queries, tenant, k, params, filters, now, touch)

    async def touch(self, ids: Sequence[str], at: Sequence[float]) -> None:
        await asyncio.to_thread(self.shard.touch, ids, at)

    async def flush(self) -> None:
        await asyncio.to_thread(self.shard.flush)

    async def snapshot(self) -> None:
        await asyncio.to_thread(self.shard.snapshot)

    async def stats(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.shard.stats)


class MemoryCoordinator:
    """Routes writes, fans out reads, merges top-k across N shards.

    Args:
        shards: one client per shard; position i must be the shard with ``shard_id == i``
            (routing is ``key mod len(shards)``, so changing N means re-sharding).
        touch_every_hits: send batched last-access renewals after this many hits ...
        touch_every_seconds: ... or when the oldest queued renewal is this old.
    """

    def __init__(self, shards: Sequence[ShardClient], touch_every_hits: int = 1024, touch_every_seconds: float = 5.0) -> None:
        if not shards:
            raise ValueError("shards: need at least one shard")
        self.shards = list(shards)
        self.touch_every_hits = touch_every_hits
        self.touch_every_seconds = touch_every_seconds
        self._pending: list[dict[str, float]] = [{} for _ in self.shards]
        self._pending_since = 0.0

    # ---- routing ------------------------------------------------------------------------
    def shard_of_tenant(self, tenant: str) -> int:
        """Shard holding ``tenant``'s private records."""
        return (tenant_key(tenant) % _U64) % len(self.shards)

    def shard_of(self, record: MemoryRecord) -> int:
        """Shard a record is written to."""
        if record.tenant == SHARED_TENANT_NAME:
            return (source_key(record.source_id) % _U64) % len(self.shards)
        return self.shard_of_tenant(record.tenant)

    # ---- writes -------------------------------------------------------------------------
    async def upsert(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        """Write records to their shards concurrently; durable on return; ids in input order."""
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(self.shard_of(item.record), []).append(i)
        results = await asyncio.gather(*(self.shards[s].upsert([items[i] for i in idx]) for s, idx in groups.items()))
        ids: list[str] = [""] * len(items)
        for (_, idx), got in zip(groups.items(), results):
            for i, record_id in zip(idx, got):
                ids[i] = record_id
        return ids

    async def delete(self, tenant: str, ids: Sequence[str]) -> list[str]:
        """Delete ``tenant``'s records among ``ids``; returns the ids deleted."""
        if tenant == SHARED_TENANT_NAME:
            results = await asyncio.gather(*(s.delete(tenant, ids) for s in self.shards))
            return [i for got in results for i in got]
        return await self.shards[self.shard_of_tenant(tenant)].delete(tenant, ids)

    # ---- reads --------------------------------------------------------------------------
    async def get(self, tenant: str, record_id: str) -> MemoryRecord | None:
        """The record if ``tenant`` may see it; a private record wins over a shared one."""
        found = [r for r in await asyncio.gather(*(s.get(tenant, record_id) for s in self.shards)) if r is not None]
        found.sort(key=lambda r: r.tenant == SHARED_TENANT_NAME)
        return found[0] if found else None

    async def list_by_source(self, tenant: str, source_id: str) -> list[MemoryRecord]:
        """Records with ``source_id`` visible to ``tenant`` (its own and shared)."""
        shard_ids = {self.shard_of_tenant(tenant), (source_key(source_id) % _U64) % len(self.shards)}
        results = await asyncio.gather(*(self.shards[s].list_by_source(tenant, source_id) for s in sorted(shard_ids)))
        return sorted((r for got in results for r in got), key=lambda r: (r.created_at, r.id))

    async def list_records(self, tenant: str, filters: SearchFilters | None = None, include_shared: bool = True) -> list[MemoryRecord]:
        """Every record ``tenant`` may see (for lexical indexes and exports), ordered by (created_at, id)."""
        targets = range(len(self.shards)) if include_shared else [self.shard_of_tenant(tenant)]
        results = await asyncio.gather(*(self.shards[s].list_records(tenant, filters, include_shared) for s in targets))
        return sorted((r for got in results for r in got), key=lambda r: (r.created_at, r.id))

    async def search(
        self,
        tenant: str,
        queries: np.ndarray,
        k: int = 20,
        params: ScoreParams | None = None,
        filters: SearchFilters | None = None,
        now: float | None = None,
        include_shared: bool = True,
    ) -> list[list[SearchHit]]:
        """Global top-k per query for ``tenant`` (its records plus shared ones).

        Args:
            tenant: the caller's tenant.
            queries: [Q, D] or [D] unit-norm float32.
            k: results per query.
            params: scoring parameters.
            filters: masks applied on every shard.
            now: epoch seconds (default: now).
            include_shared: False searches only the tenant's own shard (its private records
                and the shared records that happen to live there are still masked by tenant).

        Returns:
            One best-first list of hits per query, deduplicated by source id.
        """
        params = params or ScoreParams()
        now = time.time() if now is None else float(now)
        targets = range(len(self.shards)) if include_shared else [self.shard_of_tenant(tenant)]
        per_shard = await asyncio.gather(
            *(self.shards[s].search(queries, tenant, k, params, filters, now, False) for s in targets)
        )
        n_queries = len(per_shard[0]) if per_shard else 0
        merged: list[list[SearchHit]] = []
        for qi in range(n_queries):
            streams = [
                [(-hit.score, hit.shard, rank, hit) for rank, hit in enumerate(hits[qi])] for hits in per_shard
            ]
            out: list[SearchHit] = []
            seen: set[str] = set()
            for _, _, _, hit in heapq.merge(*streams, key=lambda x: x[:3]):
                if hit.record.source_id in seen:
                    continue
                seen.add(hit.record.source_id)
                out.append(hit)
                if len(out) == k:
                    break
            merged.append(out)
            for hit in out:
                self._queue_touch(hit.shard, hit.record.id, now)
        await self._maybe_send_touches()
        return merged

    # ---- maintenance --------------------------------------------------------------------
    def _queue_touch(self, shard: int, record_id: str, at: float) -> None:
        if not any(self._pending):
            self._pending_since = time.monotonic()
        pending = self._pending[shard]
        if at > pending.get(record_id, -1.0):
            pending[record_id] = at

    async def _maybe_send_touches(self, force: bool = False) -> None:
        count = sum(len(p) for p in self._pending)
        due = count >= self.touch_every_hits or (count and time.monotonic() - self._pending_since >= self.touch_every_seconds)
        if not count or not (force or due):
            return
        batches, self._pending = self._pending, [{} for _ in self.shards]
        await asyncio.gather(
            *(self.shards[s].touch(list(p), list(p.values())) for s, p in enumerate(batches) if p)
        )

    async def flush(self) -> None:
        """Send queued renewals and make every shard apply its pending renewals."""
        await self._maybe_send_touches(force=True)
        await asyncio.gather(*(s.flush() for s in self.shards))

    async def snapshot(self) -> None:
        """Snapshot every shard."""
        await self.flush()
        await asyncio.gather(*(s.snapshot() for s in self.shards))

    async def stats(self) -> list[dict[str, Any]]:
        """Per-shard stats."""
        return list(await asyncio.gather(*(s.stats() for s in self.shards)))


def embed_records(embedder: Embedder, records: Sequence[MemoryRecord]) -> list[EmbeddedRecord]:
    """Embed every record's texts in one batched call; stamps ``embedding_model``."""
    texts = [r.embedding_texts() for r in records]
    flat = [t for group in texts for t in group]
    vectors = embedder.embed(flat) if flat else np.zeros((0, embedder.dim), dtype=np.float32)
    out, start = [], 0
    for rec, group in zip(records, texts):
        rec = rec if rec.embedding_model == embedder.model_id else rec.model_copy(update={"embedding_model": embedder.model_id})
        out.append(EmbeddedRecord(rec, vectors[start : start + len(group)]))
        start += len(group)
    return out


def local_coordinator(n_shards: int, model_id: str, dim: int, data_root: str | Path | None = None, **shard_options: Any) -> MemoryCoordinator:
    """N in-process shards (``data_root/shard-<i>`` each, or in memory when None).

    Args:
        n_shards: number of shards.
        model_id: embedding model id of every vector.
        dim: vector dimension.
        data_root: parent folder of the shards' data folders.
        **shard_options: further :class:`ShardConfig` fields.
    """
    if n_shards < 1:
        raise ValueError(f"n_shards: must be >= 1, got {n_shards}")
    shards = []
    for i in range(n_shards):
        data_dir = None if data_root is None else str(Path(data_root) / f"shard-{i}")
        cfg = ShardConfig(shard_id=i, data_dir=data_dir, model_id=model_id, dim=dim, **shard_options)
        shards.append(LocalShardClient(MemoryShard(cfg)))
    return MemoryCoordinator(shards)
