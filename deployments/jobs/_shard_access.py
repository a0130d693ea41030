"""Read every record of an open shard with its vectors.

``MemoryShard`` has no public way to enumerate all tenants' records (``list_records`` is per
tenant) nor to read stored vectors, and a batch job needs both: it walks the whole shard and
rewrites records (demotion, consolidation) without re-embedding them. This module is the one
place that reads the shard's row table.

NOTE: private access to ``MemoryShard._table`` / ``_lock`` (memory_shards as of this commit);
replace with a public ``MemoryShard.iter_records(with_vectors=True)`` when the shard grows one.
The unit tests of the jobs fail if the layout changes.
"""

from __future__ import annotations

import numpy as np

from memory_shards import MemoryRecord, MemoryShard

__all__ = ["all_records", "vectors_of"]


def all_records(shard: MemoryShard) -> list[MemoryRecord]:
    """Every live record of the shard (all tenants, shared included), sorted by id.

    Sorted by id so that a job can resume after the last id it finished.
    """
    with shard._lock:  # noqa: SLF001 - see the module NOTE
        records = shard._table.records()  # noqa: SLF001
    return sorted(records, key=lambda r: r.id)


def vectors_of(shard: MemoryShard, record_id: str) -> np.ndarray | None:
    """A copy of the stored rows of one record ([rows, dim] float32), or None when absent."""
    with shard._lock:  # noqa: SLF001
        table = shard._table  # noqa: SLF001
        slot_index = table.by_id.get(record_id)
        if slot_index is None:
            return None
        slot = table.slots[slot_index]
        if slot is None:
            return None
        return table.vectors[slot.start : slot.start + slot.count].copy()
