"""Memory tier: records, embedders, one shard (fused scan / IVF, WAL, snapshots), the sharded coordinator.

Quick use (in-process)::

    from memory_shards import MemoryRecord, MiniLMEmbedder, embed_records, local_coordinator
    emb = MiniLMEmbedder()
    coord = local_coordinator(2, emb.model_id, emb.dim, data_root="data/memory")
    await coord.upsert(embed_records(emb, [MemoryRecord(tenant="t1", source_id="s1", text="...")]))
    hits = await coord.search("t1", emb.embed(["query"]), k=20)
"""

from kernels import ScoreParams

from .config import SearchFilters, SearchHit, ShardConfig
from .coordinator import LocalShardClient, MemoryCoordinator, ShardClient, embed_records, local_coordinator
from .embedders import EMBEDDER_MODELS, Embedder, HashingEmbedder, MiniLMEmbedder, build_embedder, embedder_identity, l2_normalise
from .records import (
    KINDS,
    SHARED_TENANT_NAME,
    EmbeddedRecord,
    MemoryKind,
    MemoryPart,
    MemoryRecord,
    new_record_id,
    source_key,
    tenant_key,
)
from .shard import MemoryShard

__all__ = [
    "KINDS",
    "SHARED_TENANT_NAME",
    "EmbeddedRecord",
    "EMBEDDER_MODELS",
    "Embedder",
    "build_embedder",
    "embedder_identity",
    "HashingEmbedder",
    "LocalShardClient",
    "MemoryCoordinator",
    "MemoryKind",
    "MemoryPart",
    "MemoryRecord",
    "MemoryShard",
    "MiniLMEmbedder",
    "ScoreParams",
    "SearchFilters",
    "SearchHit",
    "ShardClient",
    "ShardConfig",
    "embed_records",
    "l2_normalise",
    "local_coordinator",
    "new_record_id",
    "source_key",
    "tenant_key",
]
