"""Hybrid retrieval: dense (fused kernel) + lexical (BM25) per shard, fused by reciprocal rank.

One query runs::

    (dense_text, lexical_text) = rewriter(query)            # optional hook, identity by default
    v = embed(dense_text)
    per shard, concurrently:  dense top-Kd (kernel: cos x time, masks, dedup, threshold)
                              lexical top-Kl (BM25 of the tenant + shared collections, same masks)
    dense list   = heap merge of the shards' dense lists by kernel score, one hit per source id
    lexical list = merge by bm25 * time_factor, one hit per source id
    score(d)     = w_dense / (c + rank_dense(d)) + w_lex / (c + rank_lex(d))      (RRF, c = 20,
                                                                         w_dense = 1, w_lex = 1.5)

When the query names a time ("in May 2023", "last week", "yesterday"; rules in
:mod:`~recallserve.memory_shards.retrieval.when`, read against ``now``), the shards are asked a second time,
concurrently, with the same query under a created-at filter for that window (plus
``date_slack_days`` after it), and the two window lists join the fusion with ``date_weight``::

    score(d) += date_weight * (w_dense / (c + rank_dense_in_window(d)) + w_lex / (c + rank_lex_in_window(d)))

so a memory written in the named window moves up without memories outside it being dropped (a
window is a hint: what a memory tells may have happened before it was written).

Named speakers (a question about what a person did is mostly answered by what that person said
or wrote, while other people's memories that address them echo the question's words): for
each capitalised word of the query (at most 2, not the first word), the main dense and lexical
candidates whose ``metadata[name_key]`` (default ``speaker``) is that word, ranked among
themselves, join the fusion as one more pair of lists with ``name_boost`` (default 0.5; no shard
call; nothing changes for memories without that key)::

    score(d) += name_boost * (w_dense / (c + rank_dense_among_named(d)) + w_lex / (c + rank_lex_among_named(d)))

A second hop (``hop_hits``, off by default; 1 = one hop): each of the first ``hop_hits`` fused hits gives one more
lexical query, the question plus that hit's new words (:mod:`~recallserve.memory_shards.retrieval.hop`), asked
after the first fusion (a second, serial round of BM25-only shard calls), whose lists join the fusion::

    score(d) += hop_weight * w_lex / (c + rank_in_hop_list(d))

One more option is off by default though leave-one-conversation-out on the LoCoMo dev file picks it
(``loadtests/results/locomo-dev-names-loo.md``): ``name_weight`` > 0, per name one more dense + BM25
search of the shards filtered to ``metadata[name_key] == name``, which can bring in candidates beyond
the main lists at the cost of a second full search (a metadata filter is checked per visible row).

A lexical-only hit (its cosine below the threshold) is kept only when its BM25 is at least
``lexical_min_ratio`` x the best BM25 of the query: exact names and ids the embedder misses come
through, weak word overlaps do not. The returned hits carry every part of the score.
"""

from __future__ import annotations

import asyncio
import heapq
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np
from pydantic import Field

from recallserve.kernels import ScoreParams, StrictModel

from ..config import SearchFilters, SearchHit
from ..coordinator import LocalShardClient, MemoryCoordinator
from .fusion import rrf_fuse
from .glossary import gloss, has_han
from .hop import hop_query
from .ranker import RankerModel, candidate_features, load_ranker
from .shard import ShardHybridResult
from .when import query_time_window

__all__ = [
    "AsyncEmbed",
    "HybridHit",
    "HybridRetriever",
    "HybridShardClient",
    "LocalHybridShardClient",
    "MAX_SUB_QUERIES",
    "QueryRewriter",
    "RetrievalParams",
    "RewrittenQuery",
    "local_hybrid_coordinator",
]

MAX_SUB_QUERIES = 5
"""NOTE: the most sub-queries one search asks (each is one more shard call per shard)."""

AsyncEmbed = Callable[[list[str]], Awaitable[np.ndarray]]
"""Embeds texts -> [n, D] unit-norm float32 (in-process thread, or the embedder deployment)."""


