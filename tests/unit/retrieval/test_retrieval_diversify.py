"""Diversification of the fused list by day or topic: the pure function and the retriever's use of it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from recallserve.kernels import ScoreParams
from recallserve.memory_shards import MemoryRecord
from recallserve.memory_shards.records import EmbeddedRecord
from recallserve.memory_shards.retrieval import HybridRetriever, RetrievalParams, local_hybrid_coordinator
from recallserve.memory_shards.retrieval.diversify import diversify, mmr

DAY = 86_400.0


def _keys(pairs):
    return [k for k, _ in pairs]


SCORED = [("a1", 0.9), ("a2", 0.8), ("a3", 0.7), ("a4", 0.6), ("b1", 0.5), ("c1", 0.2), ("b2", 0.1)]
GROUP = {"a1": "a", "a2": "a", "a3": "a", "a4": "a", "b1": "b", "b2": "b", "c1": "c"}.get


def test_off_keeps_the_order_and_cuts_to_n() -> None:
    assert diversify(SCORED, GROUP, 3) == SCORED[:3]
    assert diversify(SCORED, GROUP, 0, cap=1) == []


def test_a_cap_lets_every_group_in_before_a_crowded_one_fills_the_rest() -> None:
    assert _keys(diversify(SCORED, GROUP, 7, cap=2)) == ["a1", "a2", "b1", "c1", "b2", "a3", "a4"]
    assert _keys(diversify(SCORED, GROUP, 7, cap=1)) == ["a1", "b1", "c1", "a2", "a3", "a4", "b2"]


def test_a_decay_is_soft_a_strong_crowded_hit_still_beats_a_weak_new_group() -> None:
    # a2: 0.8 * 0.5 = 0.4 < b1 0.5; a3 after two a's: 0.7 * 0.25 = 0.175 < c1 0.2
    assert _keys(diversify(SCORED, GROUP, 5, decay=0.5)) == ["a1", "b1", "a2", "c1", "a3"]
    assert _keys(diversify(SCORED, GROUP, 2, decay=0.95)) == ["a1", "a2"]


@pytest.mark.parametrize("cap,decay", [(1, 1.0), (2, 1.0), (0, 0.5), (2, 0.7)])
def test_prefix_consistent_scores_unchanged_nothing_lost(cap: int, decay: float) -> None:
    full = diversify(SCORED, GROUP, len(SCORED), cap=cap, decay=decay)
    assert sorted(full) == sorted(SCORED)
    for n in range(len(SCORED) + 1):
        assert diversify(SCORED, GROUP, n, cap=cap, decay=decay) == full[:n]


def test_bad_knobs_are_named() -> None:
    with pytest.raises(ValueError, match="cap"):
        diversify(SCORED, GROUP, 3, cap=-1)
    with pytest.raises(ValueError, match="decay"):
        diversify(SCORED, GROUP, 3, decay=0.0)
    with pytest.raises(ValueError):
        RetrievalParams(group_by="week")


TERMS = {"a1": frozenset("pottery class kids".split()), "a2": frozenset("pottery class clay".split()),
         "b1": frozenset("camping beach".split()), "c1": frozenset("pottery camping".split())}.get
MSCORED = [("a1", 0.9), ("a2", 0.85), ("b1", 0.5), ("c1", 0.45)]


def test_mmr_puts_a_near_repeat_below_a_new_topic_and_is_off_at_lambda_1() -> None:
    assert mmr(MSCORED, TERMS, 4, lam=1.0) == MSCORED
    # a2 after a1: 0.6 x 0.944 - 0.4 x 0.5 (half its words shared) = 0.367 > b1's 0.6 x 0.556 = 0.333
    assert _keys(mmr(MSCORED, TERMS, 4, lam=0.6)) == ["a1", "a2", "b1", "c1"]
    # at 0.3 the overlap dominates: a2 0.283 - 0.35 < b1 0.167
    assert _keys(mmr(MSCORED, TERMS, 4, lam=0.3)) == ["a1", "b1", "a2", "c1"]


@pytest.mark.parametrize("lam", [0.0, 0.3, 0.7])
def test_mmr_is_prefix_consistent_and_loses_nothing(lam: float) -> None:
    full = mmr(MSCORED, TERMS, 4, lam=lam)
    assert sorted(full) == sorted(MSCORED)
    assert all(mmr(MSCORED, TERMS, n, lam=lam) == full[:n] for n in range(5))
    with pytest.raises(ValueError, match="lam"):
        mmr(MSCORED, TERMS, 2, lam=1.5)


def _retriever():
    """Five memories of one day match best; one of another day matches less (designed vectors)."""
    coord = local_hybrid_coordinator(2, "designed", 4)
    q = np.array([1, 0, 0, 0], np.float32)
    rows = [(f"monday-{i}", "pottery class with the kids", 10 * DAY, "home/monday", 1.0 - 0.01 * i) for i in range(5)]
    rows.append(("friday-0", "camping at the beach", 14 * DAY, "home/friday", 0.8))
    items = []
    for sid, text, at, topic, cos in rows:
        v = np.array([cos, np.sqrt(1 - cos * cos), 0, 0], np.float32)
        items.append(EmbeddedRecord(MemoryRecord(tenant="t", source_id=sid, text=text, created_at=at, topic_path=topic),
                                    v[None, :]))
    asyncio.run(coord.upsert(items))

    async def embed(texts):
        return np.stack([q for _ in texts])

    return HybridRetriever(coord, embed)


@pytest.mark.parametrize("group_by", ["day", "topic"])
def test_the_retriever_lets_another_days_memory_into_the_top_k(group_by: str) -> None:
    r = _retriever()
    decay = ScoreParams(decay="none", threshold=-1.0)
    plain = asyncio.run(r.search("t", "what do they do", 3, decay, touch=False))
    assert [h.record.source_id for h in plain] == ["monday-0", "monday-1", "monday-2"]
    capped = r.params.model_copy(update={"group_cap": 2, "group_by": group_by})
    hits = asyncio.run(r.search("t", "what do they do", 3, decay, params=capped, touch=False))
    assert [h.record.source_id for h in hits] == ["monday-0", "monday-1", "friday-0"]
    # NOTE: the fused RRF score stays each hit's own; the order is the diversified ranking.
    assert hits[2].score < hits[1].score
