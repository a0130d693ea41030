"""BM25 over memory records, one independent collection per tenant, updated in place.

For a query with terms ``t`` (after :func:`~recallserve.memory_shards.retrieval._text.analyse`, each distinct
term counted once) the score of document ``d`` in the tenant's collection is (Okapi BM25 with
Lucene's non-negative idf)::

    idf(t)    = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
    bm25(d)   = sum_t idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))

``N``, ``df`` and ``avgdl`` are those of the tenant's live documents, so one tenant's writes never
change another tenant's scores (and never leak through them). Postings are compact
``array('i')`` buffers read as numpy arrays at query time; deleting a document only marks its
slot dead (and updates ``df``/``N``), and a collection whose dead share exceeds
``compact_dead_ratio`` is rebuilt from its live documents on the next write.

References: Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond" (2009).
"""

from __future__ import annotations

import math
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterable

import numpy as np

from ._text import analyse

__all__ = ["LexicalIndex"]


class _Postings:
    __slots__ = ("docs", "tfs", "cache")

    def __init__(self) -> None:
        self.docs = array("i")
        self.tfs = array("f")
        self.cache: tuple[np.ndarray, np.ndarray] | None = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self.cache is None or self.cache[0].shape[0] != len(self.docs):
            self.cache = (np.frombuffer(self.docs, dtype=np.int32).copy(), np.frombuffer(self.tfs, dtype=np.float32).copy())
        return self.cache


class _Collection:
    """One tenant's documents."""

    def __init__(self) -> None:
        self.doc_ids: list[str | None] = []  # slot -> record id (None = dead)
        self.lengths = array("f")
        self.alive = array("b")
        self.terms: dict[str, _Postings] = {}
        self.df: Counter[str] = Counter()
        self.doc_terms: dict[str, tuple[int, tuple[str, ...]]] = {}  # id -> (slot, distinct terms)
        self.live = 0
        self.total_len = 0.0

    def add(self, record_id: str, terms: list[str]) -> None:
        slot = len(self.doc_ids)
        counts = Counter(terms)
        self.doc_ids.append(record_id)
        self.lengths.append(float(len(terms)))
        self.alive.append(1)
        for term, tf in counts.items():
            post = self.terms.get(term)
            if post is None:
                post = self.terms[term] = _Postings()
            post.docs.append(slot)
            post.tfs.append(float(tf))
            self.df[term] += 1
        self.doc_terms[record_id] = (slot, tuple(counts))
        self.live += 1
        self.total_len += len(terms)

    def remove(self, record_id: str) -> bool:
        entry = self.doc_terms.pop(record_id, None)
        if entry is None:
            return False
        slot, terms = entry
        self.doc_ids[slot] = None
        self.alive[slot] = 0
        for term in terms:
            self.df[term] -= 1
            if self.df[term] <= 0:
                del self.df[term]
        self.live -= 1
        self.total_len -= self.lengths[slot]
        return True

    @property
    def dead(self) -> int:
        return len(self.doc_ids) - self.live


