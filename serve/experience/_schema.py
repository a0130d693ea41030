"""The segmented experience record, schema version 1.2 (E-CoT).

One reasoning trace is stored as four segments plus bookkeeping:

* **context**: the facts only (raw text, structured quantities, constraints);
* **reasoning**: numbered steps, each with the principle applied and its evidence;
* **verification**: typed checks; their ``actual`` and ``status`` are written by code
  (:mod:`recallserve.serve.experience._verify`), never copied from the model's text;
* **outcome**: one atomic answer and a confidence derived from the verification results;
* **metadata** (id, timestamp, source model, domain, topic path, reviewer, expiry) and
  **evaluation** (human label, error tags, retrieval score).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator, model_validator

from recallserve.kernels import StrictModel, check_json

__all__ = [
    "SCHEMA_VERSION",
    "Confidence",
    "VerificationType",
    "VerificationStatus",
    "Tier",
    "Quantity",
    "StructuredConstraint",
    "StatedResult",
    "Answer",
    "answer_text",
    "ExperienceContext",
    "ReasoningStep",
    "VerificationItem",
    "ExperienceOutcome",
    "ExperienceMetadata",
    "ExperienceEvaluation",
    "ExperienceRecord",
    "new_experience_id",
    "check_expiry",
]

SCHEMA_VERSION = "1.2"
Confidence = Literal["high", "medium", "low"]
VerificationType = Literal["boundary_test", "unit_check", "back_substitution", "recomputation", "regulatory_check",
                           "grounding_check"]
VerificationStatus = Literal["pass", "fail", "doubtful", "not_run"]
# active: reusable now; archival: topic tree / error patterns; review: waits for a person.
Tier = Literal["active", "archival", "review"]

_TOPIC = re.compile(r"^[a-z0-9][a-z0-9_.-]*(/[a-z0-9][a-z0-9_.-]*)*$")
_TAG = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
# NOTE: the last second of year 9999 (what datetime can hold); a later "timestamp" is garbage that
# would overflow every date conversion downstream.
MAX_EPOCH = 253402300799.0
_Constraint = Annotated[str, Field(min_length=1, max_length=1000)]


# NOTE: hex digits 0-9 spelt as the letters g-p: 24 hex digits held a 13-19 digit run passing the
# card check (or a phone-like run) in ~0.26 % of ids, which the masker then masked wherever the id
# was written as text (the memory tier's ``experience_id``: "exp_f282b[CARD_NUMBER]"), so those
# records lost their link; letters only are never personal data, with the same 96 bits.
_NO_DIGITS = str.maketrans("0123456789", "ghijklmnop")


def new_experience_id() -> str:
    """A fresh record id (``exp_`` + 24 letters a-p: uuid4 hex with its digits spelt as letters).

    Example:
        >>> len(new_experience_id()), any(c.isdigit() for c in new_experience_id())
        (28, False)
    """
    return "exp_" + uuid.uuid4().hex[:24].translate(_NO_DIGITS)


def check_topic(v: str) -> str:
    """A topic path, normalised (trimmed, lower case); ValueError unless like 'math/percent'."""
    v = v.strip().strip("/").lower()
    if not _TOPIC.match(v):
        raise ValueError(f"topic {v!r} must be a path like 'math/percent' (a-z 0-9 _ . - separated by /)")
    return v


def check_expiry(timestamp: float, expires_at: float | None) -> None:
    """ValueError naming ``expires_at`` when a record would expire before it was created.

    NOTE: its segments go to the memory tier, which refuses such a memory: the record was stored
    and acknowledged while its memories were dropped (a warning in the log).
    """
    if expires_at is not None and expires_at < timestamp:
        raise ValueError("expires_at: must not be before the record's timestamp")


def _check_tags(tags: list[str]) -> list[str]:
    out: list[str] = []
    for t in tags:
        norm = t.strip().lower().replace(" ", "_")
        if not _TAG.match(norm):
            raise ValueError(f"error tag {t!r} must be 1-64 of a-z 0-9 _ . - ")
        if norm not in out:
            out.append(norm)
    return out


class Quantity(StrictModel):
    """A named quantity stated in the problem."""

    name: str = Field(min_length=1, max_length=64, description="Quantity name, e.g. 'distance'.")
    value: float = Field(strict=True, description="Numeric value.")
    unit: str = Field(default="", max_length=32, description="Unit as written, e.g. 'km'; '' when none.")


_Name = Annotated[str, Field(min_length=1, max_length=200)]


class StructuredConstraint(StrictModel):
    """A constraint as the design's v1.2 record writes it in ``context.structured.constraints``.

    The design's example is ``{"regulation": "CBIRC_Rule_27", "threshold": 0.35, "asset_type":
    "non_standard"}``: the rule that imposes it, its limit and what the limit applies to. ``quantity``
    and ``operator`` name a stated quantity the limit bounds (``quantity <= threshold`` by default):
    then code checks it (:func:`recallserve.serve.experience._extract.constraint_checks`).
    """

    regulation: _Name | None = Field(default=None, description="Rule or regulation id, e.g. 'CBIRC_Rule_27'.")
    threshold: float | None = Field(default=None, allow_inf_nan=False, description="The limit, e.g. 0.35.")
    asset_type: _Name | None = Field(default=None, description="What the limit applies to, e.g. 'non_standard'.")
    quantity: _Name | None = Field(default=None, description="Name of a stated quantity the threshold bounds.")
    operator: Literal["<=", "<", ">=", ">", "=="] = Field(default="<=", description="quantity OPERATOR threshold.")
    unit: str | None = Field(default=None, max_length=32, description="Unit of the threshold, if any.")
    text: str | None = Field(default=None, max_length=1000, description="The constraint in words.")

    def render(self) -> str:
        """One line of text (what is cleaned, embedded and shown), e.g. 'CBIRC_Rule_27: non_standard <= 0.35'."""
        head = f"{self.regulation}: " if self.regulation else ""
        subject = self.quantity or self.asset_type or "value"
        limit = "" if self.threshold is None else f" {self.operator} {self.threshold:g}" + (f" {self.unit}" if self.unit else "")
        tail = f" ({self.text})" if self.text else ""
        return f"{head}{subject}{limit}{tail}".strip()


#: A constraint: a fact in words, or the design's structured object.
Constraint = _Constraint | StructuredConstraint


def constraint_text(c: str | StructuredConstraint) -> str:
    """A constraint as one line of text."""
    return c if isinstance(c, str) else c.render()


class ExperienceContext(StrictModel):
    """Facts of the problem, without any reasoning."""

    raw_text: str = Field(min_length=1, max_length=8000, description="The problem as given.")
    quantities: list[Quantity] = Field(default_factory=list, max_length=32, description="Structured quantities.")
    constraints: list[Constraint] = Field(
        default_factory=list, max_length=32,
        description="Constraints: facts in words (1-1000 characters each) or the design's objects "
                    "({regulation, threshold, asset_type, ...}).")

    def constraint_texts(self) -> list[str]:
        """Each constraint as one line of text."""
        return [constraint_text(c) for c in self.constraints]


class ReasoningStep(StrictModel):
    """One step of the reasoning."""

    step_id: int = Field(strict=True, ge=1, le=64, description="1-based step number.")
    text: str = Field(min_length=1, max_length=2000, description="What was done in this step.")
    principle: str = Field(default="", max_length=500, description="Rule, law or formula applied.")
    evidence: str = Field(default="", max_length=1000, description="Facts the step relies on.")


class StatedResult(StrictModel):
    """A check's result as its author wrote it (kept; code never trusts it)."""

    status: VerificationStatus | None = Field(default=None, description="Status as written.")
    actual: Any = Field(default=None, description="Actual value as written.")
    notes: str | None = Field(default=None, max_length=1000, description="Notes as written.")

    @field_validator("actual")
    @classmethod
    def _bounded(cls, v: Any, info: Any) -> Any:
        return check_json(v, info.field_name, max_depth=3, max_items=32, max_chars=1000)


