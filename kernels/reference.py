"""Pure-torch fused memory scoring: the CPU production path and the oracle for the Triton kernel.

Never imports triton. Same semantics as ``recallserve.kernels.fused_score.triton_fused_topk``.

Sparse after the matmul: rows are scanned in chunks; per chunk, one float32 ``[Q, C]`` cosine
tile, then only the ``(query, row)`` pairs with ``cos >= threshold`` (about 1% at 0.35) are
masked (valid, tenant, expiry), decayed and scored, and kept as packed ``(score, row)`` keys
(``recallserve.kernels._select``). One exact dedup + top-k over all kept keys ends the call. So the call
costs about the matmul alone: no ``[Q, N]`` mask, score or int64 temporaries, no ``[N]`` pass
for the time factor. Chunks where many pairs pass (low thresholds) are scored densely instead.
"""

from __future__ import annotations

import numpy as np
import torch

from recallserve.kernels._params import SHARED_TENANT, CheckedInputs, ScoreParams, TopKResult, check_inputs
from recallserve.kernels._select import combine, pack_keys, select_topk_at, select_topk_scores, time_factor

__all__ = [
    "reference_fused_topk",
    "masked_scores",
    "normalize_queries",
    "empty_result",
    "finish_result",
]

# NOTE: bounds the [Q, rows_per_chunk] cosine tile (and the dense fallback's score / mask
# temporaries) to 16 MB each, so a 1M-row block never materialises Q x N matrices at once.
# Smaller tiles were no faster at 1 thread and slower at 2 (one OpenMP matmul region per tile,
# each paying a barrier on shared cores): 1<<20 cost +15%, 1<<22 +3-10% over one bare matmul.
_MAX_TILE_ELEMENTS = 1 << 22
# NOTE: a chunk where more than 1/_DENSE_SHARE of the (query, row) pairs pass the threshold is
# scored densely (masks on the whole tile, then its own top-k); below that, gathering the few
# survivors is far cheaper (~1% pass at threshold 0.35 on real embeddings).
_DENSE_SHARE = 8
# NOTE: the dense path makes ~8 passes over its [Q, C] temporaries; 4 MB slices of the tile
# keep them in cache (16 MB slices cost +30% at threshold -1).
_DENSE_TILE_ELEMENTS = 1 << 20
# NOTE: bound on the padded [Q, width] candidate layout (width = most candidates of one query)
# before it is compacted to each query's k best distinct sources: ~12 bytes per slot plus 28
# per stored candidate, so well under 200 MB even when a low threshold lets many rows through.
_MAX_SURVIVORS = 1 << 21


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
    cos = qn @ vectors.float().T
    return cos, _dense_scores(cos, f, row_ok, tenant, query_tenant, params)


def _dense_scores(
    cos: torch.Tensor,
    f: torch.Tensor,
    row_ok: torch.Tensor,
    tenant: torch.Tensor,
    query_tenant: torch.Tensor,
    params: ScoreParams,
) -> torch.Tensor:
    """Score ``[Qc, N]`` from a cosine tile, ``-inf`` wherever the row is not a candidate."""
    # NOTE: one [N] visibility row per distinct query tenant (usually 1-2 per batch), gathered
    # per query: one [Qc, N] pass instead of two compares and an or.
    tenants, which = torch.unique(query_tenant, return_inverse=True)
    allowed = row_ok & ((tenant == tenants.unsqueeze(1)) | (tenant == SHARED_TENANT))
    ok = allowed[which]
    ok &= cos >= params.threshold
    score = combine(cos, f.unsqueeze(0), params)
    # NOTE: `score == score` drops NaN (e.g. a NaN vector or age) instead of ranking it.
    ok &= score == score
    return score.masked_fill_(~ok, float("-inf"))


