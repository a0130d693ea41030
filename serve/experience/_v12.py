"""The design's v1.2 record JSON: import and export of experience records in it.

The service stores :class:`~._schema.ExperienceRecord` (flat segments, epoch-second times). The
design writes the same record as::

    {"version": "1.2",
     "metadata": {"id", "timestamp": "2026-12-03T12:00:00Z", "source_model", "task_domain",
                  "topic", "human_reviewer", "expires_at": ISO 8601 or null},
     "segments": {"context": {...}, "reasoning": [...], "verification": [...], "outcome": {...}},
     "evaluation": {"human_label", "error_tags", "retrieval_score", ...}}

The reasoning steps, quantities, constraints and the evaluation are the very models of
:mod:`~._schema` (one definition of each field); the envelope differs: ``version`` for
``schema_version``, ``human_reviewer`` for ``reviewer``, ISO 8601 times (a time without a zone is
UTC) for epoch seconds, and three places where the design's record says what its author claims
while the stored form keeps what code found:

* ``context.structured.{quantities, constraints}`` (the design's place; the stored form keeps them
  flat in ``context``; the flat v1.2 form of earlier releases is still read);
* ``outcome.answer`` any JSON scalar (``true``, ``0.35``, ``"80 km/h"``); ``outcome.confidence``
  is the author's, the code's derivation is added as ``verified_confidence``;
* each check's ``status`` / ``actual``: code's result when code reached a verdict (``verified:
  true``; the author's differing claim is kept in ``stated``), else the author's, as written, with
  ``verified: false``; ``notes`` as the author wrote them, code's own in ``check_notes``.

So the design's own example record (``tests/unit/experience/test_experience_seed_v12.py``) goes
through ``POST /v1/experiences`` and comes back from ``GET ...?format=v1.2`` with every field it had.
:func:`to_v12` and :func:`from_v12` convert; ``POST /v1/experiences`` accepts either form.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from recallserve.kernels import StrictModel
from recallserve.kernels import check_json
from recallserve.serve.experience._schema import (
    MAX_EPOCH,
    SCHEMA_VERSION,
    Answer,
    Confidence,
    Constraint,
    ExperienceContext,
    ExperienceEvaluation,
    ExperienceMetadata,
    ExperienceOutcome,
    ExperienceRecord,
    Quantity,
    ReasoningStep,
    StatedResult,
    VerificationItem,
    VerificationStatus,
    VerificationType,
    check_expiry,
    check_topic,
    new_experience_id,
)

__all__ = ["ExperienceRecordV12", "MetadataV12", "SegmentsV12", "ContextV12", "VerificationV12", "OutcomeV12",
           "to_v12", "from_v12", "is_v12"]

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


class StructuredV12(StrictModel):
    """The structured facts of the context."""

    quantities: list[Quantity] = Field(default_factory=list, max_length=32, description="Stated quantities.")
    constraints: list[Constraint] = Field(default_factory=list, max_length=32,
                                          description="Constraints: words, or objects {regulation, threshold, ...}.")


class ContextV12(StrictModel):
    """Facts only: the problem as given and its structured facts."""

    raw_text: str = Field(min_length=1, max_length=8000, description="The problem as given.")
    structured: StructuredV12 = Field(default_factory=StructuredV12, description="Quantities and constraints.")
    # NOTE: the flat form this product wrote before it followed the design's record; still read.
    quantities: list[Quantity] = Field(default_factory=list, max_length=32, exclude=True,
                                       description="Deprecated: write structured.quantities.")
    constraints: list[Constraint] = Field(default_factory=list, max_length=32, exclude=True,
                                          description="Deprecated: write structured.constraints.")

    @model_validator(mode="after")
    def _room(self) -> ContextV12:
        for name in ("quantities", "constraints"):
            if len(getattr(self.structured, name)) + len(getattr(self, name)) > 32:
                raise ValueError(f"structured.{name}: at most 32 in all")
        return self


class VerificationV12(StrictModel):
    """A typed check as the design writes it (see :class:`~._schema.VerificationItem` for the types)."""

    type: VerificationType = Field(description="Check template.")
    target: str = Field(default="", max_length=1000, description="Main operand (expression, equation, rule id).")
    input: dict[str, Any] = Field(default_factory=dict, description="Named inputs of the check.")
    expected: Any = Field(default=None, description="Expected value, unit, range or rule result.")
    actual: Any = Field(default=None, description="Actual value: code's when verified, else as stated.")
    status: VerificationStatus | None = Field(default=None, description="Code's when verified, else as stated.")
    notes: str | None = Field(default=None, max_length=1000, description="Code's when verified, else as stated.")
    verified: bool | None = Field(default=None, description="Computed (ignored when posted): code reached a verdict.")
    check_notes: str | None = Field(default=None, max_length=1000,
                                    description="Computed (ignored when posted): code's notes on the check.")
    stated: StatedResult | None = Field(default=None, description="The author's result where code's differs.")

    @field_validator("input", "expected", "actual")
    @classmethod
    def _bounded(cls, v: Any, info: Any) -> Any:
        return check_json(v, info.field_name, max_depth=3, max_items=32, max_chars=1000)


class OutcomeV12(StrictModel):
    """The answer: one atomic JSON value and the author's confidence."""

    answer: Answer = Field(description="One atomic answer: a string, a boolean or a number.")
    confidence: Confidence | None = Field(default=None, description="The author's confidence (high/medium/low).")
    explanation: str = Field(default="", max_length=2000, description="Short justification.")
    verified_confidence: Confidence | None = Field(
        default=None, description="Computed (ignored when posted): the confidence code derives from the checks.")


