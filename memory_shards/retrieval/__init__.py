"""Hybrid retrieval over the memory shards: BM25 beside the vectors, reciprocal rank fusion,
a query rewriting hook, and the LoCoMo evidence-recall evaluation.

In-process use::

    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root="data/memory")
    retriever = HybridRetriever(coord, lambda texts: asyncio.to_thread(emb.embed, texts))
    hits = await retriever.search("acme", "paper jam on tray 2", k=16)
"""

from recallserve.memory_shards.retrieval._text import analyse
from recallserve.memory_shards.retrieval.fusion import RRF_K, combined_score, rrf_fuse, time_factor
from recallserve.memory_shards.retrieval.hybrid import (
    AsyncEmbed,
    HybridHit,
    HybridRetriever,
    HybridShardClient,
    LocalHybridShardClient,
    QueryRewriter,
    RetrievalParams,
    RewrittenQuery,
    local_hybrid_coordinator,
)
from recallserve.memory_shards.retrieval.lexical import LexicalIndex
from recallserve.memory_shards.retrieval.rewrite import KeywordRewriter
from recallserve.memory_shards.retrieval.shard import HybridShard, ShardHybridResult, lexical_text

__all__ = [
    "RRF_K",
    "AsyncEmbed",
    "HybridHit",
    "HybridRetriever",
    "HybridShard",
    "HybridShardClient",
    "KeywordRewriter",
    "LexicalIndex",
    "LocalHybridShardClient",
    "QueryRewriter",
    "RetrievalParams",
    "RewrittenQuery",
    "ShardHybridResult",
    "analyse",
    "combined_score",
    "lexical_text",
    "local_hybrid_coordinator",
    "rrf_fuse",
    "time_factor",
]
