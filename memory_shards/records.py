"""Memory records: what one remembered unit holds, and the stable int64 keys the kernel masks on.

A record is one unit of memory (a chat message, a ticket, a tool result, an experience trace).
It may carry several *parts* that belong together (a ticket's text, the description of its photo
and the resolution): every part is embedded as its own row in the shard, all rows share the
record's ``source_id``, so the kernel's per-source dedup keeps the best-matching part and the
search returns the whole record, parts included.

Tenants and source ids are strings in the API and int64 keys in the shard's columns::

    tenant_key("shared") == SHARED_TENANT == 0          # visible to every tenant
    tenant_key(t) = int64(blake2b(t, 8 bytes, person="rs-tenant"))   (never 0)
    source_key(s) = int64(blake2b(s, 8 bytes, person="rs-source"))

blake2b is stable across processes and Python versions (unlike ``hash()``), so keys written to
a snapshot mean the same after a restart.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import uuid
from typing import Annotated, Literal

import numpy as np
from pydantic import ConfigDict, Field, field_validator, model_validator

from recallserve.kernels import StrictModel

from .chunking import MAX_CHUNKS

__all__ = [
    "KINDS",
    "clip_middle",
    "SHARED_TENANT_NAME",
    "MemoryKind",
    "MemoryPart",
    "MemoryRecord",
    "EmbeddedRecord",
    "kind_code",
    "tenant_key",
    "source_key",
    "new_record_id",
    "private_record_id",
    "shared_record_id",
    "id_route",
    "record_version",
    "content_key",
]

SHARED_TENANT_NAME = "shared"
"""The tenant name of shared collections (a product manual): key 0, visible to all tenants."""

MemoryKind = Literal["text", "image", "table", "tool_result", "experience", "message"]
KINDS: tuple[str, ...] = ("text", "image", "table", "tool_result", "experience", "message")

# NOTE: bounds keep one record's JSON and its rows small enough for one WAL line and one
# kernel row group; a longer document is chunked into several records by the caller.
MAX_TEXT_CHARS = 32_000
MAX_PARTS = 16
MAX_METADATA_KEYS = 64

Scalar = str | int | float | bool | None


def clip_middle(text: str, limit: int) -> tuple[str, int]:
    """``text`` cut to at most ``limit`` characters by leaving out its middle; (the text, characters left out).

    The first 3/4 and the last 1/4 of the room are kept around a marker that says how much is
    missing: an exchange ``user: <question>\\nassistant: <answer>`` keeps the start of a pasted
    document and its answer. A text within ``limit`` comes back as it is (0 left out).

    Example:
        >>> clip_middle("a" * 40 + "b" * 40, 60)
        ('aaaaaaaaaaaaaaaaaaaaaaa\\n[… 50 characters left out …]\\nbbbbbbb', 50)
    """
    if len(text) <= limit:
        return text, 0
    # NOTE: the marker's room is reserved for the longest count (the whole text), so the result fits.
    room = limit - len(f"\n[… {len(text)} characters left out …]\n")
    if room < 4:
        raise ValueError(f"limit: {limit} leaves no room for the text beside the marker")
    tail = room // 4
    head = room - tail
    left_out = len(text) - head - tail
    return f"{text[:head]}\n[… {left_out} characters left out …]\n{text[len(text) - tail:]}", left_out
_ID_CHARS = Annotated[str, Field(min_length=1, max_length=256)]


def _key64(value: str, person: bytes) -> int:
    digest = hashlib.blake2b(value.encode("utf-8"), digest_size=8, person=person).digest()
    return int.from_bytes(digest, "little", signed=True)


def tenant_key(tenant: str) -> int:
    """Map a tenant name to its int64 kernel key (``"shared"`` -> 0, every other tenant != 0).

    Args:
        tenant: the tenant name (non-empty).

    Returns:
        A signed 64-bit int, stable across processes.

    Example:
        >>> tenant_key("shared")
        0
    """
    if not tenant:
        raise ValueError("tenant: must be a non-empty string")
    if tenant == SHARED_TENANT_NAME:
        return 0
    key = _key64(tenant, b"rs-tenant")
    # NOTE: 0 is reserved for shared rows; a tenant hashing to 0 (p = 2^-64) takes 1 instead.
    return key if key != 0 else 1


def source_key(source_id: str) -> int:
    """Map a source id (the dedup key) to its int64 kernel key."""
    if not source_id:
        raise ValueError("source_id: must be a non-empty string")
    return _key64(source_id, b"rs-source")


def kind_code(kind: str) -> int:
    """Index of ``kind`` in :data:`KINDS` (the shard's int8 kind column)."""
    try:
        return KINDS.index(kind)
    except ValueError:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(KINDS)}") from None


def new_record_id() -> str:
    """A fresh record id (uuid4 hex, 32 chars) that says nothing about where the record lives."""
    return uuid.uuid4().hex


# NOTE: routed ids are one letter + 32 hex, so they never collide with the 32-hex ids of
# records written before (those stay readable through the coordinator's wider lookup).
_PRIVATE_TAG = "p"
_SHARED_TAG = "s"
_U64 = 1 << 64
_HEX32 = re.compile(r"[0-9a-f]{32}")


