"""How a batch job reads and changes one shard: the :class:`ShardAccess` interface and its folder side.

Two implementations share one interface, so a job's per-batch logic is written once:

* :class:`LocalShardAccess`: a shard folder opened in this process (``MemoryShard``, folder LOCK).
* the live side (``LiveShardAccess`` in ``deployments/jobs/_live.py``): a shard deployment of a
  running Ray Serve app, through its handle (``page`` / ``apply`` / ``neighbours`` / ``snapshot``).

Reads page through the records in id order (``page(after_id, limit)``) so a job can checkpoint
the last id it finished; writes are compare-and-set (``MemoryShard.apply_if_unchanged``): a
record a user wrote after the job read it is skipped and counted as a conflict, never overwritten.
The helpers :func:`page_records` and :func:`neighbour_records` run next to the shard (in this
process or inside the shard replica).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from recallserve.kernels import ScoreParams
from recallserve.memory_shards.records import EmbeddedRecord, MemoryRecord
from recallserve.memory_shards.retrieval import HybridShard, lexical_text
from recallserve.memory_shards.shard import MemoryShard

__all__ = [
    "HybridShardAccess",
    "LocalShardAccess",
    "ShardAccess",
    "SortedIds",
    "all_records",
    "hybrid_apply",
    "hybrid_insert_absent",
    "neighbour_records",
    "page_records",
    "vectors_of",
]

# NOTE: a page's sorted id list is rebuilt after this long, so a long walk also sees records
# written since it began (a rebuild costs one sort of the shard's ids: ~1 s per million).
_IDS_MAX_AGE_S = 30.0


def all_records(shard: MemoryShard) -> list[MemoryRecord]:
    """Every live record of the shard (all tenants, shared included), sorted by id.

    Sorted by id so that a job can resume after the last id it finished.
    """
    return sorted(shard.records(), key=lambda r: r.id)


def vectors_of(shard: MemoryShard, record_id: str) -> np.ndarray | None:
    """A copy of the stored rows of one record ([rows, dim] float32), or None when absent."""
    return shard.vectors(record_id)


class SortedIds:
    """A cached sorted list of a shard's record ids, for paging in id order.

    Rebuilt at the start of a walk (``after_id is None``) and when older than ``_IDS_MAX_AGE_S``;
    ids deleted since are skipped when read, so any recent list pages correctly.
    """

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._built = -1e18

    def get(self, shard: MemoryShard, after_id: str | None) -> list[str]:
        if after_id is None or time.monotonic() - self._built > _IDS_MAX_AGE_S:
            self._ids = sorted(r.id for r in shard.records())
            self._built = time.monotonic()
        return self._ids


def page_records(shard: MemoryShard, ids: SortedIds, after_id: str | None, limit: int) -> list[EmbeddedRecord]:
    """Up to ``limit`` live records with id > ``after_id`` (all tenants), id order, with vectors.

    Raises:
        ValueError: ``limit`` outside 1..100000.
    """
    # NOTE: 100000 matches JobOptions.batch_size's bound.
    if not 1 <= limit <= 100_000:
        raise ValueError(f"limit: must be in 1..100000, got {limit}")
    order = ids.get(shard, after_id)
    start = 0 if after_id is None else bisect.bisect_right(order, after_id)
    out: list[EmbeddedRecord] = []
    for record_id in order[start:]:
        if len(out) >= limit:
            break
        rec = shard.record(record_id)
        vectors = shard.vectors(record_id)
        if rec is None or vectors is None:
            continue
        out.append(EmbeddedRecord(rec, vectors))
    return out


def neighbour_records(shard: MemoryShard, record_id: str, k: int, threshold: float) -> list[MemoryRecord]:
    """Records of the same tenant whose rows are within ``threshold`` cosine of ``record_id``'s main text.

    Exact scan, no time decay, no last-access renewal; the record itself is included (first
    when present). Empty when the record is gone.
    """
    rec = shard.record(record_id)
    vectors = shard.vectors(record_id)
    if rec is None or vectors is None:
        return []
    params = ScoreParams(decay="none", threshold=threshold)
    (hits,) = shard.search(vectors[:1], rec.tenant, k=k, params=params, touch=False, exact=True)
    return [h.record for h in hits]


class ShardAccess(Protocol):
    """One shard as a job sees it (folder or live deployment)."""

    index: int

    def count(self) -> int:
        """Live records now (for the progress bar)."""
        ...

    def page(self, after_id: str | None, limit: int) -> list[EmbeddedRecord]:
        """See :func:`page_records`."""
        ...

    def apply(self, deletes: Mapping[str, Sequence[str]], upserts: Sequence[EmbeddedRecord], expected: Mapping[str, str],
              touches: Mapping[str, float] | None = None, all_or_nothing: bool = False) -> dict[str, list[str]]:
        """See :meth:`recallserve.memory_shards.MemoryShard.apply_if_unchanged`."""
        ...

    def neighbours(self, record_id: str, k: int, threshold: float) -> list[MemoryRecord]:
        """See :func:`neighbour_records`."""
        ...

    def snapshot(self) -> None:
        """Snapshot the shard (compacts deleted rows)."""
        ...

    def lookup(self, ids: Sequence[str]) -> list[MemoryRecord | None]:
        """The records with these ids, any tenant (None where absent)."""
        ...

    def insert_absent(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        """See :meth:`recallserve.memory_shards.MemoryShard.insert_absent`."""
        ...

    def touch(self, ids: Sequence[str], at: Sequence[float]) -> None:
        """Renew last access (never backwards); absent ids are ignored."""
        ...


def hybrid_apply(hybrid: HybridShard, deletes: Mapping[str, Sequence[str]], upserts: Sequence[EmbeddedRecord],
                 expected: Mapping[str, str], touches: Mapping[str, float] | None = None,
                 all_or_nothing: bool = False) -> dict[str, list[str]]:
    """``apply_if_unchanged`` on a hybrid shard, with its BM25 index following the applied changes."""
    out = hybrid.shard.apply_if_unchanged(deletes, upserts, expected, touches, all_or_nothing)
    for record_id in out["deleted"]:
        hybrid.lexical.remove(record_id)
    # NOTE: index what the shard holds now (a user write may already have replaced the job's).
    current = [r for i in out["upserted"] if (r := hybrid.shard.record(i)) is not None]
    hybrid.lexical.add_many((r.tenant, r.id, lexical_text(r)) for r in current)
    return out


def hybrid_insert_absent(hybrid: HybridShard, items: Sequence[EmbeddedRecord]) -> list[str]:
    """``insert_absent`` on a hybrid shard, indexing the inserted records for BM25."""
    inserted = hybrid.shard.insert_absent(items)
    done = set(inserted)
    hybrid.lexical.add_many((it.record.tenant, it.record.id, lexical_text(it.record)) for it in items if it.record.id in done)
    return inserted


class LocalShardAccess:
    """:class:`ShardAccess` over a shard folder opened in this process."""

    def __init__(self, shard: MemoryShard) -> None:
        self.shard = shard
        self.index = shard.shard_id
        self._ids = SortedIds()

    def count(self) -> int:
        return int(self.shard.stats()["records"])

    def page(self, after_id: str | None, limit: int) -> list[EmbeddedRecord]:
        return page_records(self.shard, self._ids, after_id, limit)

    def apply(self, deletes: Mapping[str, Sequence[str]], upserts: Sequence[EmbeddedRecord], expected: Mapping[str, str],
              touches: Mapping[str, float] | None = None, all_or_nothing: bool = False) -> dict[str, list[str]]:
        return self.shard.apply_if_unchanged(deletes, upserts, expected, touches, all_or_nothing)

    def neighbours(self, record_id: str, k: int, threshold: float) -> list[MemoryRecord]:
        return neighbour_records(self.shard, record_id, k, threshold)

    def snapshot(self) -> None:
        self.shard.snapshot()

    def lookup(self, ids: Sequence[str]) -> list[MemoryRecord | None]:
        return [self.shard.record(i) for i in ids]

    def insert_absent(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        return self.shard.insert_absent(items)

    def touch(self, ids: Sequence[str], at: Sequence[float]) -> None:
        self.shard.touch(list(ids), list(at))
        self.shard.flush()


class HybridShardAccess(LocalShardAccess):
    """:class:`ShardAccess` over an in-process hybrid shard that is serving (its BM25 index kept in step)."""

    def __init__(self, hybrid: HybridShard) -> None:
        super().__init__(hybrid.shard)
        self.hybrid = hybrid

    def apply(self, deletes: Mapping[str, Sequence[str]], upserts: Sequence[EmbeddedRecord], expected: Mapping[str, str],
              touches: Mapping[str, float] | None = None, all_or_nothing: bool = False) -> dict[str, list[str]]:
        return hybrid_apply(self.hybrid, deletes, upserts, expected, touches, all_or_nothing)

    def insert_absent(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        return hybrid_insert_absent(self.hybrid, items)
