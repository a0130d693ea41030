"""Configuration, request and response models of the experience service and its HTTP routes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from recallserve.kernels import NoControl, StrictModel
from recallserve.serve.experience._calculator import DEFAULT_MAX_STEPS, DEFAULT_SECONDS
from recallserve.serve.experience._parser import ParseReport
from recallserve.serve.experience._rules import Rule
from recallserve.serve.experience._schema import ExperienceRecord, Tier, _check_tags

__all__ = [
    "ExperienceConfig",
    "ExperienceView",
    "ExperienceHit",
    "ConflictAlert",
    "SearchRequest",
    "SearchResult",
    "LabelRequest",
    "ProduceResult",
    "MaintenanceReport",
]


class ExperienceConfig(StrictModel):
    """Settings of the experience memory (E-CoT)."""

    data_dir: Path = Field(description="Folder of the SQLite file `experiences.sqlite3`.")
    active_capacity: int = Field(default=100, ge=50, le=200, description="Active records per tenant and domain.")
    # NOTE: the active cache is bounded per (tenant, domain), and the domain is a label the client
    # picks (metadata.task_domain): without this, every new label opened another cache of up to
    # active_capacity records, and a search without a domain, the review queue and maintenance
    # scanned them all. 64 = the most domains `domains` can list.
    max_active_domains: int = Field(
        default=64, ge=1, le=1024,
        description="Task domains with an active cache per tenant; a new one past it demotes the active records "
                    "of the least recently used domain to archival.",
    )
    active_window_days: float = Field(default=30.0, gt=0, le=365,
                                      description="Active records older than this (by their own time) sink to archival.")
    recency_weight: float = Field(
        default=0.7, ge=0.0, le=1.0, description="Weight of the recency rank; similarity gets 1 minus this."
    )
    decay_rate: float = Field(default=0.1, gt=0, le=10, description="Soft decay 1/(1 + rate x days since last use).")
    demote_below: float = Field(default=0.3, gt=0, lt=1,
                                description="Active records whose decay falls below are demoted first when over capacity.")
    min_similarity: float = Field(
        default=0.35, ge=0.0, le=1.0, description="Cosine below which an active record is not a candidate."
    )
    parse_fallback: bool = Field(
        default=True, description="When a segmented reply does not parse, ask the router model once to rewrite it.",
    )
    hybrid: bool = Field(
        default=True, description="Find active experiences by keyword (BM25) and vector, fused by reciprocal rank.",
    )
    shared_families: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=64,
        description="Model families (as model_family names them, e.g. 'qwen2.5-coder') whose models of every size "
                    "reuse each other's experiences; any other experience is reused only by the model that wrote it.",
    )
    top_k: int = Field(default=3, ge=1, le=20, description="Experiences injected into one prompt (002: top 3).")
    archival_k: int = Field(default=2, ge=0, le=20, description="Archival lessons injected into one prompt.")
    default_ttl_days: float | None = Field(
        default=None, gt=0, description="Hard expiry for records created without one; None = never."
    )
    max_tokens: int = Field(default=384, ge=32, le=4096, description="Generation budget of the segmented mode.")
    constrain_json: bool = Field(
        default=False, description="Constrain the reasoner's reply with a JSON schema (when the engine supports it)."
    )
    rules: list[Rule] = Field(default_factory=list, description="Rule table for regulatory_check items.")
    domains: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=64,
        description="Task domains (request metadata.task_domain) answered with segmented reasoning by default, "
                    "without metadata.reasoning; metadata.reasoning=default still opts a request out.",
    )
    extracted_checks: bool = Field(
        default=True, description="Also verify each trace by checks derived from the quantities of its cleaned context.",
    )
    audit_share: float = Field(
        default=0.05, ge=0.0, le=1.0,
        description="Share of auto-accepted traces (verified, confidence high) also put in the review queue as audit.",
    )
    # NOTE: the defaults leave ~100x headroom over an honest record; see serve.experience._calculator.
    verify_max_steps: int = Field(
        default=DEFAULT_MAX_STEPS, ge=100, le=1_000_000,
        description="Calculator steps (syntax nodes evaluated) allowed for verifying one record.",
    )
    verify_budget_ms: float = Field(
        default=DEFAULT_SECONDS * 1e3, gt=0, le=10_000,
        description="CPU milliseconds (the verifying thread's) allowed for verifying one record; checks past it "
        "fail unrun. verify_timeout_ms bounds the wall clock.",
    )
    # NOTE: processes, not threads: the calculator is pure Python and a thread shares the ingress's
    # GIL, so hostile records would still slow every other request (serve.experience._pool).
    verify_workers: int = Field(
        default=1, ge=0, le=16,
        description="Verification worker processes per ingress replica (started on first use); 0 = a thread.",
    )
    verify_queue: int = Field(
        default=64, ge=1, le=4096,
        description="Records allowed to wait for a verification worker; past it a record's checks fail unrun.",
    )
    verify_timeout_ms: float = Field(
        default=2_000, gt=0, le=60_000,
        description="Milliseconds a worker may take for one record before it is killed and replaced (checks fail).",
    )

    @model_validator(mode="after")
    def _timeout_covers_budget(self) -> "ExperienceConfig":
        # NOTE: the worker stops itself at the budget; the timeout is the backstop for a step the
        # caps do not interrupt, so one shorter than the budget would kill honest records.
        if self.verify_timeout_ms <= self.verify_budget_ms:
            raise ValueError(f"verify_timeout_ms ({self.verify_timeout_ms}) must exceed verify_budget_ms "
                             f"({self.verify_budget_ms})")
        return self


class ExperienceView(StrictModel):
    """A stored record with its cache state."""

    record: ExperienceRecord = Field(description="The record.")
    tier: Tier = Field(description="active, archival or review.")
    last_used_at: float = Field(description="Last retrieval (or creation) time, epoch seconds.")
    use_count: int = Field(ge=0, description="Times the record was retrieved.")
    decay: float = Field(ge=0, le=1, description="Soft decay factor 1/(1 + 0.1 x days since last use).")


class ExperienceHit(StrictModel):
    """A retrieved record with its ranking parts."""

    experience: ExperienceView = Field(description="The record.")
    score: float = Field(description="0.7 x recency + 0.3 x similarity (archival: similarity or recency).")
    similarity: float = Field(description="Cosine similarity to the query (0 when no query).")
    recency: float = Field(description="Recency rank score in [0, 1].")
    preferred_over: str | None = Field(default=None, description="Id of the older active record this one supersedes.")


class ConflictAlert(StrictModel):
    """An active record older than a newer archival record on the same topic."""

    topic: str = Field(description="Topic path shared by both records.")
    active_id: str = Field(description="The older active record.")
    newer_id: str = Field(description="The newer archival record, which is preferred.")
    active_timestamp: float = Field(description="Creation time of the active record.")
    newer_timestamp: float = Field(description="Creation time of the archival record.")
    message: str = Field(description="Human-readable alert.")


class SearchRequest(StrictModel):
    """Search the caches of the caller's tenant."""

    query: str = Field(default="", max_length=8000, description="Problem text to match; '' to list by recency.")
    source_model: str = Field(min_length=1, max_length=200, description="Only experiences of this model's family.")
    domain: str | None = Field(default=None, min_length=1, max_length=64, description="Task domain filter.")
    k: int = Field(strict=True, default=3, ge=1, le=50, description="Active hits to return.")
    topic_prefix: str | None = Field(default=None, max_length=200, description="Archival: topic subtree, e.g. 'math'.")
    error_tags: list[str] = Field(default_factory=list, max_length=16, description="Archival: any of these tags.")
    archival_k: int = Field(strict=True, default=0, ge=0, le=50, description="Archival hits to return (0 = none).")

    @field_validator("error_tags")
    @classmethod
    def _tags(cls, v: list[str]) -> list[str]:
        return _check_tags(v)


