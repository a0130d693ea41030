"""In-process :class:`~recallserve.serve.memory.MemoryBackend` for the demo and the eval: the served memory service.

The served cluster's memory is :class:`~recallserve.serve.memory_api.service.MemoryService` over shard
deployments (hybrid dense + BM25 retrieval, the 0.35 cosine threshold, chunking, PII masking of
write-backs). ``recallserve demo`` and ``recallserve eval agent`` run in one process, so they use
the same service over in-process hybrid shards: what the eval measures is what a user meets.

NOTE: measured on the eval's holdout question "did we ever see E12 pump problems on other
units?": the dense-only store this replaces answered the model's ``memory_search("E12")`` with
one E42 ticket (the code "E12" alone embeds poorly), and the model reported that no E12 case
existed; the served hybrid search finds T-1071 by its BM25 match.
"""

from __future__ import annotations

import asyncio
from typing import Any

from recallserve.serve.memory_api.service import MemoryService

__all__ = ["LocalMemory"]


class LocalMemory(MemoryService):
    """The served memory service (defaults of ``memory``: top-k 16, threshold 0.35) over in-process shards."""

    def __init__(self, embedder: Any | None = None, n_shards: int = 1) -> None:
        from recallserve.memory_shards.embedders import MiniLMEmbedder
        from recallserve.memory_shards.retrieval import local_hybrid_coordinator

        # NOTE: the torch MiniLM gives the served ONNX embedder's vectors (same weights) without
        # the one-off ONNX export, which would run again in every process with no cache folder.
        self.embedder = embedder or MiniLMEmbedder()
        coordinator = local_hybrid_coordinator(n_shards, self.embedder.model_id, self.embedder.dim)
        super().__init__(coordinator, lambda texts: asyncio.to_thread(self.embedder.embed, list(texts)))