def private_record_id() -> str:
    """A fresh id for a tenant's own record: ``"p" + uuid4 hex``.

    The tag tells the coordinator that the record lives on its tenant's home shard, so a read
    by id asks that one shard and a miss there is a definite "not found".
    """
    return _PRIVATE_TAG + uuid.uuid4().hex


def shared_record_id(source_id: str) -> str:
    """A fresh id for a shared record: ``"s" + 16 hex of source_key(source_id) + 16 random hex``.

    Shared records are spread over shards by their source key; carrying it in the id lets a
    read by id go to the one shard that holds the record. The source key is no secret: the
    record's ``source_id`` is visible to every tenant anyway.

    Example:
        >>> id_route(shared_record_id("manual-7")) == ("shared", source_key("manual-7"))
        True
    """
    return f"{_SHARED_TAG}{source_key(source_id) % _U64:016x}{uuid.uuid4().hex[:16]}"


def id_route(record_id: str) -> tuple[str, int | None] | None:
    """Where a routed id says its record lives: ``("private", None)``, ``("shared", source key)``, or None.

    None for any other id (32-hex ids of records written before routed ids, ids chosen by a
    caller): such a record may be on the tenant's home shard or, when shared, on any shard.
    """
    if len(record_id) != 33 or record_id[0] not in (_PRIVATE_TAG, _SHARED_TAG):
        return None
    if _HEX32.fullmatch(record_id[1:]) is None:
        return None
    if record_id[0] == _PRIVATE_TAG:
        return ("private", None)
    key = int(record_id[1:17], 16)
    return ("shared", key - _U64 if key >= 1 << 63 else key)


