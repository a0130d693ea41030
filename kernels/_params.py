"""Parameters, result type and input validation shared by every fused-scoring backend.

Kept free of triton so the CPU path (``recallserve.kernels.reference``) imports only torch.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from pydantic import Field

from recallserve.kernels._base import StrictModel

__all__ = [
    "SHARED_TENANT", "STORAGE_DTYPES", "ScoreParams", "TopKResult", "CheckedInputs", "check_inputs",
]

#: Rows stored under tenant 0 are visible to every query (shared collections such as manuals).
SHARED_TENANT: int = 0

# NOTE: row indices are packed into the low 32 bits of a sort key (see ``recallserve.kernels._select``),
# and Triton indexes rows with int32 offsets; one block of stored vectors stays below 2**31 rows.
MAX_ROWS: int = 2**31 - 1

#: dtypes the stored vectors may have. Half-precision storage halves the bytes a scan reads;
#: every backend widens each element to float32 before multiplying and accumulates in float32,
#: so the result is the float32 answer for the rounded vectors (the queries stay float32).
STORAGE_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)


class ScoreParams(StrictModel):
    """How a stored row's similarity and age combine into one score.

    ``f`` (time factor) from ``days = max(days_since_use, 0)``:
      * ``none``: ``f = 1``
      * ``hyperbolic``: ``f = 1 / (1 + decay_lambda * days)``  (E-CoT soft decay)
      * ``exponential``: ``f = 0.5 ** (days / half_life_days)``

    Score ``s`` from cosine ``c``:
      * ``product``: ``s = c * f``
      * ``weighted``: ``s = w * c + (1 - w) * f`` with ``w = similarity_weight``

    ``threshold`` masks rows with ``c < threshold`` (on the cosine, not on ``s``).
    """

    decay: Literal["none", "hyperbolic", "exponential"] = Field(
        default="hyperbolic", description="Time-decay law applied to days since last use."
    )
    decay_lambda: float = Field(
        default=0.1, ge=0.0, description="Hyperbolic decay rate: f = 1 / (1 + lambda * days)."
    )
    half_life_days: float = Field(
        default=30.0,
        gt=0.0,
        description="Exponential decay half-life: f = 0.5 ** (days / half_life).",
    )
    combine: Literal["product", "weighted"] = Field(
        default="product",
        description="product: s = cos * f; weighted: s = w * cos + (1 - w) * f.",
    )
    similarity_weight: float = Field(
        default=0.7, ge=0.0, le=1.0, description="w in the weighted combination, in [0, 1]."
    )
    threshold: float = Field(
        default=0.35,
        ge=-1.0,
        le=1.0,
        description="Rows with cosine < threshold are never returned (on cosine, not on score).",
    )


class TopKResult(NamedTuple):
    """Per-query top-k after masking and dedup; rows past the last candidate are padding."""

    scores: torch.Tensor  # [Q, k] float32, descending; -inf where empty
    indices: torch.Tensor  # [Q, k] int64 row indices into the block; -1 where empty
    similarity: torch.Tensor  # [Q, k] float32 cosine of the chosen rows; nan where empty
    time_factor: torch.Tensor  # [Q, k] float32; nan where empty


class CheckedInputs(NamedTuple):
    """Inputs after validation; ``valid`` is always a tensor here."""

    queries: torch.Tensor
    vectors: torch.Tensor
    days_since_use: torch.Tensor
    tenant: torch.Tensor
    source_id: torch.Tensor
    expires_at: torch.Tensor
    query_tenant: torch.Tensor
    valid: torch.Tensor


def _check_tensor(
    name: str, x: object, dtype: torch.dtype | tuple[torch.dtype, ...], ndim: int
) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    allowed = dtype if isinstance(dtype, tuple) else (dtype,)
    if x.dtype not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise ValueError(f"{name} must have dtype {names}, got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    return x


def check_inputs(
    queries: torch.Tensor,
    vectors: torch.Tensor,
    days_since_use: torch.Tensor,
    tenant: torch.Tensor,
    source_id: torch.Tensor,
    expires_at: torch.Tensor,
    query_tenant: torch.Tensor,
    now: float,
    k: int,
    params: ScoreParams,
    valid: torch.Tensor | None,
) -> CheckedInputs:
    """Validate shapes, dtypes and devices; raise ``ValueError`` naming the bad argument.

    Values are not inspected (that would force a device sync); non-finite scores are masked instead.
    """
    _check_tensor("queries", queries, torch.float32, 2)
    _check_tensor("vectors", vectors, STORAGE_DTYPES, 2)
    n = vectors.shape[0]
    if queries.shape[1] != vectors.shape[1]:
        raise ValueError(
            f"queries has dim {queries.shape[1]} but vectors has dim {vectors.shape[1]}"
        )
    if queries.shape[1] < 1:
        raise ValueError("queries/vectors must have at least one column (dim >= 1)")
    if n > MAX_ROWS:
        raise ValueError(f"vectors has {n} rows; at most {MAX_ROWS} per block")
    for name, x, dtype in (
        ("days_since_use", days_since_use, torch.float32),
        ("tenant", tenant, torch.int64),
        ("source_id", source_id, torch.int64),
        ("expires_at", expires_at, torch.float64),
    ):
        _check_tensor(name, x, dtype, 1)
        if x.shape[0] != n:
            raise ValueError(f"{name} has {x.shape[0]} rows but vectors has {n}")
    _check_tensor("query_tenant", query_tenant, torch.int64, 1)
    if query_tenant.shape[0] != queries.shape[0]:
        raise ValueError(
            f"query_tenant has {query_tenant.shape[0]} entries but queries has {queries.shape[0]}"
        )
    if valid is None:
        valid = torch.ones(n, dtype=torch.bool, device=vectors.device)
    else:
        _check_tensor("valid", valid, torch.bool, 1)
        if valid.shape[0] != n:
            raise ValueError(f"valid has {valid.shape[0]} rows but vectors has {n}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if isinstance(now, bool) or not isinstance(now, (int, float)) or now != now:
        raise ValueError(f"now must be a number of epoch seconds, got {now!r}")
    if not isinstance(params, ScoreParams):
        raise ValueError(f"params must be a ScoreParams, got {type(params).__name__}")
    named = {
        "queries": queries,
        "days_since_use": days_since_use,
        "tenant": tenant,
        "source_id": source_id,
        "expires_at": expires_at,
        "query_tenant": query_tenant,
        "valid": valid,
    }
    for name, x in named.items():
        if x.device != vectors.device:
            raise ValueError(f"{name} is on {x.device} but vectors is on {vectors.device}")
    return CheckedInputs(
        queries, vectors, days_since_use, tenant, source_id, expires_at, query_tenant, valid
    )
