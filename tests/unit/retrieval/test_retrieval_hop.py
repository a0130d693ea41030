"""Second hop: the hop query's words, and a bridged memory found only through a first hit."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from recallserve.kernels import ScoreParams
from recallserve.memory_shards import MemoryRecord
from recallserve.memory_shards.records import EmbeddedRecord
from recallserve.memory_shards.retrieval import HybridRetriever, local_hybrid_coordinator
from recallserve.memory_shards.retrieval.hop import hop_query


def test_the_hop_adds_names_first_then_longer_words_never_the_questions_own() -> None:
    q = "What country is Caroline's grandma from?"
    text = "Caroline said on 3 May 2023: My grandma gave me this necklace, she bought it from Lena in 1990."
    assert hop_query(q, text, 2) == f"{q} Lena necklace"
    # NOTE: no number, month or word of the question (by stem: "grandma's" is "grandma").
    assert hop_query(q, text, 50).split(q + " ")[1].split() == ["Lena", "necklace", "bought", "said", "gave"]
    assert hop_query(q, "Caroline's grandma!", 3) is None
    assert hop_query(q, text, 0) is None


def test_a_memory_that_shares_no_word_with_the_question_is_found_through_a_first_hit() -> None:
    coord = local_hybrid_coordinator(2, "designed", 4)
    rows = [("grandma", "My grandma gave me this necklace", [1, 0, 0, 0]),
            ("sweden", "The necklace she gave was made in Sweden", [0, 1, 0, 0]),
            ("other", "A walk in the park", [0, 0, 1, 0])]
    asyncio.run(coord.upsert([EmbeddedRecord(MemoryRecord(tenant="t", source_id=s, text=x, created_at=1e9),
                                             np.array([v], np.float32)) for s, x, v in rows]))
    q = np.array([1, 0, 0, 0], np.float32)

    async def embed(texts):
        return np.stack([q for _ in texts])

    r = HybridRetriever(coord, embed)
    decay = ScoreParams(decay="none", threshold=0.5)
    plain = asyncio.run(r.search("t", "Where is grandma from?", 3, decay, touch=False))
    assert [h.record.source_id for h in plain] == ["grandma"]
    # NOTE: lexical_min_ratio 0: a hop list obeys the weak-overlap rule like any list, and here the
    # bridged memory shares one hop word of three with the first hit.
    hop = r.params.model_copy(update={"hop_hits": 1, "lexical_min_ratio": 0.0})
    hits = asyncio.run(r.search("t", "Where is grandma from?", 3, decay, params=hop, touch=False))
    assert [h.record.source_id for h in hits] == ["grandma", "sweden"]
    # NOTE: only the hop's list holds it: no rank in the question's own lists.
    assert hits[1].dense_rank is None and hits[1].lexical_rank is None
    assert hits[1].score == pytest.approx(r.params.hop_weight * r.params.lexical_weight / (r.params.rrf_k + 2))


def test_a_named_speakers_memories_get_their_own_lists_with_name_weight_or_name_boost() -> None:
    coord = local_hybrid_coordinator(2, "designed", 4)
    rows = [("c1", "Caroline", "I went camping with the kids", [1, 0, 0, 0]),
            ("c2", "Caroline", "Camping at the lake was fun", [0.9, 0.43589, 0, 0]),
            ("m1", "Melanie", "My kids love the outdoors", [0.2, 0.9798, 0, 0])]
    asyncio.run(coord.upsert([EmbeddedRecord(MemoryRecord(tenant="t", source_id=s, text=x, created_at=1e9,
                                                          metadata={"speaker": who}), np.array([v], np.float32))
                              for s, who, x, v in rows]))
    q = np.array([1, 0, 0, 0], np.float32)

    async def embed(texts):
        return np.stack([q for _ in texts])

    r = HybridRetriever(coord, embed)
    decay = ScoreParams(decay="none", threshold=-1.0)
    ask = "What does Melanie do with her kids, camping?"
    off = r.params.model_copy(update={"name_boost": 0.0})
    assert [h.record.source_id for h in asyncio.run(r.search("t", ask, 3, decay, params=off, touch=False))][0] == "c1"
    named = off.model_copy(update={"name_weight": 2.0})
    hits = asyncio.run(r.search("t", ask, 3, decay, params=named, touch=False))
    assert hits[0].record.source_id == "m1"
    # the same from the main candidates alone (no filtered shard call): the named speaker's own ranking
    boosted = off.model_copy(update={"name_boost": 2.0})
    hits = asyncio.run(r.search("t", ask, 3, decay, params=boosted, touch=False))
    assert hits[0].record.source_id == "m1" and {h.record.source_id for h in hits} == {"c1", "c2", "m1"}
    # NOTE: only capitalised words after the first: "What" never becomes a filter.
    assert [f.metadata for f in r._name_filters(ask, None, named)] == [{"speaker": "Melanie"}]
