"""Whether code computed a trace's answer: ``high`` confidence needs a passing check that did.

Checks can all pass and still be beside the answer (a recomputation of an intermediate value,
a bound, the model's ``17 / 17 = 1`` that agrees with itself): :func:`answer_computed` asks that
one passing check's computed value be the answer itself (see
:func:`serve.experience._verify.finish_record`, tag ``answer_not_computed``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from serve.experience._asked import ASKED, is_percent, is_ratio_expression
from serve.experience._calculator import extract_number
from serve.experience._schema import VerificationItem
from serve.experience._verify import _as_bool, compare_values

__all__ = ["answer_computed"]

_WITH_VALUES = re.compile(r"^with (.*?):")


def _computed(v: VerificationItem) -> list[float | bool]:
    """The values a passing check computed from its own inputs: a recomputation's or a rule's
    result, a unit check's magnitude, the unknowns a back-substitution put in. A boundary test
    and a grounding check compute no answer (they test one)."""
    if v.status != "pass" or v.input.get(ASKED):
        return []  # NOTE: the asked-unit check restates the answer; it computes nothing
    if v.type == "back_substitution":
        m = _WITH_VALUES.match(v.notes)
        return [float(x) for x in re.findall(r"=\s*([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)", m.group(1))] if m else []
    if v.type not in ("recomputation", "unit_check", "regulatory_check"):
        return []
    if isinstance(v.actual, bool):
        return [v.actual]
    n = v.actual if isinstance(v.actual, (int, float)) else extract_number(v.actual) if isinstance(v.actual, str) else None
    return [float(n)] if n is not None else []


def answer_computed(checked: Sequence[VerificationItem], answer: str | None, question: str = "") -> bool | None:
    """Whether a passing check (the model's or an extracted one) computed the trace's answer.

    The answer's number ``a`` must be one computed value ``c`` up to rounding
    (:func:`compare_values` not ``fail``: ``|c - a| <= 1% max(|c|, |a|)``); a yes/no answer must
    be a rule's boolean result. ``None`` when the answer has neither (nothing to compare). Checks
    can all pass and still be beside the answer (a recomputation of an intermediate value, a
    bound): then the answer itself was never computed by code. A percentage (``question`` asks
    for one, or the answer has ``%``) is computed only by a check whose expression can give a
    ratio (:func:`serve.experience._asked.is_ratio_expression`): ``92 - 80 = 12`` does not compute "12%".
    """
    if answer is None:
        return None
    percent = is_percent(answer, question)
    a = extract_number(answer)
    b = _as_bool(answer) if a is None else None
    if a is None and b is None:
        return None
    for v in checked:
        expression = v.input.get("expression") if isinstance(v.input.get("expression"), str) else v.target
        if percent and not is_ratio_expression(str(expression or "")):
            continue
        for c in _computed(v):
            if isinstance(c, bool):
                if b is not None and c == b:
                    return True
            elif a is not None and compare_values(c, a) != "fail":
                return True
    return False
