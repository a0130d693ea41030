"""The columns the fused kernel reads, as torch tensors on the shard's device.

A shard keeps its rows on the host (numpy, :class:`recallserve.memory_shards._table.RowTable`): the WAL,
snapshots, filters and the IVF index read them there. The kernel reads six columns::

    vectors [N, D] (float32 | float16 | bfloat16), tenant int64, source int64,
    last_access float64, expires float64, valid bool

:class:`DeviceColumns` holds them on ``device``:

* CPU + float32: the tensors *are* the host arrays (``torch.from_numpy``, no copy, no sync; the
  vectors in the host table's layout, :func:`vector_block`);
* otherwise (CUDA, or half-precision storage): tensors of their own, with the host table's
  capacity (amortised doubling, so a bulk load copies O(N) rows in all), kept in step lazily:
  appended rows ``[synced, n)`` are copied in one transfer per column at the next search
  (:meth:`DeviceColumns.view`), and the in-place changes of rows already copied (a delete's
  ``valid``, a renewal's ``last_access``) are written through at once (:meth:`update`).
  Half-precision vectors on the CPU take the host table's layout (the kernel widens a chunk to
  float32 keeping it); on CUDA they are row-major, the layout the Triton kernel reads.

The host stays the single source of truth: WAL and snapshots are unchanged on disk.

Layout of the vectors on the CPU (:func:`vector_block`): column-major, i.e. the memory of a C-order
``[D, capacity]`` array, from :data:`COLUMN_MAJOR_MIN_ROWS` rows of capacity on, row-major below.
The kernel's cosines ``q @ V[lo:hi].T`` then read ``D`` long contiguous runs instead of one short run
per row: one query over 100,000 rows costs the matrix product ~9 ms instead of ~20 on the 2-core
host, while a batch of 16 costs about the same (0.97-1.04x). The price is a gather of scattered rows (the BM25
hits' best parts, a record's vectors): each row spans ``D`` cache lines, ~0.5 ms for 64 rows, which
outweighs the scan's gain on a small table (loadtests/results/scan-layout-cpu.md).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = ["COLUMN_MAJOR_MIN_ROWS", "DTYPES", "DeviceColumns", "KernelColumns", "resolve_device", "vector_block"]

#: Capacity (rows) from which the CPU vectors are stored column-major (see the module docstring).
COLUMN_MAJOR_MIN_ROWS = 32_768

#: ``ShardConfig.vector_dtype`` -> storage dtype (see ``recallserve.kernels._params.STORAGE_DTYPES``).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_META = ("tenant", "source", "last_access", "expires", "valid")


class KernelColumns(NamedTuple):
    """Tensors over the used rows ``[:n]``, all on one device."""

    vectors: torch.Tensor
    tenant: torch.Tensor
    source: torch.Tensor
    last_access: torch.Tensor
    expires: torch.Tensor
    valid: torch.Tensor

    @classmethod
    def from_numpy(
        cls, vectors: np.ndarray, tenant: np.ndarray, source: np.ndarray, last_access: np.ndarray,
        expires: np.ndarray, valid: np.ndarray, device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> KernelColumns:
        """Columns from host arrays (copied to ``device`` / ``dtype`` when they differ)."""
        arrays = (vectors, tenant, source, last_access, expires, valid)
        out = [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays]
        out[0] = out[0].to(dtype)
        return cls(*out)


def vector_block(capacity: int, dim: int) -> np.ndarray:
    """A zeroed ``[capacity, dim]`` float32 host array, column-major from :data:`COLUMN_MAJOR_MIN_ROWS` rows on."""
    if capacity >= COLUMN_MAJOR_MIN_ROWS:
        return np.zeros((dim, capacity), dtype=np.float32).T
    return np.zeros((capacity, dim), dtype=np.float32)


def resolve_device(name: str) -> torch.device:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` -> a usable ``torch.device``.

    Raises:
        ValueError: naming ``device`` when CUDA is asked for and absent, or the index is out of range.
    """
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {name!r} asked for, but torch sees no CUDA device here")
        index = 0 if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device: {name!r} asked for, but only {torch.cuda.device_count()} CUDA device(s)")
        device = torch.device("cuda", index)
    elif device.type != "cpu":
        raise ValueError(f"device: must be 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    return device


class DeviceColumns:
    """Device mirror of a row table's kernel columns (see the module docstring).

    Not thread-safe: the shard calls it under its lock.
    """

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.dtype = dtype
        #: True when the tensors alias the host arrays (CPU, float32): nothing to copy.
        self.aliased = device.type == "cpu" and dtype == torch.float32
        self.synced = 0
        self._t: dict[str, torch.Tensor] = {}

    @property
    def capacity(self) -> int:
        """Rows the device tensors hold (0 before the first view)."""
        return 0 if not self._t else self._t["vectors"].shape[0]

    def nbytes(self) -> int:
        """Bytes held on the device (0 when aliased: the host arrays are the storage)."""
        return sum(t.numel() * t.element_size() for t in self._t.values())

    def _grow(self, vectors: np.ndarray, cols: dict[str, np.ndarray]) -> None:
        cap = vectors.shape[0]
        old, n = self._t, self.synced
        # NOTE: same capacity as the host table, which doubles: amortised O(1) copies per row.
        dim = vectors.shape[1]
        if self.device.type == "cpu" and cap >= COLUMN_MAJOR_MIN_ROWS:
            block = torch.empty((dim, cap), dtype=self.dtype, device=self.device).T
        else:
            block = torch.empty((cap, dim), dtype=self.dtype, device=self.device)
        new = {"vectors": block}
        for name in _META:
            new[name] = torch.empty(cap, dtype=torch.from_numpy(cols[name][:0]).dtype, device=self.device)
        if old and n:
            for name, t in new.items():
                t[:n].copy_(old[name][:n])
        self._t = new

    def view(self, vectors: np.ndarray, cols: dict[str, np.ndarray], n: int) -> KernelColumns:
        """The columns over rows ``[:n]``, after copying the rows appended since the last view.

        Args:
            vectors: the host ``[capacity, D]`` float32 array.
            cols: the host columns (at least the five metadata names), each ``[capacity]``.
            n: rows in use.
        """
        if self.aliased:
            return KernelColumns(torch.from_numpy(vectors[:n]), *(torch.from_numpy(cols[c][:n]) for c in _META))
        if n < self.synced:  # NOTE: never happens in a table (rows only append); be safe anyway.
            self.synced = n
        if self.capacity < vectors.shape[0] or not self._t:
            self._grow(vectors, cols)
        lo = self.synced
        if n > lo:
            # NOTE: one host->device transfer per column for every row appended since the last
            # view (a WAL replay or snapshot load copies once, not once per record).
            self._t["vectors"][lo:n].copy_(torch.from_numpy(vectors[lo:n]).to(self.dtype), non_blocking=False)
            for name in _META:
                self._t[name][lo:n].copy_(torch.from_numpy(cols[name][lo:n]))
            self.synced = n
        return KernelColumns(*(self._t[c][:n] for c in ("vectors", *_META)))

    def update(self, name: str, host: np.ndarray, start: int, end: int) -> None:
        """Write rows ``[start, end)`` of one metadata column through, if already on the device."""
        if self.aliased or not self._t:
            return
        end = min(end, self.synced)
        if start < end:
            self._t[name][start:end].copy_(torch.from_numpy(host[start:end]))