class RewrittenQuery(NamedTuple):
    """The query as the dense and the lexical sides see it."""

    dense: str
    lexical: str


@runtime_checkable
class QueryRewriter(Protocol):
    """Hook rewriting a query before retrieval (rules, an LLM, a spelling fixer...)."""

    def __call__(self, query: str) -> RewrittenQuery: ...


class RetrievalParams(StrictModel):
    """Knobs of the hybrid fusion."""

    # NOTE: 64 per list: a fixed depth, never varied by leave-one-out. RRF gives a candidate at rank 64
    # w / (c + 64), a quarter of a rank-1 term at c = 20, so deeper lists change the top k little
    # while every extra candidate costs a BM25 pass and a best-part product on the shard.
    dense_candidates: int = Field(default=64, ge=1, le=4096, description="Dense candidates fused per query (at least k).")
    lexical_candidates: int = Field(default=64, ge=0, le=4096, description="BM25 candidates fused per query; 0 = dense only.")
    # NOTE: c = 20 and a lexical weight of 1.5: leave-one-conversation-out on the LoCoMo dev file among
    # c / w_dense / w_lex 20/1/1.5, 20/1/1, 40/1/1.25, 60/1/1.5, 60/1/1 picks c = 20 in every fold and
    # w_lex 1.5 in two of three; held out R@10 0.790 (0.757-0.827), vs 0.755 for 60/1/1 on the same three
    # conversations (loadtests/results/locomo-dev-loo.json). Why in general: a small c lets the head of
    # each list outweigh its tail, and memories are short texts whose exact names and rare words a
    # small sentence embedder reads poorly, so BM25 is the stronger list and the dense one the complement.
    rrf_k: float = Field(default=20.0, ge=0, le=10_000, description="RRF constant c in w / (c + rank).")
    dense_weight: float = Field(default=1.0, ge=0, le=100, description="RRF weight of the dense list.")
    lexical_weight: float = Field(default=1.5, ge=0, le=100, description="RRF weight of the lexical list.")
    # NOTE: 0.5 and 30 days, on by default. Leave-one-conversation-out on the LoCoMo dev file among
    # weights 0 / 0.5 / 1 x slack 7 / 30 picks the window on in 2 of 3 folds (0.5/30 and 1/7; the third
    # picks off), but held out R@10 is 0.798 (0.757-0.829), under off's 0.804: no held-out gain at R@10.
    # On all three conversations 0.5/30 ties off at R@10 (0.804) and is ahead at R@5 (0.712 vs 0.708);
    # loadtests/results/locomo-dev-dates-loo.md. Why in general: a memory written inside the time a
    # question names is likelier to tell what happened then; a window is a hint, so nothing is dropped.
    date_weight: float = Field(
        default=0.5, ge=0, le=100,
        description="Weight of the candidates inside the time window the query names ('in May 2023', 'last week'; "
                    "see memory_shards.retrieval.when), fused as one more dense + BM25 pair of lists; 0 = off.")
    date_slack_days: float = Field(
        default=30.0, ge=0, le=3660,
        description="Days after the named window whose memories still count as inside it (an event is told after it happened).")
    # NOTE: 0.5: set when hybrid retrieval was introduced, never varied by leave-one-out. It keeps a
    # lexical-only hit (an exact name or id the embedder misses) when its BM25 is within a factor 2 of the
    # query's best, and drops weak single-word overlaps below the cosine threshold.
    lexical_min_ratio: float = Field(
        default=0.5, ge=0, le=1,
        description="A hit below the cosine threshold is kept only if its BM25 >= this x the query's best BM25.",
    )
    # NOTE: off: with name_boost on, leave-one-out over hop_hits 0 / 1 / 2 x hop_terms 3 / 6 picks 1/6,
    # 2/6, 1/6, and each held-out conversation is at or above no hop (0.802 / 0.848 / 0.834 vs 0.788 / 0.841
    # / 0.834; held out 0.826, 0.802-0.841), for p50 +4.2 ms in process (loadtests/results/locomo-dev-candidates-loo.md).
    # Through the cpu-local cluster the hop is a second, serial round of shard calls: 2k memories, 1 client
    # p50 / p95 28 / 34 -> 39 / 48 ms, 4 clients 51.8 -> 37.7 searches/s (bench-search-cpu-local-s16.md),
    # for a gain inside the folds' spread. terms 6 / weight 0.3: the earlier grid's points (locomo-dev-hop-loo.md).
    hop_hits: int = Field(
        default=0, ge=0, le=20,
        description="Second hop: the first this-many fused hits each give a lexical query of the question plus the "
                    "hit's new words (memory_shards.retrieval.hop); 0 = off.")
    hop_terms: int = Field(default=6, ge=1, le=50, description="New words of a first hit added to its hop query.")
    hop_weight: float = Field(default=0.3, ge=0, le=100, description="RRF weight of each hop's lexical list.")
    # NOTE: name_weight is off: every leave-one-out fold picks it (R@10 0.818, multi-hop 0.474 vs 0.440), but
    # it is a second full search (p50 15 -> 33 ms in process; a metadata filter is checked per visible row
    # in Python, MemoryShard). name_boost 0.5 is on: the value 2 of 3 folds pick among 0 / 0.5 / 1 / 2 (the
    # third picks 2); held out R@10 0.813 (0.764-0.841) vs 0.804, multi-hop 0.479 vs 0.440, no fold below
    # off, about +1 ms p50 in process and no shard call; loadtests/results/locomo-dev-names-loo.md.
    name_weight: float = Field(default=0.0, ge=0, le=100, description="Weight of a search filtered to metadata[name_key] == a name the query names; 0 = off.")
    name_boost: float = Field(default=0.5, ge=0, le=100, description="Weight of the main candidates of a named speaker, ranked among themselves (no shard call); 0 = off.")
    name_key: str = Field(default="speaker", min_length=1, max_length=64, description="Metadata key holding who said or wrote a memory (name_weight, name_boost).")
    # NOTE: 1.0 over 0.5 on the bilingual set's Chinese questions over its English records (`recallserve bench
    # languages`, row zh>en, MiniLM): R@3 0.906 vs 0.875, R@1 0.656 vs 0.531, at or above on both folds (off: R@3
    # 0.250); over the Chinese records R@3 0.906 either way. The agent eval's Chinese history questions over the
    # demo records: `python -m loadtests.crosslingual_check` (docs/languages.md). Queries without a Han character
    # are not glossed (nothing changes for them).
    gloss_weight: float = Field(
        default=1.0, ge=0, le=100,
        description="Weight of a Chinese query's English gloss (memory_shards.retrieval.glossary, CC-CEDICT), searched "
                    "beside the query as one more dense + BM25 pair of lists: a Chinese question finds English records; "
                    "0 = off.")
    # NOTE: off. The packaged model (logistic, C = 1 untuned, 15 features, `recallserve eval ranker`) re-ranking
    # the fused first 64, leave-one-conversation-out on the LoCoMo dev file: R@10 held out 0.819 (0.787-0.847)
    # vs 0.821 (0.788-0.841) without, conv-30 falls (0.841 -> 0.823); R@1 0.386 -> 0.462 and R@5 0.740 -> 0.761
    # gain on every fold; multi-hop R@10 0.474 -> 0.485 (0.377-0.595). No R@10 gain beyond the spread, the
    # project's switch-on rule; in process +1.6 ms p50 / +3.9 ms p95 per search (loadtests/results/locomo-dev-ranker-loo.md).
    # Switched on, the date-window and named-speaker tests fail (in_window's weight is ~0.05 vs log_len's ~0.5:
    # the dev file has few questions naming a time window); docs/memory-api.md.
    rerank_depth: int = Field(
        default=0, ge=0, le=256,
        description="The first this-many fused hits are re-ordered by the learned ranker (memory_shards.retrieval.ranker, "
                    "the packaged model) before the top k is cut; 0 = off.")