def _sparse_hits(cos: torch.Tensor, threshold: float, max_hits: int) -> torch.Tensor | None:
    """Flat indices (row-major, ascending) of ``cos >= threshold`` in a ``[Qc, C]`` tile, or
    ``None`` when more than ``max_hits`` pass (the tile is then scored densely)."""
    if cos.device.type == "cpu":
        # NOTE: numpy runs this compare + count + scan single-threaded; the same torch ops are
        # OpenMP regions, each paying a barrier that costs milliseconds when the cores are
        # shared (measured 2x the whole call at 2 threads, load 10). Both compare in float32.
        hit = cos.detach().numpy() >= np.float32(threshold)
        if np.count_nonzero(hit) > max_hits:
            return None
        return torch.from_numpy(np.flatnonzero(hit))
    hit = cos >= threshold
    if int(hit.count_nonzero()) > max_hits:
        return None
    return hit.view(-1).nonzero().squeeze(1)


class _RowTerms:
    """Per-row time factor ``f`` and ``valid & not expired``, computed for the rows asked for.

    Only rows over the threshold (~1%) pay for them, and no [N]-sized pass runs per call.
    """

    def __init__(self, x: CheckedInputs, now: float, params: ScoreParams) -> None:
        self.x, self.now, self.params = x, float(now), params
        # NOTE: exp2's vectorised and scalar (loop tail) paths may differ by an ulp, so the
        # exponential factor is computed once over all rows and gathered: a row's f never
        # depends on the subset it came with. The other laws use only correctly rounded
        # +, *, / and give the same bits on any subset.
        self.f_all = (
            time_factor(x.days_since_use, params) if params.decay == "exponential" else None
        )

    def factor(self, rows: torch.Tensor | slice) -> torch.Tensor:
        """``f`` of ``rows`` (an index tensor or a slice)."""
        if self.f_all is not None:
            return self.f_all[rows]
        return time_factor(self.x.days_since_use[rows], self.params)

    def ok(self, rows: torch.Tensor | slice) -> torch.Tensor:
        """``valid & (expires_at > now)`` of ``rows``."""
        return self.x.valid[rows] & (self.x.expires_at[rows] > self.now)


