"""Similarity over a conversation's own past messages: retrieval and query discreteness.

The embedder is any callable ``embed(texts) -> np.ndarray[len(texts), dim]`` (the default in
the deployments is MiniLM from ``recallserve.memory_shards.embedders.MiniLMEmbedder().embed``). Vectors are
L2-normalised here, so cosine similarity is a dot product. Message vectors are cached by message
id (messages are immutable), so each message is embedded once per process; the embed call runs
in a worker thread to keep the event loop free.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from recallserve.serve.context._types import Message

__all__ = ["Embed", "EmbeddingCache", "query_discreteness"]

Embed = Callable[[Sequence[str]], np.ndarray]


def _normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"embed: expected a 2-d array [n, dim], got shape {vectors.shape}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    # NOTE: max(norm, 1e-12) keeps an all-zero vector (empty text) at zero instead of NaN.
    return vectors / np.maximum(norms, 1e-12)


class EmbeddingCache:
    """Embeds texts through ``embed`` with an LRU cache keyed by message id.

    Args:
        embed: the embedding callable.
        capacity: most cached vectors (at 384 float32 dims, 100k vectors ~ 150 MB).

    Stored messages are keyed by id (immutable), queries by their text.
    """

    def __init__(self, embed: Embed, capacity: int = 100_000) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity: must be > 0, got {capacity}")
        self._embed = embed
        self._capacity = capacity
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    async def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Normalised vectors of uncached texts (queries)."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        vectors = await asyncio.to_thread(self._embed, list(texts))
        vectors = _normalise(vectors)
        if vectors.shape[0] != len(texts):
            raise ValueError(f"embed: returned {vectors.shape[0]} vectors for {len(texts)} texts")
        return vectors

    async def _embed_keyed(self, keys: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        missing = {k: t for k, t in zip(keys, texts) if k not in self._cache}
        if missing:
            vectors = await self.embed_texts(list(missing.values()))
            for k, v in zip(missing, vectors):
                self._cache[k] = v
        rows = []
        for k, t in zip(keys, texts):
            # NOTE: a vector evicted between the fill above and here (capacity smaller than one
            # batch) is re-embedded alone rather than failing.
            v = self._cache.get(k)
            if v is None:
                v = (await self.embed_texts([t]))[0]
            else:
                self._cache.move_to_end(k)
            rows.append(v)
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)

    async def embed_messages(self, messages: Sequence[Message]) -> np.ndarray:
        """Normalised vectors of ``messages`` (rows in the same order), cached by message id."""
        return await self._embed_keyed([f"m:{m.id}" for m in messages], [m.content for m in messages])

    async def embed_query(self, text: str) -> np.ndarray:
        """Normalised vector of a query, cached by its text (a retried request hits the cache)."""
        return (await self._embed_keyed([f"q:{text}"], [text]))[0]

    async def rank(self, query: str, candidates: Sequence[Message]) -> list[tuple[float, Message]]:
        """Candidates with their cosine similarity to ``query``, best first (ties: newer first)."""
        if not candidates or not query.strip():
            return []
        q = await self.embed_query(query)
        sims = (await self.embed_messages(candidates)) @ q
        order = sorted(range(len(candidates)), key=lambda i: (-float(sims[i]), -candidates[i].seq))
        return [(float(sims[i]), candidates[i]) for i in order]


async def query_discreteness(cache: EmbeddingCache, queries: Sequence[Message]) -> float | None:
    """1 - mean cosine similarity of consecutive user queries; None with fewer than 2.

    A conversation that keeps to one topic scores near 0 (a rolling summary serves it); one that
    jumps between unrelated questions scores high (retrieving the right past turn helps more).

    Example:
        With vectors q1, q2, q3: ``1 - (cos(q1, q2) + cos(q2, q3)) / 2``.
    """
    if len(queries) < 2:
        return None
    # NOTE: pending queries are not stored yet; keying them by text lets the retrieval step
    # of the same request reuse the vector.
    vectors = np.stack([await cache.embed_query(m.content) if m.seq < 0 else (await cache.embed_messages([m]))[0]
                        for m in queries])
    cosines = np.sum(vectors[:-1] * vectors[1:], axis=1)
    return float(np.clip(1.0 - cosines.mean(), 0.0, 2.0))
