"""Whether code computed a trace's answer: ``high`` confidence needs a passing check that did.

Checks can all pass and still be beside the answer (a recomputation of an intermediate value,
a bound, a formula that agrees with itself such as ``17 / 17 = 1``): :func:`answer_computed` asks
that one passing check's computed value be the answer itself (the registry's ``answer_computed``
gate, :mod:`recallserve.serve.experience.checks`; tag ``answer_not_computed``).

A question under a registered rule (it cites a rule id) is answered by that rule: only the rule,
run by a passing ``regulatory_check``, computes its answer. A formula the model wrote instead
agrees with itself and leaves the rule out (a flat 10% discount where the rule takes it only
from a threshold on), so it does not count.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from recallserve.serve.experience._asked import ASKED, AnswerForm
from recallserve.serve.experience._calculator import extract_number
from recallserve.serve.experience._compare import as_bool, compare_values
from recallserve.serve.experience._schema import VerificationItem

__all__ = ["answer_computed", "computed_values"]

_WITH_VALUES = re.compile(r"^with (.*?):")
_RULE_RAN = re.compile(r"^rule (\S+):")


def computed_values(v: VerificationItem) -> list[float | bool]:
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


def answer_computed(checked: Sequence[VerificationItem], answer: str | None, question: str = "",
                    rules: Sequence[str] = (), only: Sequence[bool | None] | None = None,
                    forms: Sequence[AnswerForm] = ()) -> bool | None:
    """Whether a passing check (the model's or an extracted one) computed the trace's answer.

    The answer's number ``a`` must be one computed value ``c`` up to rounding
    (:func:`compare_values` not ``fail``: ``|c - a| <= 1% max(|c|, |a|)``); a yes/no answer must
    be a rule's boolean result. ``None`` when the answer has neither (nothing to compare). Checks
    can all pass and still be beside the answer (a recomputation of an intermediate value, a
    bound): then the answer itself was never computed by code. ``forms``: the answer forms
    (:class:`~recallserve.serve.experience._asked.AnswerForm`) to respect: when a form is asked,
    only a check whose expression ``computes`` it counts (a difference does not compute a
    percentage). A percentage written with ``%`` is also computed as its fraction
    (``1,800 / 12,000 = 0.15`` for "15%").
    ``rules``: the registered rules the question cites; when there are any, only a passing
    ``regulatory_check`` of one of them computes the answer (see the module docstring).
    ``only``: one flag per check; when given, only the checks flagged ``True`` are read (the
    grounded passes of :func:`recallserve.serve.experience._grounded.ground`).
    """
    if answer is None:
        return None
    asked = [f for f in forms if f.asked(answer, question)]
    a = extract_number(answer)
    b = as_bool(answer) if a is None else None
    if a is None and b is None:
        return None
    # NOTE: "15%" is 0.15 as the calculator reads it; a check that computed 0.15 computed the answer.
    targets = [] if a is None else [a, a / 100] if "%" in answer else [a]
    for i, v in enumerate(checked):
        if only is not None and (i >= len(only) or only[i] is not True):
            continue
        expression = v.input.get("expression") if isinstance(v.input.get("expression"), str) else v.target
        if not all(f.computes(str(expression or "")) for f in asked):
            continue
        if rules:
            ran = _RULE_RAN.match(v.notes) if v.type == "regulatory_check" else None
            if ran is None or ran.group(1) not in rules:
                continue
        for c in computed_values(v):
            if isinstance(c, bool):
                if b is not None and c == b:
                    return True
            elif any(compare_values(c, t) != "fail" for t in targets):
                return True
    return False
