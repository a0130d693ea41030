"""Request and response bodies of the memory API (``/v1/memories``).

Times are accepted as ISO 8601 strings or epoch seconds and returned as epoch seconds (a number is
always seconds: see :func:`epoch_seconds`). Every
limit is a bound in the type, so a bad value becomes a 400 whose ``param`` names the field
(``memories.3.text``, ``k``, ``filters.created_after``).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from recallserve.kernels import NoControl, StrictModel, check_json
from recallserve.memory_shards.records import MAX_METADATA_KEYS, MAX_PARTS, MAX_TEXT_CHARS, MemoryKind, MemoryPart, Scalar

__all__ = [
    "MAX_BATCH",
    "MAX_BATCH_CHARS",
    "MAX_K",
    "MemoryIn",
    "AddMemoriesRequest",
    "AddMemoriesResponse",
    "DecayIn",
    "FiltersIn",
    "SearchRequest",
    "SearchResult",
    "SearchResponse",
    "MemoryOut",
    "MemoryList",
    "DeleteResponse",
    "epoch_seconds",
    "to_epoch",
]

MAX_BATCH = 256
"""NOTE: one add request embeds at most this many memories (about 1-2 s of MiniLM on one core)."""
MAX_BATCH_CHARS = 1_000_000
"""NOTE: the text one add request may carry in all (texts, image descriptions, OCR texts, parts),
as a chat turn's (serve.api.chat_protocol.MAX_TOTAL_CHARS). Each field has its own bound, but 256
memories of 32k-character texts and 16 parts each fit the 32 MiB body: ~20M characters that were
PII-masked on the event loop (~25 s during which no other request was answered) and then embedded."""
MAX_QUERY_CHARS = 8192
"""NOTE: a query longer than this is a document, not a question (MiniLM reads 256 tokens)."""
MAX_K = 200
"""NOTE: the most results one search returns; recall beyond 200 is a bulk export, not a search."""
MAX_METADATA_VALUE_CHARS = 1024
"""NOTE: metadata is for filtering by equality (ids, labels, flags); text belongs in ``text``."""
MAX_TAG_CHARS = 64

Tag = Annotated[str, Field(min_length=1, max_length=MAX_TAG_CHARS)]


def _check_metadata(value: Any) -> Any:
    """Bounds of a metadata map, checked before the scalar types so the error names the key."""
    if isinstance(value, dict):
        check_json(value, "metadata", max_depth=1, max_items=MAX_METADATA_KEYS, max_chars=MAX_METADATA_VALUE_CHARS)
    return value


MAX_EPOCH_S = 253402300799.0
"""NOTE: the last second of year 9999, the latest time a datetime holds (as the experience store's bound)."""
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def epoch_seconds(value: Any) -> Any:
    """A time field's value before pydantic parses it: a number (or a numeric string) as the UTC
    datetime that many seconds after 1970, anything else unchanged.

    NOTE: pydantic reads a number above 2e10 as epoch *milliseconds*, so ``"created_at": 1e11``
    (year 5138, in the seconds this API documents) was stored as 1973-03-03 and a filter
    ``created_after: 1e11`` matched everything. A number is always seconds here, and one past
    year 9999 is a 400 that says why (an epoch in milliseconds lands there).

    Example:
        >>> epoch_seconds(1e11).year
        5138
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return value
    if isinstance(value, str):
        if not _NUMBER.fullmatch(value.strip()):
            return value
        value = float(value)
    if value != value or abs(value) == float("inf"):
        return value  # NOTE: left to the field's own error (allow_inf_nan=False names it)
    if value > MAX_EPOCH_S:
        raise ValueError(f"{value!r} epoch seconds is after year 9999 (at most {MAX_EPOCH_S:.0f}); "
                         "send seconds, not milliseconds")
    if value < -MAX_EPOCH_S:
        raise ValueError(f"{value!r} epoch seconds is before year 1")
    return _EPOCH + timedelta(seconds=value)


def to_epoch(value: datetime | None) -> float | None:
    """A datetime (naive = UTC) as epoch seconds."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()


class MemoryIn(StrictModel):
    """One memory to add (the tenant comes from the API key, never from the body)."""

    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="Main text (embedded and indexed).")
    kind: MemoryKind = Field(default="text", description="text, image, table, tool_result, experience or message.")
    source_id: Annotated[str | None, NoControl] = Field(default=None, min_length=1, max_length=256,
                                  description="Dedup key: a newer memory with the same source id replaces the older. Default: a fresh id.")
    metadata: dict[str, Scalar] = Field(default_factory=dict, max_length=MAX_METADATA_KEYS,
                                        description=f"Flat metadata (string -> scalar; at most {MAX_METADATA_KEYS} keys of "
                                                    f"128 characters, string values of {MAX_METADATA_VALUE_CHARS}).")
    topic: str = Field(default="", max_length=512, description="Slash-separated topic path, e.g. 'billing/refunds'.")
    user: Annotated[str | None, NoControl] = Field(
        default=None, min_length=1, max_length=128,
        description="End user who owns the memory (as mem0's user_id; the chat request's `user`); default: the tenant.")
    image_description: str | None = Field(default=None, min_length=1, max_length=MAX_TEXT_CHARS, description="Description of an attached image.")
    ocr_text: str | None = Field(default=None, min_length=1, max_length=MAX_TEXT_CHARS, description="OCR text of an attached image.")
    image_hash: str | None = Field(default=None, min_length=1, max_length=128, description="Content hash of the attached image.")
    parts: list[MemoryPart] = Field(default_factory=list, max_length=MAX_PARTS, description="Further parts recalled with this memory.")
    created_at: datetime | None = Field(default=None, description="Creation time (ISO 8601 or epoch seconds); default now.")
    expires_at: datetime | None = Field(default=None, description="Hard expiry (ISO 8601 or epoch seconds); default never.")
    retention_weight: float = Field(strict=True, default=1.0, ge=0, le=10, description="Importance weight for retention policies.")
    error_tags: list[Tag] = Field(default_factory=list, max_length=32,
                                  description=f"Error tags (experience memory), 1-{MAX_TAG_CHARS} characters each.")

    _metadata = field_validator("metadata", mode="before")(lambda cls, v: _check_metadata(v))
    _seconds = field_validator("created_at", "expires_at", mode="before")(lambda cls, v: epoch_seconds(v))

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must contain non-whitespace text")
        return value

    @model_validator(mode="after")
    def _times(self) -> MemoryIn:
        created, expires = to_epoch(self.created_at), to_epoch(self.expires_at)
        if created is not None and created < 0:
            raise ValueError("created_at: must not be before 1970")
        if expires is not None and created is not None and expires < created:
            raise ValueError("expires_at: must be after created_at")
        return self


