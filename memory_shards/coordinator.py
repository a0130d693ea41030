"""The sharded coordinator: routing, fan-out and one heap merge of the shards' top-k.

Routing (N shards, keys from :mod:`recallserve.memory_shards.records`)::

    private record of tenant t  -> shard  uint64(tenant_key(t)) mod N   (a tenant lives on one shard)
    shared record (tenant "shared") -> shard uint64(source_key(source_id)) mod N   (spread by source)

Which shards a read needs (so that an outage stays confined to what lives on the shard):

* get by id: a routed id (``records.private_record_id`` / ``shared_record_id``) names its one
  shard: the tenant's home shard, or its source's shard. An older 32-hex id is looked up like a
  search's data (below): the home shard and every shard that may hold shared records.
* search / list: *complete* means the tenant's own records plus the whole shared collection. So
  the home shard is needed, and so is every shard that may hold shared records (it last reported
  shared rows, or the coordinator never heard from it). A down shard that last reported no
  shared rows holds nothing the answer could contain, and the answer is given without it.
  Healthy shards are always asked, so what they hold is re-learned on every search.
* a needed shard that is down, fails or misses its deadline: :class:`ShardUnavailable` (a 503
  with a retry hint above), never a partial answer.

The one gap, documented rather than hidden: a shared record written through *another*
coordinator (another ingress replica) to a shard this coordinator last saw without shared rows,
in the moments between this coordinator's last answer from that shard and the shard's death, is
missing from this coordinator's answers until the shard is back. With
``ShardCallConfig.shared_refresh_s`` > 0 a search also skips a healthy shard that reported no
shared rows less than that long ago (and is not the tenant's home), so such a record may be
missing from searches for up to that long; writes through this coordinator are seen at once.

Each shard returns its deduplicated top-k and the coordinator merges them with ``heapq.merge``
on ``(-score, shard, rank in shard)``, keeping the first hit per source id, until k. Because a
source's best row on a shard is in that shard's top-k whenever the source is in the global
top-k, the merge equals an unsharded exact search (up to the order of exactly tied scores).

Shards are reached through the async :class:`ShardClient` protocol, so a Ray deployment handle
can stand in for :class:`LocalShardClient` without changing the coordinator; every call goes
through :class:`~recallserve.memory_shards._fanout.ShardCalls` (deadlines, down marks, probes).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from recallserve.kernels import ScoreParams

from ._embedder_base import Embedder
from ._fanout import ShardCalls, ShardUnavailable
from .config import SearchFilters, SearchHit, ShardCallConfig, ShardConfig
from .records import SHARED_TENANT_NAME, EmbeddedRecord, MemoryRecord, id_route, source_key, tenant_key
from .shard import MemoryShard

__all__ = ["ShardClient", "ShardUnavailable", "LocalShardClient", "MemoryCoordinator", "embed_records", "local_coordinator"]

_U64 = 1 << 64


@runtime_checkable
class ShardClient(Protocol):
    """What the coordinator needs from a shard (in-process, or a Ray handle adapter)."""

    async def upsert(self, items: Sequence[EmbeddedRecord]) -> list[str]: ...

    async def delete(self, tenant: str, ids: Sequence[str]) -> list[str]: ...

    async def erase(self, tenant: str, user: str | None) -> list[str]: ...

    async def owned(self, tenant: str, user: str | None) -> list[MemoryRecord]: ...

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

    async def erase(self, tenant: str, user: str | None) -> list[str]:
        return await asyncio.to_thread(self.shard.erase, tenant, user)

    async def owned(self, tenant: str, user: str | None) -> list[MemoryRecord]:
        return await asyncio.to_thread(self.shard.owned, tenant, user)

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
    """Routes writes, sends reads to the shards they need, merges top-k across N shards.

    Args:
        shards: one client per shard; position i must be the shard with ``shard_id == i``
            (routing is ``key mod len(shards)``, so changing N means re-sharding).
        touch_every_hits: send batched last-access renewals after this many hits ...
        touch_every_seconds: ... or when the oldest queued renewal is this old.
        calls: shard call deadlines and the retry hint (defaults of :class:`ShardCallConfig`).
    """

    def __init__(self, shards: Sequence[ShardClient], touch_every_hits: int = 1024, touch_every_seconds: float = 5.0,
                 calls: ShardCallConfig | None = None) -> None:
        if not shards:
            raise ValueError("shards: need at least one shard")
        self.shards = list(shards)
        self.calls = ShardCalls(self.shards, calls)
        self.touch_every_hits = touch_every_hits
        self.touch_every_seconds = touch_every_seconds
        self._pending: list[dict[str, float]] = [{} for _ in self.shards]
        self._pending_since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._sends: set[asyncio.Task] = set()

    # ---- routing ------------------------------------------------------------------------
    def shard_of_tenant(self, tenant: str) -> int:
        """Shard holding ``tenant``'s private records."""
        return (tenant_key(tenant) % _U64) % len(self.shards)

    def shard_of_source(self, source_id: str) -> int:
        """Shard holding the shared record with ``source_id``."""
        return (source_key(source_id) % _U64) % len(self.shards)

    def shard_of(self, record: MemoryRecord) -> int:
        """Shard a record is written to."""
        if record.tenant == SHARED_TENANT_NAME:
            return self.shard_of_source(record.source_id)
        return self.shard_of_tenant(record.tenant)

    def read_plan(self, tenant: str, include_shared: bool = True, search: bool = False) -> tuple[list[int], set[int]]:
        """The shards a read of ``tenant``'s data asks, and those whose answer it needs.

        Needed: the tenant's home shard, plus (with shared records) every shard that may hold
        shared rows. Asked: the needed ones, plus (with shared records) every other shard not
        marked down, so a shard that gained shared rows through another coordinator is seen;
        a ``search`` leaves out a shard that reported no shared rows within
        ``ShardCallConfig.shared_refresh_s`` (0, the default: none is left out).
        """
        n = len(self.shards)
        needed = set() if tenant == SHARED_TENANT_NAME else {self.shard_of_tenant(tenant)}
        if not include_shared and tenant != SHARED_TENANT_NAME:
            return sorted(needed), needed
        needed |= {s for s in range(n) if self.calls.may_hold_shared(s)}
        if search:
            return [s for s in range(n) if s in needed or not self.calls.knows_no_shared(s)], needed
        return list(range(n)), needed

    # ---- writes -------------------------------------------------------------------------
    async def upsert(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        """Write records to their shards concurrently; durable on return; ids in input order.

        Raises:
            ShardUnavailable: a shard a record routes to is down (the other shards' records may
                be written: a retry of the batch is idempotent by id and source id).
        """
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(self.shard_of(item.record), []).append(i)
        results = await asyncio.gather(
            *(self.calls.call(s, "upsert", [items[i] for i in idx], write=True) for s, idx in groups.items())
        )
        ids: list[str] = [""] * len(items)
        for (s, idx), got in zip(groups.items(), results):
            if any(items[i].record.tenant == SHARED_TENANT_NAME for i in idx):
                self.calls.note_shared_write(s)
            for i, record_id in zip(idx, got):
                ids[i] = record_id
        return ids

    async def delete(self, tenant: str, ids: Sequence[str]) -> list[str]:
        """Delete ``tenant``'s records among ``ids``; returns the ids deleted."""
        if tenant != SHARED_TENANT_NAME:
            return await self.calls.call(self.shard_of_tenant(tenant), "delete", tenant, list(ids), write=True)
        targets, needed = self.read_plan(tenant)
        got = await self.calls.gather({s: partial(self.shards[s].delete, tenant, list(ids)) for s in targets}, needed,
                                      write=True)
        return [i for s in sorted(got) for i in got[s]]

    async def erase(self, tenant: str, user: str | None) -> list[str]:
        """Erase ``tenant``'s own records of end user ``user`` (None: all of the tenant's) from every
        shard's files and indexes; returns the ids erased.

        Every shard is asked (not only the tenant's home shard), and every one must answer: a record
        a re-shard or an older coordinator put elsewhere is erased too, and a shard that is down
        fails the erasure (:class:`ShardUnavailable`), which its caller retries.
        """
        every = set(range(len(self.shards)))
        got = await self.calls.gather({s: partial(self.shards[s].erase, tenant, user) for s in every}, every,
                                      write=True)
        return [i for s in sorted(got) for i in got[s]]

    async def owned(self, tenant: str, user: str | None) -> list[MemoryRecord]:
        """``tenant``'s own records of ``user`` (None: all), from every shard, ordered by (created_at, id)."""
        every = set(range(len(self.shards)))
        got = await self.calls.gather({s: partial(self.shards[s].owned, tenant, user) for s in every}, every)
        return sorted((r for recs in got.values() for r in recs), key=lambda r: (r.created_at, r.id))

    # ---- reads --------------------------------------------------------------------------
    async def get(self, tenant: str, record_id: str) -> MemoryRecord | None:
        """The record if ``tenant`` may see it; a private record wins over a shared one.

        Raises:
            ShardUnavailable: a shard that may hold the record is down.
        """
        route = id_route(record_id)
        if route is not None:
            kind, key = route
            if kind == "private" and tenant == SHARED_TENANT_NAME:
                return None
            s = self.shard_of_tenant(tenant) if kind == "private" else (key % _U64) % len(self.shards)
            return await self.calls.call(s, "get", tenant, record_id)
        targets, needed = self.read_plan(tenant)
        got = await self.calls.gather({s: partial(self.shards[s].get, tenant, record_id) for s in targets}, needed)
        found = [r for r in got.values() if r is not None]
        found.sort(key=lambda r: r.tenant == SHARED_TENANT_NAME)
        return found[0] if found else None

    async def list_by_source(self, tenant: str, source_id: str) -> list[MemoryRecord]:
        """Records with ``source_id`` visible to ``tenant`` (its own and shared)."""
        needed = {self.shard_of_source(source_id)}
        if tenant != SHARED_TENANT_NAME:
            needed.add(self.shard_of_tenant(tenant))
        got = await self.calls.gather({s: partial(self.shards[s].list_by_source, tenant, source_id) for s in needed}, needed)
        return sorted((r for recs in got.values() for r in recs), key=lambda r: (r.created_at, r.id))

    async def list_records(self, tenant: str, filters: SearchFilters | None = None, include_shared: bool = True) -> list[MemoryRecord]:
        """Every record ``tenant`` may see (for lexical indexes and exports), ordered by (created_at, id)."""
        targets, needed = self.read_plan(tenant, include_shared)
        got = await self.calls.gather(
            {s: partial(self.shards[s].list_records, tenant, filters, include_shared) for s in targets}, needed
        )
        return sorted((r for recs in got.values() for r in recs), key=lambda r: (r.created_at, r.id))

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

        Raises:
            ShardUnavailable: a shard the answer needs is down (see the module docstring).
        """
        params = params or ScoreParams()
        now = time.time() if now is None else float(now)
        targets, needed = self.read_plan(tenant, include_shared, search=True)
        got = await self.calls.gather(
            {s: partial(self.shards[s].search, queries, tenant, k, params, filters, now, False) for s in targets}, needed
        )
        per_shard = [got[s] for s in sorted(got)]
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
        self.queue_renewals(((hit.shard, hit.record.id) for out in merged for hit in out), now)
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
        # NOTE: renewals are best effort; a down shard's renewals are dropped, not retried.
        await self.calls.gather(
            {s: partial(self.shards[s].touch, list(p), list(p.values())) for s, p in enumerate(batches) if p}, (), write=True
        )

    def queue_renewals(self, items: Iterable[tuple[int, str]], at: float) -> None:
        """Queue last-access renewals ``(shard, record id)`` of returned records; sent in batches, off the request path.

        NOTE: a renewal call per search was one more shard hop per search (Ray serialisation on
        both sides and a WAL entry each): batches go when ``touch_every_hits`` renewals are
        queued, or ``touch_every_seconds`` after the oldest one (a timer, so a replica that stops
        searching still sends them). Renewals are best effort: a down shard's are dropped, and
        a replica that dies loses its queue (the records then decay from their previous access).
        """
        for shard, record_id in items:
            self._queue_touch(shard, record_id, at)
        count = sum(len(p) for p in self._pending)
        if count >= self.touch_every_hits:
            self._spawn_send()
        elif count and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.touch_every_seconds, self._spawn_send)

    def _spawn_send(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = asyncio.ensure_future(self._send_renewals())
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send_renewals(self) -> None:
        try:
            await self._maybe_send_touches(force=True)
        except ShardUnavailable:
            pass  # NOTE: best effort (see queue_renewals).

    async def drain_renewals(self) -> None:
        """Send the queued renewals now and wait for every send in flight (tests, shutdown)."""
        self._spawn_send()
        await asyncio.gather(*list(self._sends), return_exceptions=True)

    async def flush(self) -> None:
        """Send queued renewals and make every shard apply its pending renewals."""
        await self._maybe_send_touches(force=True)
        await asyncio.gather(*(s.flush() for s in self.shards))

    async def snapshot(self) -> None:
        """Snapshot every shard."""
        await self.flush()
        await asyncio.gather(*(s.snapshot() for s in self.shards))

    async def stats(self) -> list[dict[str, Any]]:
        """Per-shard stats (each also tells the coordinator where shared rows live)."""
        out = list(await asyncio.gather(*(s.stats() for s in self.shards)))
        for i, st in enumerate(out):
            self.calls.learn_shared(i, st.get("shared_rows"))
        return out


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