class VerificationItem(StrictModel):
    """A typed check. ``actual``/``status``/``notes`` are filled by code when executed.

    ``verified`` tells whether code reached a verdict (``pass`` or ``fail``); a check it could not
    execute (an unregistered rule, prose, nothing to compare with) is unverified and its author's
    result stays in ``stated`` (what the v1.2 export writes back as ``status``/``actual``/``notes``).

    Inputs by type (``target`` is the main operand, ``input`` the named extras):

    * ``recomputation``: target = expression; expected = the claimed value.
    * ``unit_check``: target = quantity expression (``"120 km / 1.5 h"``); expected = a unit
      (``"km/h"``) or a quantity (``"80 km/h"``).
    * ``back_substitution``: target = equation (``"2*x + 3 = 11"``); input = ``{"x": 4}`` (or
      expected = ``"x = 4"``).
    * ``boundary_test``: target = value or expression; input = ``{"min": .., "max": ..}`` (or
      expected = ``"0 <= v <= 100"``, ``">= 0"``, ``"[0, 100]"``).
    * ``regulatory_check``: target = rule id; input = the rule's inputs; expected = the value
      the rule gives, or ``true``/``false`` for a condition rule.
    * ``grounding_check`` (derived from the context, :mod:`recallserve.serve.experience._grounding`): target =
      the answer's formula; input = ``{"stated": [..], "units": [..], "steps": [..]}``; doubtful
      when a stated quantity is not accounted for.
    """

    type: VerificationType = Field(description="Check template.")
    target: str = Field(default="", max_length=1000, description="Main operand (expression, equation, rule id).")
    input: dict[str, Any] = Field(default_factory=dict, description="Named inputs of the check.")
    expected: Any = Field(default=None, description="Expected value, unit, range or rule result.")
    actual: Any = Field(default=None, description="Value computed by code (never taken from the model).")
    status: VerificationStatus = Field(default="not_run", description="Result of executing the check.")
    notes: str = Field(default="", max_length=1000, description="Why it passed, failed or was doubtful.")
    verified: bool = Field(default=False, description="Code executed the check to a verdict (pass or fail).")
    stated: StatedResult | None = Field(default=None, description="The result as the record's author wrote it.")

    @field_validator("input", "expected", "actual")
    @classmethod
    def _bounded(cls, v: Any, info: Any) -> Any:
        # NOTE: free-form JSON: finite numbers, short strings, small shallow maps (a check's
        # inputs are a few named numbers; anything bigger is an attack on the verifier).
        return check_json(v, info.field_name, max_depth=3, max_items=32, max_chars=1000)