class HybridHit(SearchHit):
    """One fused result and every part of its score (``score`` is the fused RRF score, the ranking key; when the
    learned ranker ordered the hits, ``rerank_depth`` > 0, the key is ``ranker_score``)."""

    dense_score: float = Field(description="Kernel score: cos x time (or the weighted mix).")
    dense_rank: int | None = Field(default=None, description="1-based rank in the dense list; None if absent.")
    lexical_score: float | None = Field(default=None, description="BM25 score; None if not a lexical candidate.")
    lexical_rank: int | None = Field(default=None, description="1-based rank in the lexical list; None if absent.")
    ranker_score: float | None = Field(default=None, description="Logit of the learned ranker when it ordered the hits (rerank_depth > 0).")


@runtime_checkable
class HybridShardClient(Protocol):
    """A ``ShardClient`` that also answers hybrid queries."""

    async def hybrid_search(
        self, query_vector: np.ndarray, lexical_query: str, tenant: str, dense_k: int, lexical_k: int,
        params: ScoreParams, filters: SearchFilters | None, now: float,
    ) -> ShardHybridResult: ...

    async def touch(self, ids: Sequence[str], at: Sequence[float]) -> None: ...


class LocalHybridShardClient(LocalShardClient):
    """In-process client of a :class:`~recallserve.memory_shards.retrieval.shard.HybridShard`."""

    async def hybrid_search(self, query_vector, lexical_query, tenant, dense_k, lexical_k, params, filters, now):
        return await asyncio.to_thread(
            self.shard.hybrid_search, query_vector, lexical_query, tenant, dense_k, lexical_k, params, filters, now,
        )


