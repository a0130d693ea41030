"""The design's v1.2 record JSON: import and export of experience records in it.

The service stores :class:`~._schema.ExperienceRecord` (flat segments, epoch-second times). The
design writes the same record as::

    {"version": "1.2",
     "metadata": {"id", "timestamp": "2026-12-03T12:00:00Z", "source_model", "task_domain",
                  "topic", "human_reviewer", "expires_at": ISO 8601 or null},
     "segments": {"context": {...}, "reasoning": [...], "verification": [...], "outcome": {...}},
     "evaluation": {"human_label", "error_tags", "retrieval_score", ...}}

The segments and the evaluation are the very models of :mod:`~._schema` (one definition of each
field); only the envelope differs: ``version`` for ``schema_version``, ``human_reviewer`` for
``reviewer``, ISO 8601 times (a time without a zone is UTC) for epoch seconds.
:func:`to_v12` and :func:`from_v12` convert; ``POST /v1/experiences`` accepts either form and
``GET /v1/experiences/{id}?format=v1.2`` returns this one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from recallserve.kernels import StrictModel
from recallserve.serve.experience._schema import (
    MAX_EPOCH,
    SCHEMA_VERSION,
    ExperienceContext,
    ExperienceEvaluation,
    ExperienceMetadata,
    ExperienceOutcome,
    ExperienceRecord,
    ReasoningStep,
    VerificationItem,
    check_expiry,
    check_topic,
    new_experience_id,
)

__all__ = ["ExperienceRecordV12", "MetadataV12", "SegmentsV12", "to_v12", "from_v12", "is_v12"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LAST = datetime.fromtimestamp(MAX_EPOCH, tz=UTC)


def _utc(v: datetime | None, field: str) -> datetime | None:
    if v is None:
        return None
    v = v if v.tzinfo is not None else v.replace(tzinfo=UTC)
    if not _EPOCH <= v <= _LAST:
        raise ValueError(f"{field} must be between 1970-01-01 and 9999-12-31 (UTC)")
    return v.astimezone(UTC)


def _iso(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)


class MetadataV12(StrictModel):
    """Identity and provenance, as the design writes them."""

    id: str = Field(default_factory=new_experience_id, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$",
                    description="Record id (letters, digits and _.:-).")
    timestamp: datetime = Field(default_factory=lambda: datetime.now(UTC),
                                description="Creation time, ISO 8601 (UTC when no zone is given).")
    source_model: str = Field(min_length=1, max_length=200, description="Model that produced the trace.")
    task_domain: str = Field(default="general", min_length=1, max_length=64, description="Task domain.")
    topic: str = Field(default="general", max_length=200, description="Topic tree path, e.g. 'physics/speed'.")
    human_reviewer: str | None = Field(default=None, max_length=200, description="Who reviewed the trace.")
    expires_at: datetime | None = Field(default=None, description="Hard expiry, ISO 8601; null = never.")

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        return check_topic(v)

    @field_validator("timestamp", "expires_at", mode="before")
    @classmethod
    def _iso_only(cls, v: Any, info: Any) -> Any:
        # NOTE: pydantic reads a number as epoch seconds (and true as 1970-01-01T00:00:01): the v1.2
        # form writes ISO 8601, and a number here is the stored form's field in the wrong envelope.
        if isinstance(v, (bool, int, float)):
            raise ValueError(f"must be an ISO 8601 time string (e.g. 2026-12-03T12:00:00Z), got {v!r}")
        return v

    @model_validator(mode="after")
    def _expiry(self) -> MetadataV12:
        check_expiry(self.timestamp.timestamp(), None if self.expires_at is None else self.expires_at.timestamp())
        return self

    @field_validator("timestamp", "expires_at")
    @classmethod
    def _in_range(cls, v: datetime | None, info: Any) -> datetime | None:
        return _utc(v, info.field_name)


class SegmentsV12(StrictModel):
    """The four segments of the trace."""

    context: ExperienceContext = Field(description="Facts only.")
    reasoning: list[ReasoningStep] = Field(default_factory=list, max_length=64, description="Reasoning steps.")
    verification: list[VerificationItem] = Field(default_factory=list, max_length=32, description="Typed checks.")
    outcome: ExperienceOutcome = Field(description="Atomic answer and confidence.")


class ExperienceRecordV12(StrictModel):
    """An experience record in the design's v1.2 JSON."""

    version: Literal["1.2"] = Field(description="Record format version.")
    metadata: MetadataV12 = Field(description="Identity and provenance.")
    segments: SegmentsV12 = Field(description="Context, reasoning, verification, outcome.")
    evaluation: ExperienceEvaluation = Field(default_factory=ExperienceEvaluation, description="Labels and scores.")


def is_v12(body: Any) -> bool:
    """Whether a JSON body is in the v1.2 form (it has ``version`` or ``segments``)."""
    return isinstance(body, dict) and ("segments" in body or "version" in body)


def from_v12(doc: ExperienceRecordV12) -> ExperienceRecord:
    """The stored form of a v1.2 record."""
    md = doc.metadata
    seg = doc.segments
    return ExperienceRecord(
        metadata=ExperienceMetadata(
            id=md.id, schema_version=SCHEMA_VERSION, timestamp=md.timestamp.timestamp(), source_model=md.source_model,
            task_domain=md.task_domain, topic=md.topic, reviewer=md.human_reviewer,
            expires_at=None if md.expires_at is None else md.expires_at.timestamp(),
        ),
        context=seg.context, reasoning=seg.reasoning, verification=seg.verification, outcome=seg.outcome,
        evaluation=doc.evaluation,
    )


def to_v12(record: ExperienceRecord) -> ExperienceRecordV12:
    """A stored record in the v1.2 form (times as UTC ISO 8601)."""
    md = record.metadata
    ts = _iso(md.timestamp)
    assert ts is not None
    return ExperienceRecordV12(
        version="1.2",
        metadata=MetadataV12(id=md.id, timestamp=ts, source_model=md.source_model, task_domain=md.task_domain,
                             topic=md.topic, human_reviewer=md.reviewer, expires_at=_iso(md.expires_at)),
        segments=SegmentsV12(context=record.context, reasoning=record.reasoning, verification=record.verification,
                             outcome=record.outcome),
        evaluation=record.evaluation,
    )