class SegmentsV12(StrictModel):
    """The four segments of the trace."""

    context: ContextV12 = Field(description="Facts only.")
    reasoning: list[ReasoningStep] = Field(default_factory=list, max_length=64, description="Reasoning steps.")
    verification: list[VerificationV12] = Field(default_factory=list, max_length=32, description="Typed checks.")
    outcome: OutcomeV12 = Field(description="Atomic answer and confidence.")


class ExperienceRecordV12(StrictModel):
    """An experience record in the design's v1.2 JSON."""

    version: Literal["1.2"] = Field(description="Record format version.")
    metadata: MetadataV12 = Field(description="Identity and provenance.")
    segments: SegmentsV12 = Field(description="Context, reasoning, verification, outcome.")
    evaluation: ExperienceEvaluation = Field(default_factory=ExperienceEvaluation, description="Labels and scores.")


def is_v12(body: Any) -> bool:
    """Whether a JSON body is in the v1.2 form (it has ``version`` or ``segments``)."""
    return isinstance(body, dict) and ("segments" in body or "version" in body)


def _item_in(v: VerificationV12) -> VerificationItem:
    """A posted check: its ``status``/``actual``/``notes`` are the author's claim (``stated``)."""
    stated = v.stated
    if stated is None and (v.status is not None or v.actual is not None or v.notes is not None):
        stated = StatedResult(status=v.status, actual=v.actual, notes=v.notes)
    return VerificationItem(type=v.type, target=v.target, input=v.input, expected=v.expected, stated=stated)


def _item_out(v: VerificationItem) -> VerificationV12:
    """A stored check in the design's shape: code's verdict, or the author's claim when code has none."""
    base = {"type": v.type, "target": v.target, "input": v.input, "expected": v.expected, "verified": v.verified}
    st = v.stated
    if st is None:
        return VerificationV12(**base, actual=v.actual, status=v.status, notes=v.notes, check_notes=v.notes)
    notes = v.notes if st.notes is None else st.notes
    if v.verified:
        differs = st.status not in (None, v.status) or (st.actual is not None and st.actual != v.actual)
        return VerificationV12(**base, actual=v.actual, status=v.status, notes=notes, check_notes=v.notes,
                               stated=st if differs else None)
    return VerificationV12(**base, actual=st.actual, status=st.status or v.status, notes=notes, check_notes=v.notes)


def from_v12(doc: ExperienceRecordV12) -> ExperienceRecord:
    """The stored form of a v1.2 record."""
    md = doc.metadata
    seg = doc.segments
    ctx = seg.context
    out = seg.outcome
    outcome = (ExperienceOutcome(answer=out.answer, explanation=out.explanation) if out.confidence is None else
               ExperienceOutcome(answer=out.answer, confidence=out.confidence, stated_confidence=out.confidence,
                                 explanation=out.explanation))
    return ExperienceRecord(
        metadata=ExperienceMetadata(
            id=md.id, schema_version=SCHEMA_VERSION, timestamp=md.timestamp.timestamp(), source_model=md.source_model,
            task_domain=md.task_domain, topic=md.topic, reviewer=md.human_reviewer,
            expires_at=None if md.expires_at is None else md.expires_at.timestamp(),
        ),
        context=ExperienceContext(raw_text=ctx.raw_text, quantities=ctx.structured.quantities + ctx.quantities,
                                  constraints=ctx.structured.constraints + ctx.constraints),
        reasoning=seg.reasoning, verification=[_item_in(v) for v in seg.verification], outcome=outcome,
        evaluation=doc.evaluation,
    )


def to_v12(record: ExperienceRecord) -> ExperienceRecordV12:
    """A stored record in the v1.2 form (times as UTC ISO 8601)."""
    md = record.metadata
    ts = _iso(md.timestamp)
    assert ts is not None
    out = record.outcome
    return ExperienceRecordV12(
        version="1.2",
        metadata=MetadataV12(id=md.id, timestamp=ts, source_model=md.source_model, task_domain=md.task_domain,
                             topic=md.topic, human_reviewer=md.reviewer, expires_at=_iso(md.expires_at)),
        segments=SegmentsV12(
            context=ContextV12(raw_text=record.context.raw_text, structured=StructuredV12(
                quantities=record.context.quantities, constraints=record.context.constraints)),
            reasoning=record.reasoning, verification=[_item_out(v) for v in record.verification],
            outcome=OutcomeV12(answer=out.answer, confidence=out.stated_confidence or out.confidence,
                               explanation=out.explanation, verified_confidence=out.confidence)),
        evaluation=record.evaluation,
    )
