"""The shard's row table: vectors + columnar metadata in growable numpy arrays, and the records.

One record owns a contiguous run of rows (one per embedding text). Replacing or deleting a
record marks its rows dead (``valid=False``); dead rows are dropped by :meth:`RowTable.compacted`
(at snapshot time), so appends never move live rows between compactions and row indices stay
stable for the IVF index. The columns the kernel reads are mirrored on the shard's device by a
:class:`recallserve.memory_shards._device.DeviceColumns` (:meth:`RowTable.kernel_columns`). The vectors are a
``[capacity, D]`` float32 array whose storage is row-major while the table is small and
column-major from :data:`recallserve.memory_shards._device.COLUMN_MAJOR_MIN_ROWS` rows of capacity on
(:func:`recallserve.memory_shards._device.vector_block`; the layout is chosen again at each doubling).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ._device import DeviceColumns, KernelColumns, vector_block
from .records import MemoryRecord, kind_code

__all__ = ["RowTable", "COLUMNS"]

# name -> (dtype, fill value of an unused slot)
COLUMNS: dict[str, tuple[type, float | int | bool]] = {
    "tenant": (np.int64, 0),
    "source": (np.int64, 0),
    "last_access": (np.float64, 0.0),
    "expires": (np.float64, math.inf),
    "created": (np.float64, 0.0),
    "kind": (np.int8, 0),
    "valid": (np.bool_, False),
    "slot": (np.int64, -1),
    "part": (np.int16, 0),
}


@dataclass
class _Slot:
    record: MemoryRecord
    start: int
    count: int


class RowTable:
    """Rows and records of one shard (not thread-safe; the shard holds the lock)."""

    def __init__(
        self, dim: int, capacity: int = 1024, device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.dim = dim
        self.device_columns = DeviceColumns(device or torch.device("cpu"), dtype)
        self.n = 0
        self.live_rows = 0
        self.vectors = vector_block(max(capacity, 1), dim)
        self.cols: dict[str, np.ndarray] = {
            name: np.full(max(capacity, 1), fill, dtype=dtype) for name, (dtype, fill) in COLUMNS.items()
        }
        self.slots: list[_Slot | None] = []
        self.by_id: dict[str, int] = {}
        # NOTE: (tenant key, source key) -> the one live record with that source id in that tenant (an
        # upsert replaces the previous one). The only source index: a lookup never walks other tenants'
        # records of the same source id (a write of many small tenants cost rows x tenants before).
        self.by_tenant_source: dict[tuple[int, int], str] = {}

    # ---- growth -------------------------------------------------------------------------
    def _reserve(self, extra: int) -> None:
        need = self.n + extra
        cap = self.vectors.shape[0]
        if need <= cap:
            return
        # NOTE: doubling keeps appends amortised O(1); 1.5x would save memory at 1M+ rows but
        # costs more copies during bulk loads.
        new_cap = max(need, cap * 2)
        vectors = vector_block(new_cap, self.dim)
        vectors[: self.n] = self.vectors[: self.n]
        self.vectors = vectors
        for name, (dtype, fill) in COLUMNS.items():
            col = np.full(new_cap, fill, dtype=dtype)
            col[: self.n] = self.cols[name][: self.n]
            self.cols[name] = col

    # ---- mutation -----------------------------------------------------------------------
    def add(self, record: MemoryRecord, vectors: np.ndarray) -> range:
        """Append ``record`` with its rows; the caller removed any record it replaces."""
        rows = vectors.shape[0]
        self._reserve(rows)
        start, end = self.n, self.n + rows
        self.vectors[start:end] = vectors
        c = self.cols
        c["tenant"][start:end] = record.tenant_key
        c["source"][start:end] = record.source_key
        c["last_access"][start:end] = record.last_access_at
        c["expires"][start:end] = math.inf if record.expires_at is None else record.expires_at
        c["created"][start:end] = record.created_at
        c["kind"][start:end] = kind_code(record.kind)
        c["valid"][start:end] = True
        c["slot"][start:end] = len(self.slots)
        c["part"][start:end] = np.arange(rows, dtype=np.int16)
        self.by_id[record.id] = len(self.slots)
        self.slots.append(_Slot(record, start, rows))
        self.by_tenant_source[(record.tenant_key, record.source_key)] = record.id
        self.n = end
        self.live_rows += rows
        return range(start, end)

    def remove(self, record_id: str) -> MemoryRecord | None:
        """Mark a record's rows dead; returns the removed record (None when unknown)."""
        slot_index = self.by_id.pop(record_id, None)
        if slot_index is None:
            return None
        slot = self.slots[slot_index]
        assert slot is not None
        self.slots[slot_index] = None
        self.cols["valid"][slot.start : slot.start + slot.count] = False
        self.device_columns.update("valid", self.cols["valid"], slot.start, slot.start + slot.count)
        self.live_rows -= slot.count
        rec = slot.record
        key = (rec.tenant_key, rec.source_key)
        if self.by_tenant_source.get(key) == rec.id:
            del self.by_tenant_source[key]
        return rec

    def touch(self, record_id: str, at: float) -> bool:
        """Set a record's last access time (never moves it backwards)."""
        slot_index = self.by_id.get(record_id)
        if slot_index is None:
            return False
        slot = self.slots[slot_index]
        assert slot is not None
        if slot.record.last_access_at is not None and at <= slot.record.last_access_at:
            return True
        # NOTE: the one in-place change of a frozen record: renewal is not a new version.
        object.__setattr__(slot.record, "last_access_at", float(at))
        self.cols["last_access"][slot.start : slot.start + slot.count] = at
        self.device_columns.update("last_access", self.cols["last_access"], slot.start, slot.start + slot.count)
        return True

    # ---- reads --------------------------------------------------------------------------
    def get(self, record_id: str) -> MemoryRecord | None:
        """The record with this id, or None."""
        slot_index = self.by_id.get(record_id)
        return None if slot_index is None else self.slots[slot_index].record  # type: ignore[union-attr]

    def best_parts(self, record_ids: Sequence[str], query: np.ndarray) -> list[tuple[int, float] | None]:
        """``(part index, cosine)`` of each record's best vector row for ``query`` [D]; None where the record is gone.

        One gather and one matrix product for every record (the BM25 candidates a hybrid search
        scores for its fusion), instead of a copy and a product per record.
        """
        spans: list[tuple[int, int] | None] = []
        for record_id in record_ids:
            slot_index = self.by_id.get(record_id)
            slot = None if slot_index is None else self.slots[slot_index]
            spans.append(None if slot is None else (slot.start, slot.count))
        live = [sp for sp in spans if sp is not None]
        if not live:
            return [None] * len(spans)
        rows = np.concatenate([np.arange(start, start + count) for start, count in live])
        sims = self.vectors[rows] @ np.asarray(query, dtype=np.float32)
        out: list[tuple[int, float] | None] = []
        at = 0
        for span in spans:
            if span is None:
                out.append(None)
                continue
            part = int(np.argmax(sims[at : at + span[1]]))
            out.append((part, min(1.0, max(-1.0, float(sims[at + part])))))
            at += span[1]
        return out

    def record_at_row(self, row: int) -> tuple[MemoryRecord, int]:
        """(record, part index) of a live row."""
        slot = self.slots[int(self.cols["slot"][row])]
        assert slot is not None, f"row {row} is dead"
        return slot.record, int(self.cols["part"][row])

    def records(self) -> list[MemoryRecord]:
        """Live records in row order."""
        return [s.record for s in self.slots if s is not None]

    def tenant_records(self) -> dict[int, int]:
        """Live records by tenant key (:func:`~recallserve.memory_shards.records.tenant_key`; shared is 0).

        NOTE: one row per record counted (its part 0), so a record of many texts counts once; the
        console shows a tenant its own count from this, never the shard's total.
        """
        first = self.col("valid") & (self.col("part") == 0)
        keys, counts = np.unique(self.col("tenant")[first], return_counts=True)
        return {int(k): int(c) for k, c in zip(keys, counts)}

    @property
    def dead_rows(self) -> int:
        """Rows marked dead and not yet compacted away."""
        return self.n - self.live_rows

    def col(self, name: str) -> np.ndarray:
        """View of a column over the used rows."""
        return self.cols[name][: self.n]

    def kernel_columns(self) -> KernelColumns:
        """The kernel's columns over the used rows, on the table's device (synced first)."""
        return self.device_columns.view(self.vectors, self.cols, self.n)

    def compacted(self) -> RowTable:
        """A new table holding only live rows (row order kept), on the same device."""
        dc = self.device_columns
        out = RowTable(self.dim, capacity=max(self.live_rows, 1024), device=dc.device, dtype=dc.dtype)
        for slot in self.slots:
            if slot is not None:
                out.add(slot.record, self.vectors[slot.start : slot.start + slot.count])
        return out