def _dense_topk(
    cos: torch.Tensor,
    lo: int,
    hi: int,
    x: CheckedInputs,
    terms: _RowTerms,
    k: int,
    params: ScoreParams,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k distinct ``(scores, rows, cos)`` ``[Q, k]`` of rows ``lo:hi`` (cosines ``cos``)."""
    rows = slice(lo, hi)
    score = _dense_scores(
        cos, terms.factor(rows), terms.ok(rows), x.tenant[rows], x.query_tenant, params
    )
    s, r = select_topk_scores(score, x.source_id[rows], k)
    return s, torch.where(r >= 0, r + lo, r), cos.gather(1, r.clamp_min(0))


class _Candidates:
    """Candidate ``(query, packed key, cosine)`` triples gathered chunk by chunk.

    Every batch added is sorted by query (``nonzero`` and ``[Q, k]`` results are row-major), so
    a triple's column in the final ``[Q, width]`` layout is the count of earlier triples of its
    query: no sort of the triples is needed.
    """

    def __init__(self, q: int, device: torch.device) -> None:
        self.q = q
        self.device = device
        self._reset()

    def _reset(self) -> None:
        self.filled = torch.zeros(self.q, dtype=torch.int64, device=self.device)
        self.width = 0
        self.parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def add(self, qi: torch.Tensor, key: torch.Tensor, cos: torch.Tensor) -> None:
        """Append triples whose ``qi`` is non-decreasing."""
        if qi.numel() == 0:
            return
        count = torch.bincount(qi, minlength=self.q)
        start = torch.cumsum(count, 0) - count
        col = self.filled[qi] + torch.arange(qi.numel(), device=self.device) - start[qi]
        self.filled += count
        self.width = int(self.filled.max())
        self.parts.append((qi, col, key, cos))

    def select(
        self, source_id: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Exact dedup + top-k of every triple: ``(scores, rows, cos)``, each ``[Q, k]``."""
        width = max(1, self.width)
        dead = pack_keys(
            torch.full((1,), float("-inf"), device=self.device),
            torch.zeros(1, dtype=torch.int64, device=self.device),
        )
        keys = dead.expand(self.q, width).clone()
        cos = torch.zeros((self.q, width), dtype=torch.float32, device=self.device)
        for qi, col, key, c in self.parts:
            keys[qi, col] = key
            cos[qi, col] = c
        s, r, at = select_topk_at(keys, source_id, k)
        return s, r, cos.gather(1, at.clamp_min(0))

    def compact(self, source_id: torch.Tensor, k: int) -> None:
        """Keep only each query's current top-k (exact: see ``reference_fused_topk``)."""
        s, r, c = self.select(source_id, k)
        self._reset()
        self.add_topk(s, r, c)

    def add_topk(self, s: torch.Tensor, r: torch.Tensor, c: torch.Tensor) -> None:
        """Append a ``[Q, k]`` result (``r`` global rows, ``-1`` padding)."""
        live = r >= 0
        qi = torch.arange(self.q, device=self.device).unsqueeze(1).expand_as(r)[live]
        self.add(qi, pack_keys(s[live], r[live]), c[live])


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
    terms = _RowTerms(x, now, params)
    # NOTE: chunks of rows, not of queries: each vector is read once. A chunk contributes either
    # all its candidates (sparse: the pairs over the threshold, masked and scored one by one) or
    # its own top-k distinct list (dense); the latter holds every global answer row of the chunk
    # (a row's distinct-source rank inside its chunk is <= its global rank), so one dedup +
    # top-k over everything gathered is exact. The same argument makes compaction exact.
    chunk = max(1, _MAX_TILE_ELEMENTS // q)
    found = _Candidates(q, device)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        # NOTE: half-precision storage is widened per chunk (fp32 products and sums, as in the
        # Triton kernel); a float32 block is used as is (``.float()`` returns it uncopied).
        cos = qn @ x.vectors[lo:hi].float().T
        flat = _sparse_hits(cos, params.threshold, cos.numel() // _DENSE_SHARE)
        if flat is None:
            step = max(1, _DENSE_TILE_ELEMENTS // q)
            if lo == 0 and hi == n and step >= n:
                # NOTE: one dense tile holds every row: its own top-k distinct list is already the
                # answer (the final dedup + top-k over it returns it unchanged), so the second
                # selection is skipped: -1.3 ms of ~5 for one query over 2,000 rows.
                s, r, c = _dense_topk(cos, 0, n, x, terms, k, params)
                return finish_result(s, r, c, terms.factor(r.clamp_min(0)))
            for a in range(lo, hi, step):
                b = min(hi, a + step)
                found.add_topk(*_dense_topk(cos[:, a - lo : b - lo], a, b, x, terms, k, params))
        elif flat.numel():
            qi = torch.div(flat, hi - lo, rounding_mode="floor")
            row = flat - qi * (hi - lo) + lo
            t = x.tenant[row]
            ok = terms.ok(row) & ((t == x.query_tenant[qi]) | (t == SHARED_TENANT))
            c = cos.view(-1)[flat]
            s = combine(c, terms.factor(row), params)
            # NOTE: `s == s` drops NaN (e.g. a NaN age) instead of ranking it.
            ok &= s == s
            found.add(qi[ok], pack_keys(s[ok], row[ok]), c[ok])
        # NOTE: a chunk adds at most `chunk` candidates per query, so the layout stays below
        # the limit plus one tile; 4 q k keeps compaction from running on every chunk.
        if q * found.width > max(_MAX_SURVIVORS, 4 * q * k):
            found.compact(x.source_id, k)
    s, r, c = found.select(x.source_id, k)
    return finish_result(s, r, c, terms.factor(r.clamp_min(0)))
