"""A memory shard with a lexical (BM25) index beside its vectors: one unit for both signals.

:class:`HybridShard` wraps a :class:`~memory_shards.MemoryShard` and keeps a per-tenant
:class:`~recallserve.memory_shards.retrieval.lexical.LexicalIndex` over the same records, so one call
(:meth:`HybridShard.hybrid_search`) returns the shard's dense top-k (the fused kernel path) and
its lexical top-k, each hit with its similarity, time factor and kernel score. The lexical index
is derived state: it is rebuilt from the shard's records when the shard opens (after WAL replay),
so durability stays the shard's WAL and snapshots alone.

Every method of ``MemoryShard`` that the coordinator's ``LocalShardClient`` calls is forwarded,
so a ``HybridShard`` can stand wherever a ``MemoryShard`` does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recallserve.kernels import ScoreParams

from ..config import SearchFilters, SearchHit
from ..records import SHARED_TENANT_NAME, EmbeddedRecord, MemoryRecord
from ..shard import MemoryShard
from ._wire import WireHit, pack_hits, unpack_hits
from .fusion import combined_score, time_factor
from .lexical import LexicalIndex

__all__ = ["HybridShard", "ShardHybridResult", "lexical_text"]


def lexical_text(record: MemoryRecord) -> str:
    """What BM25 indexes for a record: its texts (the main text whole, not chunked), topic path and string metadata values.

    Metadata strings (a speaker, an order id, a date as written) are exact-match evidence that an
    embedder reads poorly, so they are searchable words here but not part of the vectors.
    """
    texts = record.searchable_texts()
    if record.topic_path:
        texts.append(record.topic_path.replace("/", " "))
    texts.extend(v for v in record.metadata.values() if isinstance(v, str))
    return "\n".join(texts)


@dataclass
class ShardHybridResult:
    """One shard's answer to a hybrid query (plain data, travels through Ray in its compact wire form).

    Pickled (a Ray hop), it becomes one blob of plain tuples (:mod:`recallserve.memory_shards.retrieval._wire`):
    the receiver's hits are :class:`WireHit` s that build their record only when it is read.
    """

    dense: list[SearchHit | WireHit] = field(default_factory=list)
    """Dense top-k by kernel score (cosine >= threshold), best first."""
    lexical: list[tuple[SearchHit | WireHit, float]] = field(default_factory=list)
    """Lexical top-k as (hit, bm25), best BM25 first; the hit's similarity may be below threshold."""
    shared_rows: int | None = None
    """Live shared rows on the shard when it answered (the coordinator's map of where shared data lives)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _from_wire, (pack_hits(self.dense, self.lexical), self.shared_rows)


def _from_wire(blob: bytes, shared_rows: int | None) -> ShardHybridResult:
    dense, lexical = unpack_hits(blob)
    return ShardHybridResult(dense, lexical, shared_rows)  # type: ignore[arg-type]


class HybridShard:
    """A ``MemoryShard`` plus its per-tenant BM25 index.

    Args:
        shard: the opened shard (its WAL already replayed).
        lexical: BM25 index to fill (default: a fresh ``LexicalIndex()``).
    """

    def __init__(self, shard: MemoryShard, lexical: LexicalIndex | None = None) -> None:
        self.shard = shard
        self.lexical = lexical or LexicalIndex()
        self.lexical.add_many((r.tenant, r.id, lexical_text(r)) for r in shard.records())

    # ---- forwarded MemoryShard API ------------------------------------------------------
    @property
    def shard_id(self) -> int:
        """This shard's index."""
        return self.shard.shard_id

    def upsert(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        """Write through the shard (durable on return), then index the texts.

        A record replaces the same tenant's record with the same source id inside the shard;
        the replaced record is dropped from the lexical index too.
        """
        replaced: set[str] = set()
        # NOTE: (tenant, source id) -> the batch's latest record: a later record of the batch replaces
        # an earlier one as the shard's table does, so the earlier text leaves the BM25 index too.
        latest: dict[tuple[str, str], str] = {}
        for item in items:
            rec = item.record
            key = (rec.tenant, rec.source_id)
            before = latest.get(key)
            if before is None:
                replaced.update(old.id for old in self.shard.list_by_source(rec.tenant, rec.source_id)
                                if old.tenant == rec.tenant and old.id != rec.id)
            elif before != rec.id:
                replaced.add(before)
            latest[key] = rec.id
        ids = self.shard.upsert(items)
        for record_id in replaced:
            self.lexical.remove(record_id)
        kept = set(latest.values())
        self.lexical.add_many((it.record.tenant, it.record.id, lexical_text(it.record)) for it in items if it.record.id in kept)
        return ids

    def delete(self, tenant: str, ids: Sequence[str]) -> list[str]:
        """Delete ``tenant``'s records among ``ids`` from both indexes."""
        deleted = self.shard.delete(tenant, ids)
        for record_id in deleted:
            self.lexical.remove(record_id)
        return deleted

    def erase(self, tenant: str, user: str | None) -> list[str]:
        """Erase ``tenant``'s records of ``user`` (None: all) from the files and both indexes (``MemoryShard.erase``)."""
        erased = self.shard.erase(tenant, user)
        for record_id in erased:
            self.lexical.remove(record_id)
        return erased

    def owned(self, tenant: str, user: str | None) -> list[MemoryRecord]:
        return self.shard.owned(tenant, user)

    def get(self, tenant: str, record_id: str) -> MemoryRecord | None:
        return self.shard.get(tenant, record_id)

    def list_by_source(self, tenant: str, source_id: str) -> list[MemoryRecord]:
        return self.shard.list_by_source(tenant, source_id)

    def search(self, *args: Any, **kwargs: Any) -> list[list[SearchHit]]:
        """Dense search only (``MemoryShard.search``)."""
        return self.shard.search(*args, **kwargs)

    def touch(self, ids: Sequence[str], at: float | Sequence[float] | None = None) -> None:
        self.shard.touch(ids, at)

    def flush(self) -> None:
        self.shard.flush()

    def snapshot(self) -> None:
        self.shard.snapshot()

    def close(self) -> None:
        self.shard.close()

    def stats(self) -> dict[str, Any]:
        """The shard's stats plus the lexical index size."""
        out = self.shard.stats()
        out["lexical_docs"] = len(self.lexical)
        return out

    # ---- hybrid search ------------------------------------------------------------------
    def hybrid_search(
        self,
        query_vector: np.ndarray,
        lexical_query: str,
        tenant: str,
        dense_k: int,
        lexical_k: int,
        params: ScoreParams,
        filters: SearchFilters | None,
        now: float | None = None,
    ) -> ShardHybridResult:
        """Dense top-``dense_k`` and lexical top-``lexical_k`` for one query of ``tenant``.

        Lexical candidates obey the same visibility as the kernel (the tenant's own records and
        shared ones, not expired, passing ``filters``) but not the cosine threshold: the caller
        decides what a lexical-only hit needs. Nothing is touched: the caller renews the last
        access of the records it finally returns.

        Args:
            query_vector: [D] unit-norm float32.
            lexical_query: text for BM25 (possibly rewritten).
            tenant: caller's tenant.
            dense_k: dense candidates (0 skips the dense list).
            lexical_k: lexical candidates (0 skips the lexical list).
            params: decay and threshold.
            filters: masks shared by both lists.
            now: epoch seconds (default now).
        """
        now = time.time() if now is None else float(now)
        q = np.asarray(query_vector, dtype=np.float32).reshape(-1)
        out = ShardHybridResult(shared_rows=self.shard.shared_rows())
        if dense_k > 0:
            out.dense = self.shard.search(q[None, :], tenant, dense_k, params, filters, now, touch=False)[0]
        if lexical_k > 0 and lexical_query.strip():
            out.lexical = self._lexical(q, lexical_query, tenant, lexical_k, params, filters, now)
        return out

    def _lexical(self, q, text, tenant, n, params, filters, now) -> list[tuple[SearchHit, float]]:
        records: dict[str, MemoryRecord] = {}

        def accept(record_id: str) -> bool:
            rec = self.shard.get(tenant, record_id)
            if rec is None or (rec.expires_at is not None and rec.expires_at <= now):
                return False
            if filters is not None and not filters.matches(rec):
                return False
            records[record_id] = rec
            return True

        found = self.lexical.search(tenant, text, n, accept)
        if tenant != SHARED_TENANT_NAME:
            found += self.lexical.search(SHARED_TENANT_NAME, text, n, accept)
            # NOTE: merging two collections by raw BM25 mixes two idf statistics; shared
            # collections are small side sets, so this only reorders their few hits.
            found = sorted(found, key=lambda x: -x[1])[:n]
        out = []
        for (record_id, bm25), best in zip(found, self.shard.best_parts([r for r, _ in found], q)):
            if best is None:  # deleted between the BM25 pass and now
                continue
            rec = records[record_id]
            part, sim = best
            f = time_factor(params, rec.last_access_at or rec.created_at, now)
            score = combined_score(params, sim, f)
            if not math.isfinite(score):
                continue
            out.append((SearchHit(record=rec, score=score, similarity=sim, time_factor=f, part_index=part,
                                  shard=self.shard_id), bm25))
        return out
