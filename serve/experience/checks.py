"""The verifier's named rules beyond the check templates, in one registry.

The templates of :mod:`recallserve.serve.experience._verify` execute each check a trace carries.
A trace can still pass every check and be wrong: the checks answer another question than the one
asked, or compute something beside the answer, or start from numbers the problem never stated.
Each rule that guards against one such case is a named object here; the verifier runs the
registry (:data:`CHECKS`) in its order, so switching a rule off or measuring it alone is a change
of this table, not of the verifier.

Three kinds, by where the verifier runs them:

* :class:`AddedCheck` (``added``): a check derived from the question, appended to the trace's
  own before they run (:func:`recallserve.serve.experience._verify.with_extracted_checks`);
* :class:`~recallserve.serve.experience._asked.AnswerForm` (``form``): a form the question asks
  of its answer, and which expressions can compute it (read by the gates below);
* :class:`ConfidenceGate` (``gate``): a condition ``high`` confidence needs once every check
  passed; a trace that misses it is ``medium`` (it waits for a reviewer) with the gate's tag
  (:func:`recallserve.serve.experience._verify.finish_record`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from recallserve.serve.experience._asked import MEAN_FORM, PERCENT_FORM, AnswerForm, asked_unit_check
from recallserve.serve.experience._computed import answer_computed
from recallserve.serve.experience._grounded import TAG as UNGROUNDED_TAG
from recallserve.serve.experience._grounded import ground_record, verified_by_grounded
from recallserve.serve.experience._rules import RuleTable
from recallserve.serve.experience._schema import ExperienceRecord, VerificationItem
from recallserve.serve.experience._tags import ANSWER_TAG

__all__ = ["AddedCheck", "ConfidenceGate", "Verdict", "CHECKS", "added_checks", "answer_forms", "gates"]


@dataclass(frozen=True)
class AddedCheck:
    """A check derived from the question and added to the trace's own (not yet run).

    Attributes:
        name: the registry's name.
        make: ``record -> item or None`` (None: the question asks nothing this rule reads).
    """

    name: str
    make: Callable[[ExperienceRecord], VerificationItem | None]


@dataclass(frozen=True)
class Verdict:
    """What a gate found: the checks (a gate may annotate their ``notes``) and whether it holds."""

    checked: list[VerificationItem]
    holds: bool


@dataclass(frozen=True)
class ConfidenceGate:
    """A condition of ``high`` confidence, checked after every check ran.

    Attributes:
        name: the registry's name.
        tag: the error tag a ``high`` trace that misses the gate gets (it becomes ``medium``).
        judge: ``(record, checked, cited rule ids, rule table, answer forms) -> Verdict``.
    """

    name: str
    tag: str
    judge: Callable[[ExperienceRecord, list[VerificationItem], Sequence[str], RuleTable | None, Sequence[AnswerForm]],
                    Verdict]


def _answer_computed(record: ExperienceRecord, checked: list[VerificationItem], cited: Sequence[str],
                     rules: RuleTable | None, forms: Sequence[AnswerForm]) -> Verdict:
    """A passing check computed the answer itself (``None`` from :func:`answer_computed`: nothing to compare)."""
    computed = answer_computed(checked, record.outcome.answer_text, record.context.raw_text, cited, forms=forms)
    return Verdict(checked, computed is not False)


def _grounded(record: ExperienceRecord, checked: list[VerificationItem], cited: Sequence[str],
              rules: RuleTable | None, forms: Sequence[AnswerForm]) -> Verdict:
    """The check that computed the answer is grounded in the problem's numbers (:mod:`._grounded`);
    every ungrounded pass gets its numbers of unknown origin in its ``notes``, whatever the verdict."""
    annotated, flags = ground_record(record, checked, rules, cited)
    ok = verified_by_grounded(annotated, flags, record.outcome.answer_text, record.context.raw_text, cited, forms)
    return Verdict(annotated, ok)


#: The registry, in the order the verifier runs each kind. NOTE: the gates' order matters: every
#: gate runs (``grounded`` annotates the checks' notes whatever the confidence), but only the first
#: gate a ``high`` trace misses tags it, so ``answer_computed`` (the more basic miss) comes first.
CHECKS: dict[str, AddedCheck | AnswerForm | ConfidenceGate] = {
    # The question names the unit of its answer ("in km/h?", "how many liters", "convert ... to
    # m/s"): an answer in another unit, or a conversion that is not the stated quantity, fails.
    "asked_unit": AddedCheck("asked_unit", asked_unit_check),
    # A percentage is a ratio: a difference of two numbers does not compute "12%".
    PERCENT_FORM.name: PERCENT_FORM,
    # A mean is a quotient: a sum does not compute an average.
    MEAN_FORM.name: MEAN_FORM,
    # Every check passing is not enough: one of them must have computed the answer.
    "answer_computed": ConfidenceGate("answer_computed", ANSWER_TAG, _answer_computed),
    # ... and from numbers the problem states (or constants, or grounded results).
    "grounded": ConfidenceGate("grounded", UNGROUNDED_TAG, _grounded),
}


def added_checks() -> list[AddedCheck]:
    """The registry's added checks, in order."""
    return [c for c in CHECKS.values() if isinstance(c, AddedCheck)]


def answer_forms() -> list[AnswerForm]:
    """The registry's answer forms, in order."""
    return [c for c in CHECKS.values() if isinstance(c, AnswerForm)]


def gates() -> list[ConfidenceGate]:
    """The registry's confidence gates, in order."""
    return [c for c in CHECKS.values() if isinstance(c, ConfidenceGate)]
