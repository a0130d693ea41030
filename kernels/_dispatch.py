"""``fused_topk``: one entry point that picks the Triton kernel or the torch reference."""

from __future__ import annotations

from typing import Literal

import torch

from recallserve.kernels._params import ScoreParams, TopKResult
from recallserve.kernels.reference import reference_fused_topk

__all__ = ["chosen_backend", "fused_topk", "triton_available"]

Backend = Literal["auto", "torch", "triton"]


def triton_available() -> bool:
    """True when ``import triton`` works (it is an optional, GPU-oriented dependency)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def chosen_backend(vectors: torch.Tensor, backend: Backend = "auto") -> Literal["torch", "triton"]:
    """The implementation :func:`fused_topk` runs for ``vectors`` on their device.

    ``"auto"`` is Triton for CUDA tensors when triton imports, else torch; the others are kept.

    Raises:
        ValueError: an unknown backend name.
    """
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend != "auto":
        return backend
    cuda = isinstance(vectors, torch.Tensor) and vectors.is_cuda
    return "triton" if cuda and triton_available() else "torch"


def fused_topk(
    queries: torch.Tensor,
    vectors: torch.Tensor,
    days_since_use: torch.Tensor,
    tenant: torch.Tensor,
    source_id: torch.Tensor,
    expires_at: torch.Tensor,
    query_tenant: torch.Tensor,
    now: float,
    k: int,
    params: ScoreParams | None = None,
    valid: torch.Tensor | None = None,
    backend: Backend = "auto",
) -> TopKResult:
    """Fused memory scoring: cosine x time decay, masks, dedup by source id, top-k.

    Semantics (identical for every backend; see ``reference_fused_topk`` for the formula):
    row ``n`` is a candidate for query ``q`` iff ``valid[n]``, ``tenant[n]`` is
    ``query_tenant[q]`` or ``SHARED_TENANT`` (0), ``expires_at[n] > now`` and
    ``cos(q, n) >= params.threshold``; per query the best row of each ``source_id`` is kept and
    the top ``k`` are returned by score descending, ties to the lower row index.

    Args:
        queries: ``[Q, D]`` float32 (normalised here).
        vectors: ``[N, D]`` float32, rows L2-normalised by the caller.
        days_since_use: ``[N]`` float32 days since last use (negative counts as 0).
        tenant: ``[N]`` int64 owner tenant, ``0`` = shared with every tenant.
        source_id: ``[N]`` int64; one result per source id and query.
        expires_at: ``[N]`` float64 epoch seconds, ``+inf`` = never.
        query_tenant: ``[Q]`` int64 tenant of each query.
        now: epoch seconds; rows with ``expires_at <= now`` are expired.
        k: results per query (>= 1); padded with ``-1`` / ``-inf`` / ``nan``.
        params: decay and combination, see ``ScoreParams``.
        valid: ``[N]`` bool, False for deleted / empty slots (default all valid).
        backend: ``"torch"``; ``"triton"`` (CUDA, or the CPU interpreter for tests);
            ``"auto"`` = triton when the tensors are on CUDA and triton imports, else torch.

    Example:
        >>> res = fused_topk(q, v, days, tenant, src, exp, qt, now=time.time(), k=15)
        >>> res.indices  # [Q, 15] rows into the block, -1 where fewer candidates
    """
    if chosen_backend(vectors, backend) == "triton":
        # NOTE: imported lazily so the CPU path never needs triton installed.
        try:
            from recallserve.kernels.fused_score import triton_fused_topk
        except ImportError as exc:
            raise ImportError(
                "backend='triton' needs triton: pip install 'recallserve[gpu]' "
                f"(or use backend='torch'): {exc}"
            ) from exc

        return triton_fused_topk(
            queries, vectors, days_since_use, tenant, source_id, expires_at, query_tenant,
            now, k, params, valid,
        )
    return reference_fused_topk(
        queries, vectors, days_since_use, tenant, source_id, expires_at, query_tenant,
        now, k, params, valid,
    )
