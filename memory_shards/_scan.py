"""The shard's scan: columns -> ``kernels.fused_topk`` (shared by the shard and the benchmark)."""

from __future__ import annotations

import numpy as np

from kernels import ScoreParams, TopKResult, fused_topk

__all__ = ["fused_scan", "SECONDS_PER_DAY"]

SECONDS_PER_DAY = 86_400.0


def fused_scan(
    queries: np.ndarray,
    query_tenant: np.ndarray,
    vectors: np.ndarray,
    tenant: np.ndarray,
    source: np.ndarray,
    last_access: np.ndarray,
    expires: np.ndarray,
    valid: np.ndarray,
    now: float,
    k: int,
    params: ScoreParams,
    backend: str = "auto",
    rows: np.ndarray | None = None,
) -> TopKResult:
    """Score rows (all, or the subset ``rows``) of a shard's columns with the fused kernel.

    ``days = max(now - last_access, 0) / 86400`` is computed here, per call, so a renewal of
    ``last_access`` is visible to the next search without rewriting a days column. Without a
    ``rows`` subset the arrays reach torch without copies (the kernel tiles rows itself).

    Returns:
        The kernel's :class:`kernels.TopKResult`; its indices point into ``rows`` when given.
    """
    import torch

    def take(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a if rows is None else a[rows])

    days = (np.maximum(now - take(last_access), 0.0) / SECONDS_PER_DAY).astype(np.float32)
    return fused_topk(
        torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)),
        torch.from_numpy(take(vectors)),
        torch.from_numpy(days),
        torch.from_numpy(take(tenant)),
        torch.from_numpy(take(source)),
        torch.from_numpy(take(expires)),
        torch.from_numpy(np.ascontiguousarray(query_tenant, dtype=np.int64)),
        float(now),
        k,
        params=params,
        valid=torch.from_numpy(take(valid)),
        backend=backend,
    )