class SearchResult(StrictModel):
    """Active hits (conflicts resolved to the newer record), archival hits and alerts."""

    hits: list[ExperienceHit] = Field(default_factory=list, description="Active-cache hits, best first.")
    archival: list[ExperienceHit] = Field(default_factory=list, description="Archival hits.")
    conflicts: list[ConflictAlert] = Field(default_factory=list, description="Conflict alerts raised.")


class LabelRequest(StrictModel):
    """A reviewer's verdict on a trace."""

    label: Literal["correct", "wrong"] = Field(description="correct -> active cache; wrong -> archival.")
    error_tags: list[str] = Field(default_factory=list, max_length=16, description="Error pattern tags.")
    note: str = Field(default="", max_length=2000, description="Reviewer's note.")
    reviewer: Annotated[str | None, NoControl] = Field(default=None, max_length=200, description="Reviewer name; default the tenant.")

    @field_validator("error_tags")
    @classmethod
    def _tags(cls, v: list[str]) -> list[str]:
        return _check_tags(v)


class ProduceResult(StrictModel):
    """Outcome of one segmented-mode generation."""

    answer: str | None = Field(description="The parsed answer, None when none was found.")
    experience: ExperienceView | None = Field(description="The stored record, None when parsing failed.")
    report: ParseReport = Field(description="What the parser found and could not read.")
    first_report: ParseReport | None = Field(
        default=None, description="The reasoner's own reply's report when the router model was asked to rewrite it.")
    injected: list[str] = Field(default_factory=list, description="Ids of the experiences put into the prompt.")
    required_checks: list[str] = Field(default_factory=list, description="Check types the answer had to include.")
    archival: list[str] = Field(default_factory=list, description="Ids of the archival lessons put into the prompt.")
    # NOTE: not the trace's own tags (those are ``experience.record.evaluation.error_tags``): the
    # mistakes the problem can make, known before any answer. One name for both once made the chat
    # response report the a3 trace's search tags (arithmetic_error, out_of_bounds) as its tags.
    searched_tags: list[str] = Field(default_factory=list,
                                     description="Error tags the archive was searched by (the problem's possible mistakes).")
    raw_text: str = Field(description="The reasoner's reply.")
    prompt_tokens: int = Field(ge=0, description="Prompt tokens.")
    completion_tokens: int = Field(ge=0, description="Generated tokens.")


class MaintenanceReport(StrictModel):
    """What a maintenance pass changed."""

    expired_archived: int = Field(ge=0, description="Active records moved to archival by their hard expiry.")
    demoted: dict[str, int] = Field(default_factory=dict, description="Demotions to archival by reason.")
    freshness: float | None = Field(description="Mean decay of active records afterwards (None: none).")
