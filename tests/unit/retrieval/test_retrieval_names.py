"""The named-speaker options: deeper named lists (name_depth), the query without its names (strip_names,
unnamed_weight), each against the same retrieval with the option off."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from recallserve.kernels import ScoreParams
from recallserve.memory_shards import MemoryRecord
from recallserve.memory_shards.records import EmbeddedRecord
from recallserve.memory_shards.retrieval import HybridRetriever, local_hybrid_coordinator
from recallserve.memory_shards.retrieval.hybrid import _without_names

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


def test_without_names_removes_each_name_and_its_possessive_but_never_the_whole_query() -> None:
    assert _without_names("What is Caroline's job and Melanie's?", ["Caroline", "Melanie"]) == "What is job and ?"
    assert _without_names("Melanie", ["Melanie"]) == "Melanie"
    assert _without_names("Where did Mel go?", []) == "Where did Mel go?"


def test_name_depth_lets_the_named_list_read_past_the_main_lists_whose_ranks_stay() -> None:
    r = _retriever(ROWS)
    base = {"dense_candidates": 3, "lexical_candidates": 3, "name_boost": 2.0}
    off = asyncio.run(r.search("t", ASK, 3, DECAY, params=r.params.model_copy(update=base), touch=False))
    assert "m1" not in [h.record.source_id for h in off]
    deep = asyncio.run(r.search("t", ASK, 3, DECAY, params=r.params.model_copy(update={**base, "name_depth": 8}),
                                touch=False))
    by_id = {h.record.source_id: h for h in deep}
    # NOTE: only the named list holds m1 (4th in both main lists of depth 3: no main rank).
    assert by_id["m1"].dense_rank is None and by_id["m1"].lexical_rank is None
    assert deep[0].record.source_id == "m1"
    assert [(h.record.source_id, h.dense_rank, h.lexical_rank) for h in off][:2] == \
        [(h.record.source_id, h.dense_rank, h.lexical_rank) for h in deep[1:]]


def test_strip_names_embeds_the_query_without_its_names() -> None:
    seen: list[list[str]] = []
    r = _retriever(ROWS, seen)
    assert _ids(r, ASK, 1, name_boost=0.0, lexical_weight=0.0)[0] == "c1"
    assert _ids(r, ASK, 1, name_boost=0.0, lexical_weight=0.0, strip_names=True)[0] == "m1"
    assert seen == [[ASK], ["What does do with her kids, camping?"]]


def test_unnamed_weight_adds_the_unnamed_querys_dense_list_in_the_same_embedding_call() -> None:
    seen: list[list[str]] = []
    r = _retriever(ROWS, seen)
    off = r.params.model_copy(update={"name_boost": 0.0})
    before = {h.record.source_id: h for h in asyncio.run(r.search("t", ASK, 4, DECAY, params=off, touch=False))}
    on = off.model_copy(update={"unnamed_weight": 3.0})
    after = {h.record.source_id: h for h in asyncio.run(r.search("t", ASK, 4, DECAY, params=on, touch=False))}
    # NOTE: m1 is first of the unnamed query's dense list (the only vector near it): exactly one more RRF
    # term; its main ranks stay (4th of both lists).
    assert after["m1"].score - before["m1"].score == pytest.approx(3.0 * on.dense_weight / (on.rrf_k + 1))
    assert (after["m1"].dense_rank, after["m1"].lexical_rank) == (before["m1"].dense_rank, before["m1"].lexical_rank) == (4, 4)
    assert seen[-1] == [ASK, "What does do with her kids, camping?"]
    # a query naming nobody: one text embedded, the same ranking as off
    plain = "Who went camping with the kids?"
    assert _ids(r, plain, 4, unnamed_weight=3.0) == _ids(r, plain, 4)
    assert seen[-1] == [plain]
