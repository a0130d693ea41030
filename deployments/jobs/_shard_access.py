"""Read every record of an open shard with its vectors, in the order a resumable job needs."""

from __future__ import annotations

import numpy as np

from memory_shards import MemoryRecord, MemoryShard

__all__ = ["all_records", "vectors_of"]


def all_records(shard: MemoryShard) -> list[MemoryRecord]:
    """Every live record of the shard (all tenants, shared included), sorted by id.

    Sorted by id so that a job can resume after the last id it finished.
    """
    return sorted(shard.records(), key=lambda r: r.id)


def vectors_of(shard: MemoryShard, record_id: str) -> np.ndarray | None:
    """A copy of the stored rows of one record ([rows, dim] float32), or None when absent."""
    return shard.vectors(record_id)
