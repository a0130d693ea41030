"""The shard's scan: kernel columns -> ``recallserve.kernels.fused_topk`` (shared by the shard and the benchmarks).

One function for every device: the columns are tensors on the shard's device
(:class:`recallserve.memory_shards._device.KernelColumns`), so ``fused_topk(backend="auto")`` runs the Triton
kernel when they are on CUDA and the torch reference when they are on the CPU.
"""

from __future__ import annotations

import numpy as np
import torch

from recallserve.kernels import ScoreParams, TopKResult, fused_topk

from ._device import KernelColumns

__all__ = ["fused_scan", "SECONDS_PER_DAY"]

SECONDS_PER_DAY = 86_400.0


def fused_scan(
    queries: np.ndarray,
    query_tenant: np.ndarray,
    cols: KernelColumns,
    now: float,
    k: int,
    params: ScoreParams,
    backend: str = "auto",
    rows: np.ndarray | None = None,
    valid: torch.Tensor | np.ndarray | None = None,
) -> TopKResult:
    """Score rows (all, or the subset ``rows``) of a shard's columns with the fused kernel.

    ``days = max(now - last_access, 0) / 86400`` is computed here on the device, per call
    (float64, then float32), so a renewal of ``last_access`` is visible to the next search
    without a days column to rewrite.

    Args:
        queries: ``[Q, D]`` float32 (host; copied to the columns' device).
        query_tenant: ``[Q]`` int64 tenant keys.
        cols: the columns over all used rows.
        rows: optional host row subset (IVF candidates); result indices then point into it.
        valid: a mask replacing ``cols.valid`` (search filters), host or device, ``[N]``.

    Returns:
        The kernel's :class:`recallserve.kernels.TopKResult`, on the columns' device.
    """
    device = cols.vectors.device
    ok = cols.valid if valid is None else torch.as_tensor(valid).to(device, non_blocking=True)
    parts = (cols.vectors, cols.tenant, cols.source, cols.last_access, cols.expires, ok)
    if rows is not None:
        idx = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(device)
        parts = tuple(p.index_select(0, idx) for p in parts)
    vectors, tenant, source, last_access, expires, ok = parts
    days = ((float(now) - last_access).clamp_min(0.0) / SECONDS_PER_DAY).to(torch.float32)
    return fused_topk(
        torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(device),
        vectors,
        days,
        tenant,
        source,
        expires,
        torch.from_numpy(np.ascontiguousarray(query_tenant, dtype=np.int64)).to(device),
        float(now),
        k,
        params=params,
        valid=ok,
        backend=backend,
    )
