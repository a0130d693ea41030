"""Diversification of a fused ranking: by group (the day a memory was written, or its topic), and MMR.

Why: a question whose answer is spread over several conversations ("What activities does Melanie
do?") gets a top-k crowded by one conversation, the one whose words match best; the other
conversations' evidence sits just below k. Pushing a group's 3rd, 4th... hit down lets the next
group's best hit in. NOTE: on the LoCoMo dev file this was the wrong diagnosis (a top-10 already
spans ~4.5 sessions, and a session's neighbouring turns outrank its own evidence), so every knob
here is off by default; ``loadtests/results/locomo-dev-diversify-loo.md``.

Greedy, one pick at a time, over a list already sorted by score ``s`` (best first)::

    n_g        = hits of group g already picked
    adjusted   = s * decay ** n_g                 (decay in (0, 1]; 1 = no penalty)
    eligible   = n_g < cap                        (cap 0 = no cap)
    pick       = the eligible item of largest adjusted score; ties keep list order

and, once no item is eligible (every group left is at its cap) or ``n`` are picked, the items
not picked follow in their original order. The result is prefix-consistent: the first m of a
list of n are the list of m, so recall@10 of a top-20 is that of a top-10. With ``cap = 0`` and
``decay = 1`` the order is unchanged. Cost: O(n x candidates) comparisons, with an early stop
(``adjusted <= s``, so no later item of the sorted list can beat a found ``adjusted`` once its raw
``s`` is below it).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

__all__ = ["diversify", "mmr"]

T = TypeVar("T")


def diversify(scored: Sequence[tuple[T, float]], group_of: Callable[[T], Hashable], n: int,
              cap: int = 0, decay: float = 1.0) -> list[tuple[T, float]]:
    """Reorder ``scored`` (sorted by score, best first) so no group crowds the first ``n``.

    Returns at most ``n`` ``(item, score)`` pairs; the scores are unchanged (non-negative, as
    RRF's), the order is the ranking.

    Example:
        >>> day = {"a1": 1, "a2": 1, "a3": 1, "b1": 2}.get
        >>> [k for k, _ in diversify([("a1", .9), ("a2", .8), ("a3", .7), ("b1", .1)], day, 3, cap=2)]
        ['a1', 'a2', 'b1']
    """
    if cap < 0:
        raise ValueError(f"cap: must be >= 0, got {cap}")
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"decay: must be in (0, 1], got {decay}")
    if n <= 0:
        return []
    if cap == 0 and decay == 1.0:
        return list(scored[:n])
    groups = [group_of(item) for item, _ in scored]
    counts: dict[Hashable, int] = {}
    taken = [False] * len(scored)
    out: list[tuple[T, float]] = []
    while len(out) < n:
        best, best_adj = -1, float("-inf")
        for i, (_, score) in enumerate(scored):
            if best >= 0 and score <= best_adj:
                break  # NOTE: adjusted <= raw score and the list is sorted: nothing later wins.
            if taken[i]:
                continue
            seen = counts.get(groups[i], 0)
            if cap and seen >= cap:
                continue
            adj = score * decay**seen
            if adj > best_adj:
                best, best_adj = i, adj
        if best < 0:
            break
        taken[best] = True
        counts[groups[best]] = counts.get(groups[best], 0) + 1
        out.append(scored[best])
    for i, pair in enumerate(scored):
        if len(out) >= n:
            break
        if not taken[i]:
            out.append(pair)
    return out


def mmr(scored: Sequence[tuple[T, float]], terms_of: Callable[[T], frozenset[str]], n: int,
        lam: float = 1.0) -> list[tuple[T, float]]:
    """Maximal marginal relevance (Carbonell & Goldstein, SIGIR 1998) over word sets.

    Greedy, over ``scored`` sorted best first, with ``rel = s / s_max`` and ``S`` the picked items::

        pick = argmax  lam * rel(d) - (1 - lam) * max_{p in S} jaccard(terms(d), terms(p))

    Jaccard of the items' index terms (``|A & B| / |A | B|``) stands in for vector similarity: the
    hits carry no vectors, and near-repeats (the same topic told twice) share their words. Each
    round updates every candidate's max similarity against the newly picked item only, so the cost
    is O(n x candidates) set intersections. ``lam = 1`` keeps the order. Scores are returned
    unchanged; at most ``n`` pairs, prefix-consistent like :func:`diversify`.

    Example:
        >>> terms = {"a": frozenset("xy"), "a2": frozenset("xy"), "b": frozenset("zw")}.get
        >>> [k for k, _ in mmr([("a", 1.0), ("a2", 0.9), ("b", 0.5)], terms, 3, lam=0.5)]
        ['a', 'b', 'a2']
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam: must be in [0, 1], got {lam}")
    if n <= 0:
        return []
    if lam == 1.0 or not scored:
        return list(scored[:n])
    top = max(s for _, s in scored) or 1.0
    terms = [terms_of(item) for item, _ in scored]
    max_sim = [0.0] * len(scored)
    left = list(range(len(scored)))
    out: list[tuple[T, float]] = []
    while left and len(out) < n:
        best = max(left, key=lambda i: (lam * scored[i][1] / top - (1.0 - lam) * max_sim[i], -i))
        left.remove(best)
        out.append(scored[best])
        picked = terms[best]
        for i in left:
            union = len(terms[i] | picked)
            if union:
                max_sim[i] = max(max_sim[i], len(terms[i] & picked) / union)
    return out
