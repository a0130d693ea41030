"""The seam between the request pipeline and the memory tier.

The pipeline (context-mode, agent loop, experience memory) reads and writes memories only
through :class:`MemoryBackend`. ``deployments/`` provides the implementation backed by the
sharded memory deployments; tests use the in-process coordinator from ``memory_shards``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import Field

from recallserve.kernels import StrictModel
from recallserve.memory_shards.config import SearchHit

__all__ = ["MemoryHit", "MemoryWrite", "MemoryBackend"]


# NOTE: one hit type for the memory tier and the pipeline: the record plus the parts of its score,
# read here through its properties (id, source_id, kind, text, created_at, metadata).
MemoryHit = SearchHit


class MemoryWrite(StrictModel):
    """A memory to store (the tenant comes from the caller, never from the body)."""

    text: str = Field(min_length=1, description="Text of the memory.")
    kind: str = Field(default="text", description="Record kind.")
    source_id: str | None = Field(default=None, description="Dedup key; same key overwrites.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Scalar metadata.")
    topic: str | None = Field(default=None, description="Topic path, e.g. 'printers/jams'.")
    created_at: float | None = Field(default=None, description="Epoch seconds; default now.")
    expires_at: float | None = Field(default=None, description="Epoch seconds; default never.")
    user: str | None = Field(default=None, min_length=1, max_length=128,
                             description="End user who owns it (the chat request's stored `user` key); None = the tenant.")


@runtime_checkable
class MemoryBackend(Protocol):
    """Async access to one tenant-scoped memory store."""

    async def search(
        self, tenant: str, query: str, k: int | None = None, *, threshold: float | None = None,
        kinds: Sequence[str] | None = None, topic_prefix: str | None = None, user: str | None = None,
    ) -> list[MemoryHit]:
        """Top-k memories of ``tenant`` (plus shared ones) for ``query``; ``k`` and ``threshold``
        None = the backend's configured defaults (``memory.top_k``, ``memory.threshold``); ``user``:
        only that end user's memories and the tenant's unowned ones (a chat turn's recall)."""
        ...

    async def write(self, tenant: str, items: Sequence[MemoryWrite]) -> list[str]:
        """Store items durably; returns their ids."""
        ...
