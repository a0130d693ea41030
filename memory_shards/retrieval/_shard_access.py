"""Read-only access to a shard's stored records and vectors, which ``MemoryShard`` has no public
method for yet.

NOTE: this is an adapter over ``MemoryShard``'s private row table (``_table``, ``_lock``),
kept in one place so it is replaced by public ``records()`` / ``vectors(id)`` methods once the
shard grows them. It only reads, under the shard's own lock.
"""

from __future__ import annotations

import numpy as np

from ..records import MemoryRecord
from ..shard import MemoryShard

__all__ = ["all_records", "record_vectors"]


def all_records(shard: MemoryShard) -> list[MemoryRecord]:
    """Every live record of the shard (all tenants), in row order."""
    public = getattr(shard, "records", None)
    if callable(public):
        return list(public())
    with shard._lock:
        return shard._table.records()


def record_vectors(shard: MemoryShard, record_id: str) -> np.ndarray | None:
    """A copy of the record's vector rows ``[parts, D]``, or None when it is gone."""
    public = getattr(shard, "vectors", None)
    if callable(public):
        return public(record_id)
    with shard._lock:
        table = shard._table
        slot_index = table.by_id.get(record_id)
        if slot_index is None:
            return None
        slot = table.slots[slot_index]
        if slot is None:
            return None
        return table.vectors[slot.start : slot.start + slot.count].copy()