#: An atomic answer: a string, a boolean or a number (as the design writes ``"answer": true``).
Answer = Annotated[StrictStr, Field(min_length=1, max_length=2000)] | StrictBool | StrictInt | Annotated[
    StrictFloat, Field(allow_inf_nan=False)]


def answer_text(answer: str | bool | int | float) -> str:
    """An answer as text: strings as written, booleans and numbers as JSON writes them.

    Example:
        >>> answer_text(True), answer_text(0.35), answer_text("80 km/h")
        ('true', '0.35', '80 km/h')
    """
    if isinstance(answer, bool):
        return "true" if answer else "false"
    return answer if isinstance(answer, str) else repr(answer)


class ExperienceOutcome(StrictModel):
    """The answer of the trace."""

    answer: Answer = Field(description="One atomic answer: a string (e.g. '80 km/h'), a boolean or a number.")
    confidence: Confidence = Field(default="medium", description="Derived from verification results by code.")
    stated_confidence: Confidence | None = Field(default=None, description="Confidence the model wrote, if any.")
    explanation: str = Field(default="", max_length=2000, description="Short justification.")

    @property
    def answer_text(self) -> str:
        """The answer as text (:func:`answer_text`)."""
        return answer_text(self.answer)


class ExperienceMetadata(StrictModel):
    """Identity and provenance of a record."""

    id: str = Field(default_factory=new_experience_id, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$",
                    description="Record id (letters, digits and _.:-; usable in URLs).")
    schema_version: Literal["1.2"] = Field(default=SCHEMA_VERSION, description="Schema version of the record.")
    timestamp: float = Field(strict=True, default_factory=time.time, ge=0, le=MAX_EPOCH, description="Creation time, epoch seconds.")
    source_model: str = Field(min_length=1, max_length=200, description="Model that produced the trace.")
    task_domain: str = Field(default="general", min_length=1, max_length=64, description="Task domain, e.g. 'units'.")
    topic: str = Field(default="general", max_length=200, description="Topic tree path, e.g. 'physics/speed'.")
    reviewer: str | None = Field(default=None, max_length=200, description="Who reviewed the trace, if anyone.")
    user: str | None = Field(default=None, min_length=1, max_length=128,
                             description="End user the trace was produced for (the chat request's `user`); None = the tenant.")
    expires_at: float | None = Field(strict=True, default=None, ge=0, le=MAX_EPOCH, description="Hard expiry, epoch seconds; None = never.")

    @field_validator("topic")
    @classmethod
    def _check_topic(cls, v: str) -> str:
        return check_topic(v)

    @model_validator(mode="after")
    def _expiry(self) -> ExperienceMetadata:
        check_expiry(self.timestamp, self.expires_at)
        return self


