"""The eval's vector cache: a text is embedded once, by the real embedder, and read back after."""

from __future__ import annotations

import numpy as np

from loadtests.locomo_vector_cache import CachedEmbedder
from recallserve.memory_shards import HashingEmbedder


class _Counting(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(16)
        self.seen: list[str] = []

    def embed(self, texts):
        self.seen += list(texts)
        return super().embed(texts)


def test_only_misses_reach_the_model_and_vectors_are_the_models() -> None:
    inner, store = _Counting(), {}
    cached = CachedEmbedder(inner, store)
    first = cached.embed(["a cat", "a dog"])
    again = cached.embed(["a dog", "a bird", "a cat"])
    assert inner.seen == ["a cat", "a dog", "a bird"] and cached.misses == 3
    np.testing.assert_array_equal(again, HashingEmbedder(16).embed(["a dog", "a bird", "a cat"]))
    np.testing.assert_array_equal(first[0], again[2])
    assert cached.embed([]).shape == (0, 16)
    # a cache made for another model id never answers for this one
    other = CachedEmbedder(_Counting(), store)
    other.model_id = "another-model"
    other.embed(["a cat"])
    assert other.misses == 1