class MemoryPart(StrictModel):
    """One extra part of a record, embedded as its own row and recalled with the record."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1, max_length=64, description="Label of the part, e.g. 'photo' or 'resolution'.")
    kind: MemoryKind = Field(default="text", description="What the part is.")
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="Text embedded for this part.")


class MemoryRecord(StrictModel):
    """One unit of memory.

    Times are Unix epoch seconds (float). ``expires_at=None`` means never expires. The searchable
    texts (:meth:`embedding_texts`) are ``text`` (or its chunks, :attr:`text_chunks`, when it is
    longer than the embedder reads), ``image_description``, ``ocr_text`` and each part's text, in
    that order; each becomes one vector row.

    Frozen: a shard hands out its stored objects (no copy on the search path), so a change goes
    through ``record.model_copy(update=...)`` and an upsert, never an in-place edit.
    """

    model_config = ConfigDict(frozen=True)

    id: str = Field(default_factory=new_record_id, min_length=1, max_length=128, description="Record id (unique in the store).")
    tenant: str = Field(min_length=1, max_length=256, description="Owner tenant; 'shared' makes it visible to every tenant.")
    source_id: _ID_CHARS = Field(description="Dedup key: one tenant's newer record with the same source id replaces the older one.")
    user: str | None = Field(default=None, min_length=1, max_length=256,
                             description="End user of the tenant who owns the record (mem0's user_id); None = the tenant's.")
    kind: MemoryKind = Field(default="text", description="What the record is.")
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="Main text (embedded).")
    image_description: str | None = Field(default=None, max_length=MAX_TEXT_CHARS, description="Description of an attached image (embedded).")
    ocr_text: str | None = Field(default=None, max_length=MAX_TEXT_CHARS, description="OCR text of an attached image (embedded).")
    image_hash: str | None = Field(default=None, max_length=128, description="Content hash of the attached image.")
    parts: list[MemoryPart] = Field(default_factory=list, max_length=MAX_PARTS, description="Further parts recalled with this record.")
    metadata: dict[str, Scalar] = Field(default_factory=dict, description="Flat metadata (str -> scalar), filterable by equality.")
    created_at: float = Field(default_factory=time.time, ge=0, description="Creation time, epoch seconds.")
    last_access_at: float | None = Field(default=None, ge=0, description="Last recall time, epoch seconds (defaults to created_at).")
    expires_at: float | None = Field(default=None, ge=0, description="Hard expiry, epoch seconds; None never expires.")
    retention_weight: float = Field(default=1.0, ge=0, le=10, description="Importance weight kept for retention policies.")
    topic_path: str = Field(default="", max_length=512, description="Slash-separated topic, e.g. 'billing/refunds'.")
    error_tags: list[str] = Field(default_factory=list, max_length=32, description="Error tags (experience memory).")
    embedding_model: str = Field(default="", max_length=256, description="Model id of the vectors stored for this record.")
    text_chunks: list[tuple[int, int]] = Field(
        default_factory=list, max_length=MAX_CHUNKS,
        description="Character spans of ``text`` embedded as one row each (memory_shards.chunking); empty = the "
                    "whole text is one row.",
    )

    @field_validator("text_chunks")
    @classmethod
    def _check_chunks(cls, value: list[tuple[int, int]]) -> list[tuple[int, int]]:
        prev = -1
        for i, (start, end) in enumerate(value):
            if not 0 <= start < end or start <= prev:
                raise ValueError(f"text_chunks[{i}]: ({start}, {end}) must be non-empty and start after the previous chunk's start")
            prev = start
        return value

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        if len(value) > MAX_METADATA_KEYS:
            raise ValueError(f"metadata: at most {MAX_METADATA_KEYS} keys, got {len(value)}")
        for key, item in value.items():
            if not key or len(key) > 128:
                raise ValueError(f"metadata: key {key[:40]!r} must have 1-128 characters")
            if isinstance(item, float) and not math.isfinite(item):
                raise ValueError(f"metadata[{key!r}]: must be finite, got {item}")
        return value

    @model_validator(mode="after")
    def _check_times(self) -> MemoryRecord:
        if self.last_access_at is None:
            # NOTE: object.__setattr__ because the model is frozen (set once, during validation).
            object.__setattr__(self, "last_access_at", self.created_at)
        if self.expires_at is not None and self.expires_at < self.created_at:
            raise ValueError(f"expires_at: {self.expires_at} is before created_at {self.created_at}")
        if self.text_chunks and max(end for _, end in self.text_chunks) > len(self.text):
            raise ValueError(f"text_chunks: a span runs past the text ({len(self.text)} characters)")
        return self

    def chunks(self) -> list[str]:
        """The main text as embedded: its chunks (:attr:`text_chunks`), or the whole text as one."""
        if not self.text_chunks:
            return [self.text]
        return [self.text[start:end] for start, end in self.text_chunks]

    def embedding_texts(self) -> list[str]:
        """The texts to embed, one vector row each: text chunks, image description, OCR text, parts."""
        return self.chunks() + self.extra_texts()

    def searchable_texts(self) -> list[str]:
        """Every text of the unit once (the whole main text, then the others): what BM25 reads and a recall shows."""
        return [self.text] + self.extra_texts()

    def extra_texts(self) -> list[str]:
        """The embedded texts besides the main text: image description, OCR text, parts."""
        texts: list[str] = []
        if self.image_description:
            texts.append(self.image_description)
        if self.ocr_text:
            texts.append(self.ocr_text)
        texts.extend(part.text for part in self.parts)
        return texts

    @property
    def tenant_key(self) -> int:
        """int64 key of :attr:`tenant` (0 for shared)."""
        return tenant_key(self.tenant)

    @property
    def source_key(self) -> int:
        """int64 key of :attr:`source_id`."""
        return source_key(self.source_id)

    @property
    def is_shared(self) -> bool:
        """True for a record of the shared collection."""
        return self.tenant == SHARED_TENANT_NAME


class EmbeddedRecord:
    """A record with its vectors, one L2-normalised float32 row per :meth:`MemoryRecord.embedding_texts`.

    A plain class (not pydantic) so the array travels without a copy (and pickles for Ray calls).
    """

    __slots__ = ("record", "vectors")

    def __init__(self, record: MemoryRecord, vectors: np.ndarray) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim == 1:
            vectors = vectors[None, :]
        n_texts = len(record.embedding_texts())
        if vectors.ndim != 2 or vectors.shape[0] != n_texts:
            raise ValueError(
                f"vectors: record {record.id} has {n_texts} embedding texts, got array of shape {vectors.shape}"
            )
        if not np.all(np.isfinite(vectors)):
            raise ValueError(f"vectors: record {record.id} has non-finite values")
        norms = np.linalg.norm(vectors, axis=1)
        # NOTE: 1e-3 tolerates float32 rounding of an already-normalised vector; anything else
        # means the caller forgot to normalise and cosine scores would be wrong.
        if np.any(np.abs(norms - 1.0) > 1e-3):
            raise ValueError(f"vectors: record {record.id} rows must be L2-normalised (norms {norms.round(4).tolist()})")
        self.record = record
        self.vectors = np.ascontiguousarray(vectors)

    def __repr__(self) -> str:
        return f"EmbeddedRecord(id={self.record.id!r}, rows={self.vectors.shape[0]}, dim={self.vectors.shape[1]})"

    def __reduce__(self):  # keep pickling (Ray transport) working with __slots__
        return (EmbeddedRecord, (self.record, self.vectors))


def record_version(record: MemoryRecord) -> str:
    """Version tag of a record's content: blake2b-128 of its canonical JSON without ``last_access_at``.

    Every write of a record (a new text, metadata, expiry, a replacing record) changes the tag;
    a recall's renewal of ``last_access_at`` does not, so a batch job that read a record can tell
    whether a user wrote it since (see :meth:`MemoryShard.apply_if_unchanged`).
    """
    body = json.dumps(record.model_dump(mode="json", exclude={"last_access_at"}), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(body.encode("utf-8"), digest_size=16).hexdigest()


def content_key(record: MemoryRecord) -> str:
    """What a user write changes: the record as canonical JSON without ``last_access_at`` (a
    recall renews it) and ``embedding_model`` (a re-embedded copy's differs by design).

    Two copies of a record in two generations (a re-embed's source and target) hold the same
    content exactly when their keys are equal.
    """
    return json.dumps(record.model_dump(mode="json", exclude={"last_access_at", "embedding_model"}), sort_keys=True)
