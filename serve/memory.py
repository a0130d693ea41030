"""The seam between the request pipeline and the memory tier.

The pipeline (context-mode, agent loop, experience memory) reads and writes memories only
through :class:`MemoryBackend`. ``deployments/`` provides the implementation backed by the
sharded memory deployments; tests use the in-process coordinator from ``memory_shards``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import Field

from recallserve.kernels import StrictModel
from recallserve.memory_shards.config import SearchHit

__all__ = ["MemoryHit", "MemoryWrite", "MemoryBackend", "DERIVED_KEY", "CITES_KEY", "is_derived", "cites_of",
           "sources_first", "derived_metadata", "cited_sources", "MAX_CITES"]

#: Most source ids one derived memory keeps (a bounded metadata value).
MAX_CITES = 8

#: Metadata key marking a memory as derived: an assistant's conclusion written back after a turn,
#: not a record of what the user said, what a tool returned or what the company documented.
DERIVED_KEY = "derived"
#: Metadata key of a derived memory's sources: the source ids it cited, comma-joined (metadata is scalar).
CITES_KEY = "cites"


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


def derived_metadata(cites: Sequence[str]) -> dict[str, Any]:
    """The metadata that marks a write-back as derived from ``cites`` (source ids, order kept, no repeats)."""
    return {DERIVED_KEY: True, CITES_KEY: ",".join(dict.fromkeys(c for c in cites if c))}


def _short_id(source_id: str) -> str:
    """The record's own id inside a source id: ``ticket:T-1121`` -> ``T-1121``, ``manual:4.2`` -> ``4.2``."""
    return source_id.rsplit(":", 1)[-1]


def cited_sources(answer: str, recalled: Sequence[MemoryHit], searched: Sequence[str] = ()) -> list[str]:
    """The source ids ``answer`` cites, at most :data:`MAX_CITES`, derived memories left out.

    A recalled memory (``recalled``, in the prompt's order) is cited when the answer names its
    prompt number ``[n]`` or its own id (:func:`_short_id`, as a whole word, at least 3 characters);
    a memory a search tool returned (``searched``: its source ids) when the answer names its id.
    A conclusion citing a conclusion would stand in for the source, so derived hits never count.
    """
    out: list[str] = []

    def named(source_id: str) -> bool:
        short = _short_id(source_id)
        return len(short) >= 3 and re.search(rf"(?<![\w-]){re.escape(short)}(?![\w-])", answer) is not None

    for n, hit in enumerate(recalled, 1):
        if not is_derived(hit) and (f"[{n}]" in answer or named(hit.source_id)):
            out.append(hit.source_id)
    out += [sid for sid in searched if named(sid)]
    return list(dict.fromkeys(out))[:MAX_CITES]


def is_derived(hit: MemoryHit) -> bool:
    """Whether ``hit`` is an assistant's conclusion (``metadata.derived``) rather than a source record."""
    return bool(hit.record.metadata.get(DERIVED_KEY))


def cites_of(hit: MemoryHit) -> list[str]:
    """The source ids a derived memory cited ([] for a source record or a conclusion citing nothing)."""
    raw = hit.record.metadata.get(CITES_KEY) or ""
    return [c for c in str(raw).split(",") if c]


_Hit = TypeVar("_Hit", bound=SearchHit)


def sources_first(hits: Sequence[_Hit]) -> list[_Hit]:
    """``hits`` with every derived memory after every source record, each group in its given order.

    A conclusion written back from an answer repeats the question's words, so it embeds and
    matches closer to the same question than the record it came from (measured on the demo: a
    written-back answer at cosine 0.90 against its ticket's 0.62). Ranked by score alone, one
    answer, right or wrong, becomes the top evidence for the next; a stable partition keeps the
    sources on top whatever the scores, and is the one ordering rule of every search (the memory
    API, the ``memory_search`` tool and the chat recall all read the memory service's order).
    """
    return [h for h in hits if not is_derived(h)] + [h for h in hits if is_derived(h)]


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
