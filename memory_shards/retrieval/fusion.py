"""Rank fusion and the time factor shared by the dense and lexical lists.

Reciprocal rank fusion (Cormack, Clarke & Buettcher, SIGIR 2009) of ranked lists ``L_i`` with
weights ``w_i``::

    rrf(d) = sum_i  w_i / (c + rank_i(d))        rank_i starts at 1; absent -> no term

RRF needs no score calibration between lists (cosine in [-1, 1] vs unbounded BM25), which is why
it is the fusion of the hybrid retriever. ``c = 60`` is the constant of the paper.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

from recallserve.kernels import ScoreParams

__all__ = ["rrf_fuse", "time_factor", "combined_score", "RRF_K"]

K = TypeVar("K", bound=Hashable)

RRF_K = 60.0
"""NOTE: the constant of Cormack et al.; smaller values sharpen the weight of the first ranks."""

_SECONDS_PER_DAY = 86_400.0


def rrf_fuse(
    rankings: Sequence[Sequence[K]], c: float = RRF_K, weights: Sequence[float] | None = None
) -> list[tuple[K, float]]:
    """Fuse ranked lists of keys into one ``[(key, rrf score)]`` list, best first.

    Ties keep the order of first appearance (list 0 first), so fusion is deterministic.

    Example:
        >>> rrf_fuse([["a", "b"], ["b", "c"]], c=60)[0][0]
        'b'
    """
    if c < 0:
        raise ValueError(f"c: must be >= 0, got {c}")
    weights = [1.0] * len(rankings) if weights is None else list(weights)
    if len(weights) != len(rankings):
        raise ValueError(f"weights: {len(weights)} weights for {len(rankings)} rankings")
    scores: dict[K, float] = {}
    for ranking, weight in zip(rankings, weights):
        seen: set[K] = set()
        for rank, key in enumerate(ranking, start=1):
            if key in seen:
                continue
            seen.add(key)
            scores[key] = scores.get(key, 0.0) + weight / (c + rank)
    order = {key: i for i, key in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], order[kv[0]]))


def time_factor(params: ScoreParams, last_access_at: float, now: float) -> float:
    """The kernel's time factor of one record (see ``recallserve.kernels.ScoreParams``).

    ``days = max(0, now - last_access_at) / 86400``; ``none`` -> 1, ``hyperbolic`` ->
    ``1 / (1 + lambda * days)``, ``exponential`` -> ``0.5 ** (days / half_life_days)``.
    """
    days = max(0.0, now - last_access_at) / _SECONDS_PER_DAY
    if params.decay == "none":
        return 1.0
    if params.decay == "hyperbolic":
        return 1.0 / (1.0 + params.decay_lambda * days)
    return 0.5 ** (days / params.half_life_days)


def combined_score(params: ScoreParams, similarity: float, factor: float) -> float:
    """The kernel's combined score: ``cos * f`` or ``w * cos + (1 - w) * f``."""
    if params.combine == "product":
        return similarity * factor
    w = params.similarity_weight
    return w * similarity + (1.0 - w) * factor