class ExperienceEvaluation(StrictModel):
    """Human and retrieval evaluation of a record."""

    human_label: Literal["correct", "wrong"] | None = Field(default=None, description="Reviewer's verdict.")
    error_tags: list[str] = Field(default_factory=list, max_length=16, description="Error pattern tags.")
    review_note: str = Field(default="", max_length=2000, description="Reviewer's note.")
    retrieval_score: float | None = Field(strict=True, default=None, description="Score of the last retrieval that used it.")
    audit: bool = Field(strict=True, default=False, description="Drawn for the audit sample: auto-accepted into the active cache "
                                                   "and also listed in the review queue until a reviewer labels it.")

    @field_validator("error_tags")
    @classmethod
    def _tags(cls, v: list[str]) -> list[str]:
        return _check_tags(v)


class ExperienceRecord(StrictModel):
    """A segmented reasoning trace (schema 1.2)."""

    metadata: ExperienceMetadata = Field(description="Identity and provenance.")
    context: ExperienceContext = Field(description="Facts only.")
    reasoning: list[ReasoningStep] = Field(default_factory=list, max_length=64, description="Reasoning steps.")
    verification: list[VerificationItem] = Field(default_factory=list, max_length=32, description="Typed checks.")
    outcome: ExperienceOutcome = Field(description="Atomic answer and confidence.")
    evaluation: ExperienceEvaluation = Field(default_factory=ExperienceEvaluation, description="Labels and scores.")

    def segment_texts(self) -> dict[str, str]:
        """Each segment rendered as plain text (what is embedded and written as memories)."""
        steps = "\n".join(
            f"{s.step_id}. {s.text}" + (f" [principle: {s.principle}]" if s.principle else "") for s in self.reasoning
        )
        checks = "\n".join(f"{v.type}: {v.target} -> {v.status}" for v in self.verification)
        ctx = self.context.raw_text
        if self.context.constraints:
            ctx += "\nconstraints: " + "; ".join(self.context.constraint_texts())
        return {
            "context": ctx,
            "reasoning": steps,
            "verification": checks,
            "outcome": f"{self.outcome.answer_text} (confidence {self.outcome.confidence})",
        }

    def search_text(self) -> str:
        """The text a similarity search compares against: the problem and the principles used."""
        principles = "; ".join(s.principle for s in self.reasoning if s.principle)
        constraints = "; ".join(self.context.constraint_texts())
        return "\n".join(x for x in (self.context.raw_text, constraints, principles) if x).strip()
