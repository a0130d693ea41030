"""Memory tier: records, embedders, one shard (fused scan / IVF, WAL, snapshots), the sharded coordinator.

Quick use (in-process)::

    from recallserve.memory_shards import MemoryRecord, MiniLMEmbedder, embed_records, local_coordinator
    emb = MiniLMEmbedder()
    coord = local_coordinator(2, emb.model_id, emb.dim, data_root="data/memory")
    await coord.upsert(embed_records(emb, [MemoryRecord(tenant="t1", source_id="s1", text="...")]))
    hits = await coord.search("t1", emb.embed(["query"]), k=20)
"""

from recallserve.kernels import lazy_exports

__all__ = [
    "CallGatherer",
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
    "ShardCallConfig",
    "ShardClient",
    "ShardConfig",
    "ShardUnavailable",
    "embed_records",
    "l2_normalise",
    "local_coordinator",
    "id_route",
    "new_record_id",
    "private_record_id",
    "shared_record_id",
    "source_key",
    "tenant_key",
]

# NOTE: names load on first use, so that importing one light module (``recallserve.memory_shards.config``'s
# SearchHit in the request pipeline, ``records`` in the API schemas) does not import torch and
# faiss through the shard and the coordinator.
_LAZY = {
    "CallGatherer": "recallserve.memory_shards._gather",
    "KINDS": "recallserve.memory_shards.records",
    "SHARED_TENANT_NAME": "recallserve.memory_shards.records",
    "EmbeddedRecord": "recallserve.memory_shards.records",
    "EMBEDDER_MODELS": "recallserve.memory_shards.embedders",
    "Embedder": "recallserve.memory_shards._embedder_base",
    "build_embedder": "recallserve.memory_shards.embedders",
    "embedder_identity": "recallserve.memory_shards.embedders",
    "HashingEmbedder": "recallserve.memory_shards.embedders",
    "LocalShardClient": "recallserve.memory_shards.coordinator",
    "MemoryCoordinator": "recallserve.memory_shards.coordinator",
    "MemoryKind": "recallserve.memory_shards.records",
    "MemoryPart": "recallserve.memory_shards.records",
    "MemoryRecord": "recallserve.memory_shards.records",
    "MemoryShard": "recallserve.memory_shards.shard",
    "MiniLMEmbedder": "recallserve.memory_shards.embedders",
    "ScoreParams": "recallserve.kernels",
    "SearchFilters": "recallserve.memory_shards.config",
    "SearchHit": "recallserve.memory_shards.config",
    "ShardCallConfig": "recallserve.memory_shards.config",
    "ShardClient": "recallserve.memory_shards.coordinator",
    "ShardConfig": "recallserve.memory_shards.config",
    "ShardUnavailable": "recallserve.memory_shards._fanout",
    "embed_records": "recallserve.memory_shards.coordinator",
    "l2_normalise": "recallserve.memory_shards._embedder_base",
    "local_coordinator": "recallserve.memory_shards.coordinator",
    "id_route": "recallserve.memory_shards.records",
    "new_record_id": "recallserve.memory_shards.records",
    "private_record_id": "recallserve.memory_shards.records",
    "shared_record_id": "recallserve.memory_shards.records",
    "source_key": "recallserve.memory_shards.records",
    "tenant_key": "recallserve.memory_shards.records",
}

__getattr__ = lazy_exports(__name__, _LAZY)
