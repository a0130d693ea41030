"""Error tags of executed checks: what a reviewer's label keeps and what the archive is searched by.

Split from :mod:`recallserve.serve.experience._verify` (which re-exports every name here): the mapping of a
failed check to its tag, and the tags a problem can expose before it is answered.
"""

from __future__ import annotations

from collections.abc import Iterable

from recallserve.serve.experience._grounding import CHECK as GROUNDING_CHECK
from recallserve.serve.experience._grounding import TAG as GROUNDING_TAG
from recallserve.serve.experience._schema import VerificationItem

__all__ = ["ERROR_TAGS", "UNCHECKABLE_TAG", "ANSWER_TAG", "error_tags_for", "exposure_tags"]

# NOTE: the error tag of a failed check, by check type: what a reviewer's label keeps and what the
# archival cache is searched by (``SearchRequest.error_tags``). A dimension error is a unit mistake
# whatever check found it; a check that could not be executed says nothing about the answer.
ERROR_TAGS: dict[str, str] = {
    "recomputation": "arithmetic_error",
    "unit_check": "unit_mismatch",
    "back_substitution": "equation_unsatisfied",
    "boundary_test": "out_of_bounds",
    "regulatory_check": "rule_violation",
    GROUNDING_CHECK: GROUNDING_TAG,
}
UNCHECKABLE_TAG = "check_not_executable"
# NOTE: every check passed, yet none computed the trace's answer (see answer_computed).
ANSWER_TAG = "answer_not_computed"


def error_tags_for(items: Iterable[VerificationItem]) -> list[str]:
    """Error tags of the failed checks, in order of first failure (no duplicates).

    ``fail`` with notes ``dimension ...`` -> ``unit_mismatch``; a unit check of the right dimension
    but the wrong magnitude -> ``arithmetic_error`` when a recomputation failed too, else
    ``unit_mismatch``; ``not run`` / ``cannot execute`` ->
    :data:`UNCHECKABLE_TAG`; else :data:`ERROR_TAGS` of the check type. Passing, doubtful and
    unrun checks give no tag (they are not evidence of a mistake), nor does a failed extracted
    around check next to a failed recomputation (the same evidence). The one doubtful check that
    does is a ``grounding_check``: a formula that leaves out a stated quantity -> ``ungrounded_quantity``.
    """
    items = list(items)
    arithmetic = any(v.type == "recomputation" and v.status == "fail" for v in items)
    out: list[str] = []
    for v in items:
        if v.type == GROUNDING_CHECK and v.status == "doubtful" and GROUNDING_TAG not in out:
            out.append(GROUNDING_TAG)
        if v.status != "fail":
            continue
        if v.type == "boundary_test" and v.input.get("source") == "context" and arithmetic:
            # NOTE: an extracted around check fails only when the answer is also off the formula
            # at the stated values (serve.experience._extract): the same evidence, one tag.
            continue
        if v.type == "unit_check" and v.notes.startswith("dimensions match"):
            # NOTE: the right dimension, the wrong magnitude: an arithmetic slip when a
            # recomputation failed too, else a number right in another unit (a conversion).
            tag = ERROR_TAGS["recomputation"] if arithmetic else ERROR_TAGS["unit_check"]
        elif v.notes.startswith("dimension"):
            tag = ERROR_TAGS["unit_check"]
        elif v.notes.startswith(("not run", "cannot execute")):
            tag = UNCHECKABLE_TAG
        else:
            tag = ERROR_TAGS[v.type]
        if tag not in out:
            out.append(tag)
    return out


def exposure_tags(check_types: Iterable[str]) -> list[str]:
    """The error tags a trace held to ``check_types`` can earn: the mistakes its problem exposes.

    Used before generation to ask the archive for lessons on exactly those mistakes.
    """
    out: list[str] = []
    for t in check_types:
        tag = ERROR_TAGS.get(t)
        if tag is not None and tag not in out:
            out.append(tag)
    return out