class LexicalIndex:
    """Per-tenant BM25 with upsert/delete by record id (thread-safe).

    Args:
        k1: term-frequency saturation (NOTE: 1.2 is the usual default; short chat turns saturate fast).
        b: length normalisation strength (0.75, the usual default).
        compact_dead_ratio: rebuild a collection once this share of its slots is dead.
        analyser: text -> index terms (:func:`~recallserve.memory_shards.retrieval._text.analyse`;
            ``bench languages`` passes the alternatives it compares).

    Example:
        >>> idx = LexicalIndex()
        >>> idx.add("t1", "r1", "printer jams on tray 2")
        >>> idx.search("t1", "paper jam", 5)[0][0]
        'r1'
    """

    def __init__(self, k1: float = 1.2, b: float = 0.75, compact_dead_ratio: float = 0.3,
                 analyser: Callable[[str], list[str]] = analyse) -> None:
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"k1/b: need k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.k1 = k1
        self.b = b
        self.compact_dead_ratio = compact_dead_ratio
        self._analyse = analyser
        self._collections: dict[str, _Collection] = {}
        self._tenant_of: dict[str, str] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tenant_of)

    def add(self, tenant: str, record_id: str, text: str) -> None:
        """Index (or re-index) ``record_id`` of ``tenant`` with ``text``."""
        self.add_many([(tenant, record_id, text)])

    def add_many(self, items: Iterable[tuple[str, str, str]]) -> None:
        """Index many ``(tenant, record_id, text)``; an id already indexed is replaced."""
        analysed = [(t, r, self._analyse(x)) for t, r, x in items]
        with self._lock:
            touched: set[str] = set()
            for tenant, record_id, terms in analysed:
                self._remove_locked(record_id)
                coll = self._collections.get(tenant)
                if coll is None:
                    coll = self._collections[tenant] = _Collection()
                coll.add(record_id, terms)
                self._tenant_of[record_id] = tenant
                touched.add(tenant)
            for tenant in touched:
                self._maybe_compact(tenant)

    def remove(self, record_id: str) -> bool:
        """Forget ``record_id``; returns False when it was not indexed."""
        with self._lock:
            return self._remove_locked(record_id)

    def _remove_locked(self, record_id: str) -> bool:
        tenant = self._tenant_of.pop(record_id, None)
        if tenant is None:
            return False
        coll = self._collections[tenant]
        coll.remove(record_id)
        if coll.live == 0:
            del self._collections[tenant]
        return True

    def _maybe_compact(self, tenant: str) -> None:
        """Rebuild ``tenant``'s postings without dead slots (slots renumbered, order kept)."""
        coll = self._collections.get(tenant)
        if coll is None or coll.dead < max(64, self.compact_dead_ratio * len(coll.doc_ids)):
            return
        live_slots = [s for s, r in enumerate(coll.doc_ids) if r is not None]
        remap = np.full(len(coll.doc_ids), -1, dtype=np.int64)
        remap[live_slots] = np.arange(len(live_slots))
        fresh = _Collection()
        fresh.doc_ids = [coll.doc_ids[s] for s in live_slots]
        fresh.lengths = array("f", (coll.lengths[s] for s in live_slots))
        fresh.alive = array("b", [1] * len(live_slots))
        for term, post in coll.terms.items():
            docs, tfs = post.arrays()
            keep = remap[docs] >= 0
            if keep.any():
                p = _Postings()
                p.docs = array("i", remap[docs[keep]].astype(np.int32).tobytes())
                p.tfs = array("f", tfs[keep].astype(np.float32).tobytes())
                fresh.terms[term] = p
        fresh.df = coll.df
        fresh.doc_terms = {r: (int(remap[s]), t) for r, (s, t) in coll.doc_terms.items()}
        fresh.live = coll.live
        fresh.total_len = coll.total_len
        self._collections[tenant] = fresh

    def search(
        self, tenant: str, query: str, n: int, accept: Callable[[str], bool] | None = None
    ) -> list[tuple[str, float]]:
        """Best ``n`` documents of ``tenant`` for ``query`` as ``(record_id, bm25)``, best first.

        Only documents with a positive score (sharing at least one term of ``query``) are
        returned; ties go to the earlier-indexed document. ``accept`` filters candidates (kind, expiry...) before the cut, so filtered
        searches still return up to ``n`` hits.
        """
        if n < 1:
            raise ValueError(f"n: must be >= 1, got {n}")
        terms = list(dict.fromkeys(self._analyse(query)))
        with self._lock:
            coll = self._collections.get(tenant)
            if coll is None or not terms:
                return []
            size = len(coll.doc_ids)
            big_n = coll.live
            avgdl = coll.total_len / max(big_n, 1)
            lengths = np.frombuffer(coll.lengths, dtype=np.float32)[:size]
            scores = np.zeros(size, dtype=np.float32)
            norm = self.k1 * (1.0 - self.b + self.b * lengths / max(avgdl, 1e-9))
            for term in terms:
                post = coll.terms.get(term)
                df = coll.df.get(term, 0)
                if post is None or df <= 0:
                    continue
                idf = math.log(1.0 + (big_n - df + 0.5) / (df + 0.5))
                docs, tfs = post.arrays()
                # NOTE: a slot occurs at most once per posting list, so fancy-index += is exact.
                scores[docs] += idf * tfs * (self.k1 + 1.0) / (tfs + norm[docs])
            alive = np.frombuffer(coll.alive, dtype=np.int8)[:size].astype(bool)
            cand = np.flatnonzero((scores > 0) & alive)
            if cand.size == 0:
                return []
            ids = coll.doc_ids
            # NOTE: partial selection of 4n candidates (doubling when ``accept`` rejects too
            # many) avoids sorting every matching document of a 100k-record tenant.
            m = min(cand.size, max(4 * n, 64))
            while True:
                out: list[tuple[str, float]] = []
                if m < cand.size:
                    # NOTE: keep every candidate tied with the m-th score, so ties are broken
                    # by slot below and not by argpartition's arbitrary choice.
                    cut = -np.partition(-scores[cand], m - 1)[m - 1]
                    top = cand[scores[cand] >= cut]
                else:
                    top = cand
                # NOTE: lexsort by (-score, slot) keeps ties in slot (insertion) order.
                order = top[np.lexsort((top, -scores[top]))]
                for slot in order:
                    record_id = ids[slot]
                    if record_id is None or (accept is not None and not accept(record_id)):
                        continue
                    out.append((record_id, float(scores[slot])))
                    if len(out) == n:
                        return out
                if top.size >= cand.size:
                    return out
                m = min(cand.size, 2 * m)