class AddMemoriesRequest(StrictModel):
    """``POST /v1/memories``: a batch of memories."""

    memories: list[MemoryIn] = Field(min_length=1, max_length=MAX_BATCH,
                                     description=f"1 to {MAX_BATCH} memories, each source id at most once.")

    @model_validator(mode="after")
    def _distinct_sources(self) -> AddMemoriesRequest:
        # NOTE: a later memory with the same source id replaces the earlier: in one batch, the
        # earlier's id would be acknowledged and gone (a 404) before the answer reached the client.
        first: dict[str, int] = {}
        for i, memory in enumerate(self.memories):
            if memory.source_id is None:
                continue
            if memory.source_id in first:
                raise ValueError(f"memories.{i}.source_id: the same as memories.{first[memory.source_id]}.source_id; "
                                 "a batch holds each source id once")
            first[memory.source_id] = i
        return self

    @model_validator(mode="after")
    def _total_text(self) -> AddMemoriesRequest:
        total = sum(len(m.text) + len(m.image_description or "") + len(m.ocr_text or "")
                    + sum(len(p.text) for p in m.parts) for m in self.memories)
        if total > MAX_BATCH_CHARS:
            raise ValueError(f"memories: {total} characters of text in all; at most {MAX_BATCH_CHARS} per request "
                             "are accepted (send the memories in smaller batches)")
        return self


class AddMemoriesResponse(StrictModel):
    """Ids of the stored memories, in request order (all durable when this is sent)."""

    object: Literal["list"] = Field(default="list", description="Always 'list'.")
    ids: list[str] = Field(description="Memory ids, in request order.")


class DecayIn(StrictModel):
    """Time decay of the score (defaults: 1 / (1 + 0.1 x days since last use), product)."""

    decay: Literal["none", "hyperbolic", "exponential"] = Field(default="hyperbolic", description="Decay law.")
    decay_lambda: float = Field(strict=True, default=0.1, ge=0, le=100, description="lambda of 1 / (1 + lambda x days).")
    half_life_days: float = Field(strict=True, default=30.0, gt=0, le=1e6, description="Half-life of the exponential decay, days.")
    combine: Literal["product", "weighted"] = Field(default="product", description="cos x time, or w x cos + (1 - w) x time.")
    similarity_weight: float = Field(strict=True, default=0.7, ge=0, le=1, description="w of the weighted combination.")


class FiltersIn(StrictModel):
    """Conditions every result must meet."""

    kinds: list[MemoryKind] | None = Field(default=None, min_length=1, max_length=16, description="Keep only these kinds.")
    topic_prefix: str | None = Field(default=None, min_length=1, max_length=512, description="Keep topics starting with this.")
    metadata: dict[str, Scalar] | None = Field(default=None, max_length=MAX_METADATA_KEYS, description="Metadata equality.")

    _metadata = field_validator("metadata", mode="before")(lambda cls, v: _check_metadata(v))
    created_after: datetime | None = Field(default=None, description="Created at or after (ISO 8601 or epoch seconds).")
    created_before: datetime | None = Field(default=None, description="Created before (ISO 8601 or epoch seconds).")
    user: Annotated[str | None, NoControl] = Field(default=None, min_length=1, max_length=128,
                                                   description="Keep only memories owned by this end user.")
    include_tenant: bool = Field(strict=True, default=False,
                                 description="With user: also the tenant's memories that have no owner.")
    _seconds = field_validator("created_after", "created_before", mode="before")(lambda cls, v: epoch_seconds(v))

    @model_validator(mode="after")
    def _range(self) -> FiltersIn:
        a, b = to_epoch(self.created_after), to_epoch(self.created_before)
        if a is not None and a < 0:
            raise ValueError("created_after: must not be before 1970")
        if b is not None and b < 0:
            raise ValueError("created_before: must not be before 1970")
        if a is not None and b is not None and b <= a:
            raise ValueError("created_before: must be after created_after")
        return self