_NAME = re.compile(r"\b([A-Z][a-z]+)(?:'s)?\b")
"""A capitalised word inside the query (the first word is a question word or a sentence start)."""


def _query_names(query: str) -> list[str]:
    """The names ``query`` names (capitalised words after its first, "Alice's" -> "Alice"), at most 2."""
    return list(dict.fromkeys(m.group(1) for m in _NAME.finditer(query) if m.start() > 0))[:2]


def _is_named(speaker: object, names: set[str]) -> bool:
    """``speaker`` is one of ``names``, or a full name one of whose words is ("Alice Smith" for "Alice")."""
    return isinstance(speaker, str) and (speaker in names or not names.isdisjoint(speaker.split()))


def _named(dense: list, lexical: list, query: str, key: str) -> tuple[list, list]:
    """The candidates of ``dense`` and ``lexical`` whose ``metadata[key]`` is a name ``query`` names, in order."""
    names = set(_query_names(query))
    if not names:
        return [], []
    return ([x for x in dense if _is_named(x[0].metadata.get(key), names)],
            [x for x in lexical if _is_named(x[0].metadata.get(key), names)])


def _merge(lists: list[list[tuple[float, SearchHit, float]]], n: int) -> list[tuple[SearchHit, float]]:
    """Heap-merge per-shard lists of (key, hit, extra) sorted by key desc; one per source id."""
    streams = [[(-key, hit.shard, rank, hit, extra) for rank, (key, hit, extra) in enumerate(lst)] for lst in lists]
    out: list[tuple[SearchHit, float]] = []
    seen: set[str] = set()
    for _, _, _, hit, extra in heapq.merge(*streams, key=lambda x: x[:3]):
        if hit.source_id in seen:
            continue
        seen.add(hit.source_id)
        out.append((hit, extra))
        if len(out) == n:
            break
    return out


