"""Exact ordering, dedup-by-source and top-k over packed sort keys (pure torch).

Every backend ranks candidate rows by ``(score descending, row index ascending)``. Both parts are
packed into one int64 key so that a plain ``topk``/``sort`` on the key is exact and tie-free:

    key = (order32(score) << 32) | (0xFFFFFFFF - row)

``order32`` maps float32 bits to an int32 with the same order (negative floats get their
magnitude bits flipped). Larger key <=> higher score, or equal score and lower row index.
Masked rows carry score ``-inf`` and are dropped after selection.
"""

from __future__ import annotations

import torch

from recallserve.kernels._params import ScoreParams

__all__ = [
    "pack_keys",
    "unpack_keys",
    "time_factor",
    "combine",
    "first_k_distinct",
    "select_topk",
    "select_topk_at",
    "select_topk_scores",
]

# NOTE: first prefix scanned for dedup is this many times k; duplicates of one source can push the
# k distinct sources further down, then the prefix grows 4x until it is provably enough.
_PREFIX_FACTOR = 4

_LOW32 = 0xFFFFFFFF
_MAG31 = 0x7FFFFFFF


def pack_keys(score: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """Pack float32 ``score`` and int64 ``row`` (broadcastable) into exact int64 sort keys."""
    bits = score.contiguous().view(torch.int32)
    ordered = bits ^ ((bits >> 31) & _MAG31)
    return (ordered.to(torch.int64) << 32) | (_LOW32 - row)


def unpack_keys(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_keys`: return ``(score float32, row int64)``."""
    ordered = (key >> 32).to(torch.int32)
    bits = ordered ^ ((ordered >> 31) & _MAG31)
    return bits.view(torch.float32), _LOW32 - (key & _LOW32)


def time_factor(days_since_use: torch.Tensor, params: ScoreParams) -> torch.Tensor:
    """Time factor ``f`` per row (float32); negative ages (clock skew) count as 0 days."""
    days = days_since_use.clamp_min(0.0)
    if params.decay == "hyperbolic":
        return 1.0 / (1.0 + params.decay_lambda * days)
    if params.decay == "exponential":
        return torch.exp2(-days / params.half_life_days)
    return torch.ones_like(days)


def combine(cos: torch.Tensor, f: torch.Tensor, params: ScoreParams) -> torch.Tensor:
    """Combined score from cosine and time factor (see ``ScoreParams``)."""
    if params.combine == "product":
        return cos * f
    w = params.similarity_weight
    return w * cos + (1.0 - w) * f


def first_k_distinct(
    keys: torch.Tensor, source_id: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep the first row of each source id in key order, then the first ``k`` of those.

    Args:
        keys: ``[Q, M]`` int64 packed keys, sorted descending along dim 1.
        source_id: ``[N]`` int64 source id per row of the block.
        k: rows to return per query.

    Returns:
        ``(scores [Q, k] float32, rows [Q, k] int64, kept [Q])``: padding is ``-inf`` / ``-1``;
        ``kept`` counts distinct candidate sources found (may exceed ``k``).

    The first occurrence of a source in ``(score desc, row asc)`` order is exactly its best row
    under the tie rule, so dedup is "first occurrence wins".
    """
    s, r, _, kept = _first_k_distinct_at(keys, source_id, k, None)
    return s, r, kept


def _first_k_distinct_at(
    keys: torch.Tensor, source_id: torch.Tensor, k: int, cols: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """:func:`first_k_distinct` that also carries ``cols [Q, M]`` (any int64 payload per key)
    into a ``[Q, k]`` output (``-1`` padding), e.g. the column each key came from."""
    q, m = keys.shape
    device = keys.device
    score, row = unpack_keys(keys)
    live = torch.isfinite(score)
    src = source_id[row.clamp(0, max(source_id.shape[0] - 1, 0))] if m else row
    # NOTE: a stable sort by source keeps key order inside each source group, so the first
    # element of every group is that source's best row.
    order = torch.sort(src, dim=1, stable=True).indices
    src_sorted = torch.gather(src, 1, order)
    live_sorted = torch.gather(live, 1, order)
    first_sorted = torch.ones_like(live_sorted)
    if m > 1:
        # Dead (masked) entries sit below every live one in key order, hence after them in
        # each group: a live row is first iff the previous element is another source.
        first_sorted[:, 1:] = src_sorted[:, 1:] != src_sorted[:, :-1]
    first_sorted &= live_sorted
    keep = torch.zeros_like(live)
    keep.scatter_(1, order, first_sorted)
    rank = torch.cumsum(keep.to(torch.int64), dim=1) - 1
    slot = torch.where(keep & (rank < k), rank, torch.full_like(rank, k))
    out_score = torch.full((q, k + 1), float("-inf"), dtype=torch.float32, device=device)
    out_row = torch.full((q, k + 1), -1, dtype=torch.int64, device=device)
    out_score.scatter_(1, slot, torch.where(keep, score, float("-inf")))
    out_row.scatter_(1, slot, torch.where(keep, row, -1))
    out_col = None
    if cols is not None:
        out_col = torch.full((q, k + 1), -1, dtype=torch.int64, device=device)
        out_col.scatter_(1, slot, torch.where(keep, cols, -1))
        out_col = out_col[:, :k]
    return out_score[:, :k], out_row[:, :k], out_col, keep.sum(dim=1)


def select_topk(
    keys: torch.Tensor, source_id: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact dedup + top-k from unsorted packed keys ``[Q, M]`` (masked entries score ``-inf``).

    The answer is the first ``k`` distinct-source rows in key order. ``topk`` on a prefix of
    ``m`` keys (keys are unique, so ``topk`` is exact) suffices when the prefix already holds
    ``k`` distinct sources, or holds every live key (its last entry is dead), or is all of ``M``;
    otherwise ``m`` grows 4x for the queries still open.

    Returns:
        ``(scores [Q, k] float32, rows [Q, k] int64)`` padded with ``-inf`` / ``-1``.
    """
    s, r, _ = select_topk_at(keys, source_id, k)
    return s, r


def select_topk_at(
    keys: torch.Tensor, source_id: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`select_topk` that also returns where each answer sits in ``keys``.

    Live keys must be unique per query (dead ``-inf`` keys may repeat: they are never chosen).

    Returns:
        ``(scores [Q, k] float32, rows [Q, k] int64, cols [Q, k] int64)``: ``cols`` is the
        column of ``keys`` holding each answer (so ``payload.gather(1, cols)`` fetches values
        stored beside the keys); padding ``-inf`` / ``-1`` / ``-1``.
    """
    q, m_total = keys.shape
    out_s = torch.full((q, k), float("-inf"), dtype=torch.float32, device=keys.device)
    out_r = torch.full((q, k), -1, dtype=torch.int64, device=keys.device)
    out_c = torch.full((q, k), -1, dtype=torch.int64, device=keys.device)
    todo = torch.arange(q, device=keys.device)
    m = min(m_total, _PREFIX_FACTOR * k)
    while todo.numel() and m_total:
        sub = keys if todo.numel() == q else keys[todo]  # NOTE: no [Q, M] copy on round 1
        prefix, cols = torch.topk(sub, m, dim=1, sorted=True)
        s, r, c, kept = _first_k_distinct_at(prefix, source_id, k, cols)
        exhausted = ~torch.isfinite(unpack_keys(prefix[:, -1])[0])
        done = (kept >= k) | exhausted | (m == m_total)
        out_s[todo[done]] = s[done]
        out_r[todo[done]] = r[done]
        out_c[todo[done]] = c[done]  # type: ignore[index]
        todo = todo[~done]
        m = min(m_total, m * _PREFIX_FACTOR)
    return out_s, out_r, out_c


def select_topk_scores(
    score: torch.Tensor, source_id: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``select_topk`` for a dense ``[Q, N]`` float32 score matrix (``-inf`` = masked).

    Same result as ``select_topk(pack_keys(score, arange(N)), ...)`` without packing all N keys:
    a float ``topk`` of ``m`` gives the top-``m`` set under the exact (score desc, row asc) order
    whenever every row equal to the ``m``-th value is inside it (no tie cut at the boundary) or
    that value is ``-inf`` (every live row is inside). Queries with a cut tie are re-ranked on
    packed keys. Inside the prefix, packed keys restore the tie order.
    """
    q, n = score.shape
    out_s = torch.full((q, k), float("-inf"), dtype=torch.float32, device=score.device)
    out_r = torch.full((q, k), -1, dtype=torch.int64, device=score.device)
    todo = torch.arange(q, device=score.device)
    m = min(n, _PREFIX_FACTOR * k)
    while todo.numel() and n:
        sub = score if todo.numel() == q else score[todo]  # NOTE: no [Q, N] copy on round 1
        vals, rows = torch.topk(sub, m, dim=1, sorted=True)
        cut = vals[:, -1:]
        clean = torch.isneginf(cut[:, 0]) | ((sub == cut).sum(1) == (vals == cut).sum(1))
        keys = pack_keys(vals, rows)
        if not bool(clean.all()):
            bad = (~clean).nonzero()[:, 0]
            every = torch.arange(n, dtype=torch.int64, device=score.device).unsqueeze(0)
            keys[bad] = torch.topk(pack_keys(sub[bad], every), m, dim=1, sorted=True).values
        prefix = torch.sort(keys, dim=1, descending=True).values
        s, r, kept = first_k_distinct(prefix, source_id, k)
        exhausted = ~torch.isfinite(unpack_keys(prefix[:, -1])[0])
        done = (kept >= k) | exhausted | (m == n)
        out_s[todo[done]] = s[done]
        out_r[todo[done]] = r[done]
        todo = todo[~done]
        m = min(n, m * _PREFIX_FACTOR)
    return out_s, out_r