class SearchRequest(StrictModel):
    """``POST /v1/memories/search``."""

    # NOTE: bounds checked in the service (``check_query``), not here: the app's error handler
    # strips a path element named "query" (it reads it as the query-string location), so a
    # validation error on this field would lose its name.
    query: str = Field(description="What to recall (1-8192 characters, not blank).")
    k: int | None = Field(strict=True, default=None, ge=1, le=MAX_K, description=f"Results (1-{MAX_K}); default: the configured top_k.")
    threshold: float | None = Field(strict=True, default=None, ge=-1, le=1,
                                    description="Minimum cosine of a dense hit (default: the configured threshold); with "
                                                "hybrid, a hit below it stays when its BM25 is strong (hybrid false: a strict floor).")
    filters: FiltersIn | None = Field(default=None, description="Kind, topic prefix, metadata equality, time range.")
    decay: DecayIn | None = Field(default=None, description="Time decay parameters.")
    hybrid: bool = Field(strict=True, default=True, description="Fuse BM25 with the dense ranking (False = dense only).")

    def check_query(self) -> None:
        """Raise a 400 naming ``query`` when it is blank or longer than 8192 characters."""
        from recallserve.serve.api.errors import APIError

        if not self.query.strip():
            raise APIError(400, "query: must contain non-whitespace text", param="query")
        if len(self.query) > MAX_QUERY_CHARS:
            raise APIError(400, f"query: at most {MAX_QUERY_CHARS} characters, got {len(self.query)}", param="query")


class MemoryOut(StrictModel):
    """A stored memory."""

    object: Literal["memory"] = Field(default="memory", description="Always 'memory'.")
    id: str = Field(description="Memory id.")
    source_id: str = Field(description="Dedup key.")
    kind: str = Field(description="Kind.")
    text: str = Field(description="Main text.")
    image_description: str | None = Field(default=None, description="Image description.")
    ocr_text: str | None = Field(default=None, description="OCR text.")
    parts: list[MemoryPart] = Field(default_factory=list, description="Further parts.")
    text_chunks: list[tuple[int, int]] = Field(
        default_factory=list, description="Character spans of text embedded as one row each (a long text); empty = one row.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Metadata.")
    topic: str = Field(default="", description="Topic path.")
    user: str | None = Field(default=None, description="End user who owns it (stored key); None = the tenant.")
    shared: bool = Field(description="True for a memory of the shared collection.")
    created_at: float = Field(description="Creation time, epoch seconds.")
    last_access_at: float | None = Field(default=None, description="Last recall, epoch seconds.")
    expires_at: float | None = Field(default=None, description="Expiry, epoch seconds.")


class SearchResult(MemoryOut):
    """A ranked memory with every part of its score."""

    score: float = Field(description="Fused score (reciprocal rank fusion of the dense and BM25 ranks).")
    similarity: float = Field(description="Cosine similarity of the best-matching part.")
    time_factor: float = Field(description="Time decay factor in (0, 1].")
    part_index: int = Field(description="Row that matched best: chunks of text first (see text_chunks), then image "
                                        "description, OCR text, parts.")
    dense_score: float = Field(description="Kernel score: similarity x time factor (or the weighted mix).")
    dense_rank: int | None = Field(default=None, description="Rank in the dense list (1-based).")
    lexical_score: float | None = Field(default=None, description="BM25 score.")
    lexical_rank: int | None = Field(default=None, description="Rank in the BM25 list (1-based).")
    ranker_score: float | None = Field(default=None, description="Logit of the learned ranker when it ordered the results "
                                                                 "(memory.retrieval.rerank_depth > 0), else null.")


class SearchResponse(StrictModel):
    """Ranked results, best first."""

    object: Literal["list"] = Field(default="list", description="Always 'list'.")
    data: list[SearchResult] = Field(description="Results.")


class MemoryList(StrictModel):
    """Memories of one source id."""

    object: Literal["list"] = Field(default="list", description="Always 'list'.")
    data: list[MemoryOut] = Field(description="Memories, oldest first.")


class DeleteResponse(StrictModel):
    """Deletion acknowledgement (durable when sent)."""

    object: Literal["memory.deleted"] = Field(default="memory.deleted", description="Always 'memory.deleted'.")
    id: str = Field(description="The deleted id.")
    deleted: bool = Field(description="Always true (an unknown id is a 404).")
