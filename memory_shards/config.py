"""Configuration and search schemas of the memory tier (pydantic, unknown fields rejected)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from recallserve.kernels import StrictModel

from .records import MemoryKind, MemoryRecord, Scalar

__all__ = ["ShardCallConfig", "ShardConfig", "ShardPlacement", "SearchFilters", "SearchHit"]


class ShardPlacement(StrictModel):
    """How a shard's scan runs: the device of its kernel columns, their storage dtype, the kernel,
    how many concurrent searches one scan may answer, and when it leaves the exact scan for IVF.

    The cluster config sets it once for every shard (``memory.placement``); a ``cuda`` shard needs
    its deployment to ask for GPUs (``memory.deployment.num_gpus``), or Ray hides them.
    """

    backend: Literal["auto", "torch", "triton"] = Field(default="auto", description="Fused kernel backend (auto: Triton on CUDA, torch on the CPU).")
    gather_max_queries: int = Field(
        default=256, ge=0, le=4096,
        description="Concurrent searches that arrive while one runs are answered by one scan of up to this many queries (0: every search scans alone).",
    )
    device: str = Field(
        default="cpu", pattern=r"^(cpu|cuda(:[0-9]{1,2})?)$",
        description="Where the kernel's columns live and the scan runs: cpu, cuda or cuda:N (the host keeps the WAL/snapshot copy).",
    )
    vector_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        default="float32",
        description="Storage of the device copy of the vectors; half precision halves the bytes a scan reads (products and sums stay float32).",
    )
    # NOTE: the exact/IVF switch is placement, not storage: a profile sets it for every shard
    # (memory.placement), e.g. a 100k-row CPU shard can serve from IVF (issue 15).
    exact_max_rows: int = Field(default=500_000, ge=0, description="Up to this many live rows, search is an exact fused scan; above, IVF candidates + fused re-scoring.")
    ivf_nlist: int = Field(default=1024, ge=1, le=1 << 20, description="IVF inverted lists (k-means centroids).")
    ivf_nprobe: int = Field(default=32, ge=1, le=1 << 20, description="IVF lists probed per query.")
    ivf_candidates: int = Field(default=512, ge=1, le=1 << 16, description="IVF candidates per query, re-scored by the fused kernel (at least k).")
    ivf_train_sample: int = Field(default=65_536, ge=1, description="Vectors sampled to train the IVF centroids.")


class ShardConfig(ShardPlacement):
    """One shard: its placement (device, kernel, exact/IVF policy), storage and durability knobs."""

    shard_id: int = Field(default=0, ge=0, le=4096, description="Index of this shard in the coordinator.")
    data_dir: str | None = Field(default=None, description="Folder for the WAL and snapshots; None keeps the shard in memory only.")
    dim: int = Field(default=384, gt=0, le=8192, description="Vector dimension.")
    model_id: str = Field(min_length=1, max_length=256, description="Embedding model id every stored vector must come from.")
    # NOTE: replay runs at ~7k upsert entries/s (384-d, 2 cores) and ~20 MB/s of WAL; both bounds
    # keep a restart's replay to a few seconds (``recallserve bench restart`` measures it).
    snapshot_every_ops: int = Field(default=20_000, ge=1, description="Write a snapshot after this many WAL entries since the last one (bounds restart replay).")
    snapshot_every_wal_mb: float = Field(
        default=64.0, gt=0, le=1 << 20,
        description="... or after this many MB of WAL since the last one (renewal batches make some entries large).",
    )
    touch_every_hits: int = Field(default=1024, ge=1, description="Apply pending last-access renewals after this many hits.")
    touch_every_seconds: float = Field(default=5.0, gt=0, description="... or when the oldest pending renewal is this old.")
    fsync: bool = Field(default=True, description="fsync the WAL before acknowledging a write batch (off only for benchmarks).")
    compact_dead_ratio: float = Field(default=0.25, gt=0, le=1, description="Compact rows at snapshot time when this share of rows is dead.")
    purge_deleted_within_s: float = Field(
        default=300.0, gt=0, le=86_400,
        description="A deleted record's text leaves the WAL and snapshot files within this many seconds (a "
                    "snapshot rewrites them without it); an erasure (MemoryShard.erase) purges at once.",
    )


class ShardCallConfig(StrictModel):
    """How the coordinator calls shards: deadlines, and what it tells a caller while one is down.

    A shard that fails or misses its deadline is marked down; requests that need it (see
    ``recallserve.memory_shards.coordinator``) answer :class:`~memory_shards.ShardUnavailable` at once,
    requests that do not are answered without it, and one background probe at a time checks
    whether it is back.
    """

    # NOTE: 5 s is far above a healthy search (tens of ms at 100k rows on 2 cores) and below the
    # chat recall's own 10 s deadline, so a hung shard is detected before recall gives up.
    read_timeout_s: float = Field(default=5.0, gt=0, le=600, description="Deadline of one shard read (get, list, search).")
    # NOTE: a write waits for an fsync and may trigger a snapshot of the shard; an expired write
    # may still be applied later (the caller retries; writes are idempotent by id and source).
    write_timeout_s: float = Field(default=30.0, gt=0, le=3600, description="Deadline of one shard write (upsert, delete, renewals).")
    retry_after_s: float = Field(
        default=1.0, gt=0, le=300,
        description="Retry hint (seconds) given while a needed shard is down; also the least time between probes of a down shard.",
    )
    # NOTE: a search asks every healthy shard so that shared rows written through another ingress
    # replica are seen at once; on 2 cores the call to a shard that holds nothing for the tenant
    # cost ~10 ms CPU of ~150 per search (issue 15). > 0 trades that for bounded staleness.
    shared_refresh_s: float = Field(
        default=0.0, ge=0, le=3600,
        description="A search skips a shard that reported no shared rows less than this many seconds ago (and holds "
                    "none of the tenant's own); 0 = every search asks every healthy shard. A shared record written "
                    "through another coordinator to such a shard may be missed for up to this long.",
    )


class SearchFilters(StrictModel):
    """Filters applied as masks before scoring (all given conditions must hold)."""

    kinds: list[MemoryKind] | None = Field(default=None, min_length=1, description="Keep only these kinds.")
    topic_prefix: str | None = Field(default=None, min_length=1, max_length=512, description="Keep records whose topic path starts with this.")
    metadata: dict[str, Scalar] | None = Field(default=None, description="Keep records whose metadata has exactly these values.")
    created_after: float | None = Field(default=None, ge=0, description="Keep records created at or after this epoch second.")
    created_before: float | None = Field(default=None, ge=0, description="Keep records created before this epoch second.")
    user: str | None = Field(default=None, min_length=1, max_length=256, description="Keep records owned by this end user.")
    with_unowned: bool = Field(default=False, description="With ``user``: also keep the tenant's records without an owner.")

    @model_validator(mode="after")
    def _check_range(self) -> SearchFilters:
        if self.created_after is not None and self.created_before is not None and self.created_before <= self.created_after:
            raise ValueError(f"created_before: {self.created_before} must be after created_after {self.created_after}")
        return self

    @property
    def needs_record_check(self) -> bool:
        """True when a filter needs the record itself (topic, metadata), not only columns."""
        return self.topic_prefix is not None or bool(self.metadata) or self.user is not None

    def matches(self, record: MemoryRecord) -> bool:
        """Whether ``record`` passes every filter (the reference used by the column masks)."""
        if self.kinds is not None and record.kind not in self.kinds:
            return False
        if self.user is not None and record.user != self.user and not (self.with_unowned and record.user is None):
            return False
        if self.topic_prefix is not None and not record.topic_path.startswith(self.topic_prefix):
            return False
        if self.metadata:
            for key, value in self.metadata.items():
                if key not in record.metadata or record.metadata[key] != value or type(record.metadata[key]) is not type(value):
                    return False
        if self.created_after is not None and record.created_at < self.created_after:
            return False
        if self.created_before is not None and record.created_at >= self.created_before:
            return False
        return True


class SearchHit(StrictModel):
    """One ranked result: the whole record and the parts of its score.

    The one hit type of the project: the shards and the coordinator return it, the hybrid
    retriever extends it (``HybridHit``), and the request pipeline reads it as
    ``recallserve.serve.memory.MemoryHit`` through the record's properties below (``id``, ``source_id``,
    ``kind``, ``text``, ``created_at``, ``metadata``).
    """

    record: MemoryRecord = Field(description="The recalled record (all its parts).")
    score: float = Field(description="Combined score used for ranking.")
    similarity: float = Field(ge=-1.0001, le=1.0001, description="Cosine similarity of the best-matching row.")
    time_factor: float = Field(ge=0, description="Time-decay factor of the record.")
    part_index: int = Field(ge=0, description="Which embedding text matched best (0 = text, then image description, OCR, parts).")
    shard: int = Field(ge=0, description="Shard that holds the record.")

    @model_validator(mode="after")
    def _finite(self) -> SearchHit:
        if not math.isfinite(self.score):
            raise ValueError(f"score: must be finite, got {self.score}")
        return self

    @property
    def id(self) -> str:
        """The record's id."""
        return self.record.id

    @property
    def source_id(self) -> str:
        """The record's dedup key (ticket id, dia_id, url...)."""
        return self.record.source_id

    @property
    def kind(self) -> str:
        """The record's kind (text, image, table, tool_result, experience, message)."""
        return self.record.kind

    @property
    def text(self) -> str:
        """The text recalled: every text of the unit (the whole text, image description, OCR, parts), one a line."""
        return "\n".join(self.record.searchable_texts())

    @property
    def created_at(self) -> float:
        """The record's creation time, epoch seconds."""
        return self.record.created_at

    @property
    def metadata(self) -> dict[str, Any]:
        """The record's metadata."""
        return dict(self.record.metadata)