class HybridRetriever:
    """Dense + BM25 retrieval over a :class:`MemoryCoordinator` whose shards are hybrid.

    Args:
        coordinator: routes writes; its ``shards`` must implement :class:`HybridShardClient`.
        embed: async text embedder (same model as the stored vectors).
        params: fusion knobs (defaults: 64 candidates per list, c = 20, weights 1 dense / 1.5 lexical).
        rewriter: optional query rewriting hook.
    """

    def __init__(self, coordinator: MemoryCoordinator, embed: AsyncEmbed, params: RetrievalParams | None = None,
                 rewriter: QueryRewriter | None = None, ranker: RankerModel | None = None) -> None:
        for i, shard in enumerate(coordinator.shards):
            if not hasattr(shard, "hybrid_search"):
                raise TypeError(f"coordinator.shards[{i}]: {type(shard).__name__} has no hybrid_search")
        self.coordinator = coordinator
        self.embed = embed
        self.params = params or RetrievalParams()
        self.rewriter = rewriter
        self.ranker = ranker
        """The learned ranker used when ``rerank_depth`` > 0; None = the packaged model."""

    async def search(
        self,
        tenant: str,
        query: str,
        k: int,
        decay: ScoreParams | None = None,
        filters: SearchFilters | None = None,
        now: float | None = None,
        params: RetrievalParams | None = None,
        touch: bool = True,
        sub_queries: Sequence[str] = (),
        sub_query_weight: float = 1.0,
    ) -> list[HybridHit]:
        """The fused top-``k`` of ``tenant``'s (and shared) memories for ``query``.

        ``now`` is also the time the query's time expressions are read against ("last week").
        ``sub_queries`` (at most :data:`MAX_SUB_QUERIES`; ``recallserve eval locomo --decompose`` passes the
        router model's decomposition of ``query``): each is embedded with the query (one embed call) and
        asked of the shards concurrently with it, and its dense + BM25 lists join the fusion::

            score(d) += sub_query_weight * (w_dense / (c + rank_dense_sub(d)) + w_lex / (c + rank_lex_sub(d)))

        No product search passes any: leave-one-out found no gain (loadtests/results/locomo-decompose.md).
        A query with Han characters is also searched as its English gloss (:func:`~.glossary.gloss`), fused the same
        way with ``params.gloss_weight``: a Chinese question over records written in English.
        """
        p = params or self.params
        decay = decay or ScoreParams()
        now = time.time() if now is None else float(now)
        rq = self.rewriter(query) if self.rewriter is not None else RewrittenQuery(query, query)
        subs = [(self.rewriter(q) if self.rewriter is not None else RewrittenQuery(q, q), sub_query_weight)
                for q in list(sub_queries)[:MAX_SUB_QUERIES] if q.strip()] if sub_query_weight > 0 else []
        # NOTE: in a thread: the first Chinese query of a process loads the dictionary (~1-2 s)
        glossed = await asyncio.to_thread(gloss, query) if p.gloss_weight > 0 and has_han(query) else ""
        if glossed:  # NOTE: a Chinese query's English gloss, for records written in English
            subs.append((RewrittenQuery(glossed, glossed), p.gloss_weight))
        vecs = np.asarray(await self.embed([rq.dense, *(s.dense for s, _ in subs)]), dtype=np.float32)
        qvec = vecs[0]
        dense_k = max(k, p.dense_candidates)
        lex_k = max(k, p.lexical_candidates) if p.lexical_candidates > 0 else 0
        ask = partial(self._candidates, tenant, qvec, dense_k, lex_k, decay, now)
        window = self._window_filters(query, filters, now, p)
        # NOTE: the window's candidates are asked concurrently with the main ones (one more shard
        # call each, only for a query that names a time).
        named = self._name_filters(query, filters, p)
        main, *extra = await asyncio.gather(ask(rq.lexical, filters),
                                            *([ask(rq.lexical, window)] if window is not None else []),
                                            *(ask(rq.lexical, f) for f in named),
                                            *(self._candidates(tenant, v, dense_k, lex_k, decay, now, s.lexical, filters)
                                              for (s, _), v in zip(subs, vecs[1:])))
        sub_lists = [extra.pop() for _ in subs][::-1]
        dense, lexical = main[0][:dense_k], main[1][:lex_k]
        lists = [(dense, lexical, 1.0)]
        if window is not None:
            lists.append((*extra.pop(0), p.date_weight))
        lists += [(d, lx, p.name_weight) for d, lx in extra]
        lists += [(d, lx, w) for (d, lx), (_, w) in zip(sub_lists, subs)]
        if p.name_boost > 0:
            lists.append((*_named(*main, query, p.name_key), p.name_boost))
        if p.hop_hits > 0 and p.hop_weight > 0 and lex_k > 0:
            first = self._fuse(lists, p.hop_hits, p, decay.threshold)
            hops = [q for h in first if (q := hop_query(rq.lexical, h.record.text, p.hop_terms)) is not None]
            # NOTE: lexical only (dense_k 0): a hop costs one BM25 pass per shard, no embedding.
            more = await asyncio.gather(*(self._candidates(tenant, qvec, 0, lex_k, decay, now, q, filters)
                                          for q in hops))
            lists += [(d, lx, p.hop_weight) for d, lx in more]
        hits = self._fuse(lists, max(k, p.rerank_depth), p, decay.threshold)
        if p.rerank_depth > 0 and len(hits) > 1:
            hits = self._rerank(query, hits, k, p, now)
        if touch and hits:
            self._touch(hits, now)
        return hits

    @staticmethod
    def _window_filters(query: str, filters: SearchFilters | None, now: float,
                        p: RetrievalParams) -> SearchFilters | None:
        """``filters`` narrowed to the time ``query`` names (plus ``date_slack_days`` after it); None if no window."""
        if p.date_weight <= 0:
            return None
        window = query_time_window(query, now)
        if window is None:
            return None
        f = filters or SearchFilters()
        start = window.start if f.created_after is None else max(window.start, f.created_after)
        end = window.end + p.date_slack_days * 86_400.0
        end = end if f.created_before is None else min(end, f.created_before)
        if end <= start or end <= 0:
            return None
        return f.model_copy(update={"created_after": max(start, 0.0), "created_before": end})

    @staticmethod
    def _name_filters(query: str, filters: SearchFilters | None, p: RetrievalParams) -> list[SearchFilters]:
        """One filter per name in ``query`` (at most 2): ``filters`` plus ``metadata[name_key] == name``."""
        if p.name_weight <= 0:
            return []
        f = filters or SearchFilters()
        return [f.model_copy(update={"metadata": {**(f.metadata or {}), p.name_key: name}}) for name in _query_names(query)]

    async def _candidates(self, tenant: str, qvec: np.ndarray, dense_k: int, lex_k: int, decay: ScoreParams,
                          now: float, lexical_query: str, filters: SearchFilters | None):
        """Every needed shard's dense and lexical candidates, merged: ``(dense, lexical)`` lists."""
        # NOTE: only the shards the tenant's answer needs must answer (its home shard and those
        # that may hold shared rows); see memory_shards.coordinator for what "complete" means.
        coord = self.coordinator
        targets, needed = coord.read_plan(tenant, search=True)
        got: dict[int, ShardHybridResult] = await coord.calls.gather(
            {s: partial(coord.shards[s].hybrid_search, qvec, lexical_query, tenant, dense_k, lex_k, decay, filters, now)
             for s in targets},
            needed,
        )
        for s, r in got.items():
            coord.calls.learn_shared(s, r.shared_rows)
        results = [got[s] for s in sorted(got)]
        dense = _merge([[(h.score, h, h.score) for h in r.dense] for r in results], dense_k)
        lexical = _merge([sorted(((b * h.time_factor, h, b) for h, b in r.lexical), key=lambda x: -x[0])
                          for r in results], lex_k)
        return dense, lexical

    def _fuse(self, lists, k, p: RetrievalParams, threshold: float) -> list[HybridHit]:
        """RRF over every (dense, lexical, weight) pair of lists; the first pair gives the hits' ranks, and a hit
        found by several lists carries its highest cosine (``similarity``: the relevance floors downstream read it)."""
        by_source: dict[str, dict] = {}
        rankings: list[list[str]] = []
        weights: list[float] = []
        for li, (dense, lexical, weight) in enumerate(lists):
            main = li == 0
            for rank, (hit, _) in enumerate(dense, start=1):
                e = by_source.setdefault(hit.source_id, {"hit": hit, "dense_rank": None})
                if hit.similarity > e["hit"].similarity:
                    e["hit"] = hit  # NOTE: its best cosine with any form of the query (a Chinese query's gloss)
                if main:
                    e["dense_rank"] = rank
            best_bm25 = max((b for _, b in lexical), default=0.0)
            # NOTE: the lexical list keeps its true ranks in the fusion; a dropped lexical-only hit
            # still occupies its rank (so a kept hit's RRF term does not depend on what was dropped).
            lex_keys = []
            for rank, (hit, bm25) in enumerate(lexical, start=1):
                lex_keys.append(hit.source_id)
                entry = by_source.get(hit.source_id)
                if entry is None:
                    if hit.similarity < threshold and bm25 < p.lexical_min_ratio * best_bm25:
                        continue
                    entry = by_source[hit.source_id] = {"hit": hit, "dense_rank": None}
                elif hit.similarity > entry["hit"].similarity:
                    entry["hit"] = hit
                if main:
                    entry["lexical_rank"] = rank
                    entry["bm25"] = bm25
            rankings += [[h.source_id for h, _ in dense], lex_keys]
            weights += [p.dense_weight * weight, p.lexical_weight * weight]
        fused = [kv for kv in rrf_fuse(rankings, c=p.rrf_k, weights=weights) if kv[0] in by_source]
        out = []
        for key, score in fused[:k]:
            e = by_source[key]
            h: SearchHit = e["hit"]
            out.append(HybridHit(record=h.record, score=score, similarity=h.similarity, time_factor=h.time_factor,
                                 dense_score=h.score, dense_rank=e["dense_rank"], lexical_score=e.get("bm25"),
                                 lexical_rank=e.get("lexical_rank"), part_index=h.part_index, shard=h.shard))
        return out

    @staticmethod
    def features(query: str, hits: list[HybridHit], p: RetrievalParams, now: float) -> np.ndarray:
        """The learned ranker's features of the fused ``hits`` of ``query`` (``ranker.FEATURES`` columns)."""
        return candidate_features(query, hits, _query_names(query), p.name_key, query_time_window(query, now),
                                  p.date_slack_days * 86_400.0)

    def _rerank(self, query: str, hits: list[HybridHit], k: int, p: RetrievalParams, now: float) -> list[HybridHit]:
        """The first ``k`` of ``hits`` in the learned ranker's order, each with its ``ranker_score``."""
        z = (self.ranker or load_ranker()).score(self.features(query, hits, p, now))
        order = np.argsort(-z, kind="stable")[:k]
        return [hits[i].model_copy(update={"ranker_score": float(z[i])}) for i in order]

    def _touch(self, hits: list[HybridHit], now: float) -> None:
        # NOTE: renewal is off the request path, batched with other searches' (MemoryCoordinator.queue_renewals).
        self.coordinator.queue_renewals(((h.shard, h.record.id) for h in hits), now)

    async def drain(self) -> None:
        """Send queued last-access renewals and wait for them (tests, shutdown)."""
        await self.coordinator.drain_renewals()


def local_hybrid_coordinator(n_shards: int, model_id: str, dim: int, data_root=None, **shard_options) -> MemoryCoordinator:
    """N in-process :class:`HybridShard` s (``data_root/shard-<i>``, or in memory when None).

    The same layout as ``recallserve.memory_shards.local_coordinator``: a Ray deployment of shard i opens
    the same folder, so data written in-process is served by the cluster and back.
    """
    from pathlib import Path

    from ..config import ShardConfig
    from ..shard import MemoryShard
    from .shard import HybridShard

    if n_shards < 1:
        raise ValueError(f"n_shards: must be >= 1, got {n_shards}")
    clients = []
    for i in range(n_shards):
        data_dir = None if data_root is None else str(Path(data_root) / f"shard-{i}")
        cfg = ShardConfig(shard_id=i, data_dir=data_dir, model_id=model_id, dim=dim, **shard_options)
        clients.append(LocalHybridShardClient(HybridShard(MemoryShard(cfg))))
    return MemoryCoordinator(clients)
