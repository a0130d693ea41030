"""The named speaker's lists (name_boost, on by default): a query naming someone lifts what that person
said, by exactly one more pair of RRF terms, against the same retrieval with the option off."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from recallserve.kernels import ScoreParams
from recallserve.memory_shards import MemoryRecord
from recallserve.memory_shards.records import EmbeddedRecord
from recallserve.memory_shards.retrieval import HybridRetriever, local_hybrid_coordinator

DECAY = ScoreParams(decay="none", threshold=-1.0)
ASK = "What does Melanie do with her kids, camping?"
# NOTE: a vector per text: a query naming Melanie points at Caroline's turns (which name her as the
# addressee); the same query without the name points at Melanie's own turn.
NAMED, UNNAMED = np.array([1, 0, 0, 0], np.float32), np.array([0, 0, 0, 1], np.float32)


def _retriever(rows: list[tuple[str, str, str, list[float]]], seen: list[list[str]] | None = None) -> HybridRetriever:
    coord = local_hybrid_coordinator(2, "designed", 4)
    asyncio.run(coord.upsert([EmbeddedRecord(MemoryRecord(tenant="t", source_id=s, text=x, created_at=1e9,
                                                          metadata={"speaker": who}), np.array([v], np.float32))
                              for s, who, x, v in rows]))

    async def embed(texts: list[str]) -> np.ndarray:
        if seen is not None:
            seen.append(list(texts))
        return np.stack([NAMED if "Melanie" in t else UNNAMED for t in texts])

    return HybridRetriever(coord, embed)


ROWS = [("c1", "Caroline", "Melanie, camping with the kids is fun", [1, 0, 0, 0]),
        ("c2", "Caroline", "Camping with kids at the lake, Melanie", [0.9, 0.43589, 0, 0]),
        ("c3", "Caroline", "The kids went camping, Melanie", [0.8, 0.6, 0, 0]),
        ("m1", "Melanie", "We roasted marshmallows at the beach", [0, 0, 0.6, 0.8])]


def _ids(r: HybridRetriever, query: str, k: int, **update: object) -> list[str]:
    p = r.params.model_copy(update=update)
    return [h.record.source_id for h in asyncio.run(r.search("t", query, k, DECAY, params=p, touch=False))]


def test_name_boost_lifts_the_named_speakers_own_turn_by_one_pair_of_rrf_terms() -> None:
    r = _retriever(ROWS)
    on = r.params
    assert on.name_boost > 0  # the default
    off = on.model_copy(update={"name_boost": 0.0})
    before = {h.record.source_id: h for h in asyncio.run(r.search("t", ASK, 4, DECAY, params=off, touch=False))}
    after = asyncio.run(r.search("t", ASK, 4, DECAY, params=on, touch=False))
    # NOTE: m1 is the named speaker's only turn, so it is first of both named lists: one more
    # name_boost x (w_dense + w_lex) / (c + 1); its main ranks stay (4th of both lists).
    assert (before["m1"].dense_rank, before["m1"].lexical_rank) == (4, 4)
    assert sorted(before, key=lambda i: -before[i].score)[-1] == "m1"
    assert after[0].record.source_id == "m1"
    assert after[0].score - before["m1"].score == pytest.approx(
        on.name_boost * (on.dense_weight + on.lexical_weight) / (on.rrf_k + 1))
    # a query naming nobody: the same ranking as off
    plain = "Who went camping with the kids?"
    assert _ids(r, plain, 4) == _ids(r, plain, 4, name_boost=0.0)
