"""Pure-torch fused memory scoring: the CPU production path and the oracle for the Triton kernel.

Never imports triton. Same semantics as ``kernels.fused_score.triton_fused_topk``.
"""

from __future__ import annotations

import torch

from kernels._params import SHARED_TENANT, ScoreParams, TopKResult, check_inputs
from kernels._select import combine, pack_keys, select_topk, select_topk_scores, time_factor

__all__ = [
    "reference_fused_topk",
    "masked_scores",
    "normalize_queries",
    "empty_result",
    "finish_result",
]

# NOTE: bounds the [Q, rows_per_chunk] cos / score / mask temporaries to ~8 MB each, so a
# 1M-row block never materialises Q x N matrices at once.
_MAX_TILE_ELEMENTS = 1 << 21


def normalize_queries(queries: torch.Tensor) -> torch.Tensor:
    """``q / max(||q||, 1e-12)``; a zero query gets cosine 0 with every row."""
    # NOTE: 1e-12 is torch.nn.functional.normalize's eps; both backends share this function.
    return queries / queries.norm(dim=1, keepdim=True).clamp_min(1e-12)


def empty_result(q: int, k: int, device: torch.device) -> TopKResult:
    """All-padding result: ``-inf`` scores, ``-1`` rows, ``nan`` similarity and time factor."""
    nan = torch.full((q, k), float("nan"), dtype=torch.float32, device=device)
    return TopKResult(
        torch.full((q, k), float("-inf"), dtype=torch.float32, device=device),
        torch.full((q, k), -1, dtype=torch.int64, device=device),
        nan,
        nan.clone(),
    )


def finish_result(
    scores: torch.Tensor, rows: torch.Tensor, cos: torch.Tensor, f_rows: torch.Tensor
) -> TopKResult:
    """Attach similarity / time factor, putting ``nan`` in padded slots."""
    empty = rows < 0
    nan = torch.tensor(float("nan"), dtype=torch.float32, device=rows.device)
    return TopKResult(
        scores, rows, torch.where(empty, nan, cos), torch.where(empty, nan, f_rows)
    )


def masked_scores(
    qn: torch.Tensor,
    vectors: torch.Tensor,
    f: torch.Tensor,
    row_ok: torch.Tensor,
    tenant: torch.Tensor,
    query_tenant: torch.Tensor,
    params: ScoreParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos [Qc, N], score [Qc, N])`` with ``-inf`` score wherever the row is not a candidate."""
    cos = qn @ vectors.T
    # NOTE: one [N] visibility row per distinct query tenant (usually 1-2 per batch), gathered
    # per query: one [Qc, N] pass instead of two compares and an or.
    tenants, which = torch.unique(query_tenant, return_inverse=True)
    allowed = row_ok & ((tenant == tenants.unsqueeze(1)) | (tenant == SHARED_TENANT))
    ok = allowed[which]
    ok &= cos >= params.threshold
    score = combine(cos, f.unsqueeze(0), params)
    # NOTE: `score == score` drops NaN (e.g. a NaN vector or age) instead of ranking it.
    ok &= score == score
    return cos, score.masked_fill_(~ok, float("-inf"))


def reference_fused_topk(
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
) -> TopKResult:
    """Score, mask, dedup by source id and take the top-k rows per query (pure torch).

    Formula (``c`` cosine, ``f`` time factor, ``days = max(days_since_use, 0)``):
        ``f = 1/(1 + lambda*days)`` | ``0.5 ** (days/half_life)`` | ``1``;
        ``s = c * f`` (product) or ``s = w*c + (1-w)*f`` (weighted).

    Row ``n`` is a candidate for query ``q`` iff ``valid[n]`` and ``tenant[n]`` is
    ``query_tenant[q]`` or ``SHARED_TENANT`` and ``expires_at[n] > now`` and
    ``c >= threshold`` and ``s`` is not NaN. Per query, only the best candidate of each
    ``source_id`` is kept; results are ordered by score descending. Ties (equal float32 score)
    go to the lower row index, both in dedup and in the order. Missing slots: score ``-inf``,
    index ``-1``, similarity and time factor ``nan``.

    Example:
        >>> r = reference_fused_topk(q, v, days, tenant, src, exp, qt, now=time.time(), k=10)
        >>> r.indices[0]  # rows of the block, best first
    """
    params = ScoreParams() if params is None else params
    x = check_inputs(
        queries, vectors, days_since_use, tenant, source_id, expires_at, query_tenant,
        now, k, params, valid,
    )
    q, n = x.queries.shape[0], x.vectors.shape[0]
    device = x.vectors.device
    if q == 0 or n == 0:
        return empty_result(q, k, device)
    qn = normalize_queries(x.queries)
    f = time_factor(x.days_since_use, params)
    row_ok = x.valid & (x.expires_at > float(now))
    # NOTE: chunks of rows, not of queries: each vector is read once, and a chunk's own top-k
    # distinct list holds every global answer row of that chunk (a row's distinct-source rank
    # inside its chunk is <= its global rank), so merging the chunk lists is exact.
    chunk = max(1, _MAX_TILE_ELEMENTS // q)
    parts_s, parts_r, parts_c = [], [], []
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        cos, score = masked_scores(
            qn, x.vectors[lo:hi], f[lo:hi], row_ok[lo:hi], x.tenant[lo:hi], x.query_tenant, params
        )
        s, r = select_topk_scores(score, x.source_id[lo:hi], k)
        parts_s.append(s)
        parts_c.append(cos.gather(1, r.clamp_min(0)))
        parts_r.append(torch.where(r >= 0, r + lo, r))
    if len(parts_s) == 1:
        s, r, c = parts_s[0], parts_r[0], parts_c[0]
    else:
        all_s, all_r, all_c = (torch.cat(p, dim=1) for p in (parts_s, parts_r, parts_c))
        s, r = select_topk(pack_keys(all_s, all_r.clamp_min(0)), x.source_id, k)
        # NOTE: a row lives in one chunk, so it matches exactly one merged column.
        where = (all_r.unsqueeze(2) == r.unsqueeze(1)).to(torch.int8).argmax(dim=1)
        c = all_c.gather(1, where)
    return finish_result(s, r, c, f[r.clamp_min(0)])
