"""Texts and rows shaped like the ones ``recallserve bench search`` writes through the API.

One generator for every benchmark that builds a tenant of support tickets: the cluster's search
bench seeds ``Ticket T-<10000+i>: <12-40 words>.`` through ``POST /v1/memories``; the offline
seed and the in-process shard benches write the same texts with vectors made from a few real
embeddings (:func:`bulk_rows`), so their figures describe the same data.
"""

from __future__ import annotations

import random
import time

import numpy as np

from ..records import EmbeddedRecord, MemoryRecord, private_record_id

__all__ = ["WORDS", "bulk_rows", "query_text", "ticket_text"]

#: the vocabulary of the bench's tickets and queries (support topics: printers, orders, appliances).
WORDS: tuple[str, ...] = tuple(
    "printer jam tray roller toner drum fuser paper error code cartridge scanner wifi driver firmware "
    "invoice refund order delivery courier parcel return label warranty repair boiler valve pump pressure "
    "display ribbon cable thermal fuse grinder burr espresso milk frother descale filter".split())


def ticket_text(rng: random.Random, i: int) -> str:
    """Ticket ``i``: ``"Ticket T-<10000+i>: "`` then 12-40 words of :data:`WORDS`, then a full stop."""
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 40)))
    return f"Ticket T-{10_000 + i}: {words}."


def query_text(rng: random.Random) -> str:
    """A search query: 4 words of :data:`WORDS`."""
    return " ".join(rng.choice(WORDS) for _ in range(4))


def bulk_rows(n: int, distinct: int, base_vectors: np.ndarray, base_words: list[str], tenant: str, tag: str,
              sigma: float, seed: int, start: int = 0) -> list[EmbeddedRecord]:
    """Rows ``start .. n-1`` as ``EmbeddedRecord`` s, in order, without embedding each text.

    Row ``i`` is base text ``i mod distinct`` under its own ticket number, source id
    ``bench-search-<tag>-<i>``, and vector ``normalise(v[i mod distinct] + sigma * g / sqrt(D))``
    with ``g ~ N(0, I)`` (sigma 0.2: cosine ~0.98 to its base): distinct unit rows in the embedder's
    space, and a BM25 index of the bench's vocabulary.
    """
    rng = np.random.default_rng(seed + start)
    dim = base_vectors.shape[1]
    idx = np.arange(start, n) % distinct
    vecs = base_vectors[idx] + (sigma / np.sqrt(dim)) * rng.standard_normal((n - start, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    now = time.time()
    out = []
    for row, i in enumerate(range(start, n)):
        rec = MemoryRecord(id=private_record_id(), tenant=tenant, source_id=f"bench-search-{tag}-{i}",
                           text=f"Ticket T-{10_000 + i}: {base_words[idx[row]]}.", topic_path="bench/search",
                           created_at=now)
        out.append(EmbeddedRecord(rec, vecs[row]))
    return out
