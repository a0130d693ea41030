"""Grounded checks: a passing check verifies the answer only when its numbers come from the problem.

A check executed by code proves that its formula gives its result, not that the formula belongs
to the problem. Two kinds of pass say nothing of the problem:

* **the model's own equation**: for "3x + 7 = 25" a back-substitution of ``x = 6`` into ``3x = 18``
  passes; whether ``3x = 18`` follows from the problem no check asked (``3x = 32`` passes as well);
* **a number of unknown origin**: a divisor copied from an injected experience (``90 / 1.5`` for a
  km/h to m/s conversion) recomputes correctly; the extracted unit check stays off for such a
  formula (the unit of 1.5 is unknown, so any unit given to 90 would make the dimension a guess:
  :func:`recallserve.serve.experience._extract._all_accounted`).

Both are one rule here. With ``S`` the readings of the quantities the context states
(:func:`recallserve.serve.experience._extract.stated_quantities`: ids, indexes, years and dates are none; a
compound is its whole, its last unit and its parts; a percent ``p`` is also ``p / 100`` and
``1 +- p / 100``), ``K`` the constants a formula may use unstated (0, 1, the conversion factors
:data:`~._grounding.CONVERSION_FACTORS`, their reciprocals, 3.6 = 3600 / 1000 and its reciprocal,
and the numbers of a cited registered rule's expression), and ``C`` the values computed by
grounded passing checks (a recomputation's, unit check's or rule's result, a back-substitution's
unknowns), a passing ``recomputation``, ``unit_check``, ``back_substitution`` or
``regulatory_check`` is **grounded** when every number of the formula code evaluated (its
literals, exponents aside, and the values of the named quantities it uses) is in ``S u K u C``
up to the verifier's rounding tolerance (1%), and at least one is in ``S u C``. ``C`` grows by
rounds (at most one per check): ``50 * 1.2 = 60`` then ``60 * 0.9 = 54`` is grounded, ``3x = 18``
is not unless a grounded check computed 18 (``25 - 7 = 18``). The answer's own number is not in
``S`` (a check that feeds the answer in to make 18 would ground the answer by itself).

What a grounded pass is for (:func:`recallserve.serve.experience._verify.finish_record`): ``high`` confidence,
and so the active cache without a reviewer, needs the check that computed the answer
(:func:`recallserve.serve.experience._computed.answer_computed`) to be grounded; an ungrounded pass is kept
and recorded (its ``notes`` end with :data:`NOTE_PREFIX` and the numbers of unknown origin) and
the trace gets :data:`TAG` and waits in review. Boundary tests, grounding checks and the
asked-unit check compute no answer, so they are not judged here. The formula of a recomputation
is the side code evaluated (of ``A = B = C`` with no stated expectation, ``B``, as
:func:`recallserve.serve.experience._verify.run_check` does).

Not grounded though right, by this rule: a formula whose intermediate number only a reasoning
step derives (``1,800 / 12,000`` with ``13,800 - 12,000 = 1,800`` in the text): reasoning steps are
text, not executed, so such traces wait in review.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from recallserve.serve.experience._asked import ASKED, AnswerForm
from recallserve.serve.experience._calculator import CalcError
from recallserve.serve.experience._computed import answer_computed, computed_values
from recallserve.serve.experience._extract import stated_quantities
from recallserve.serve.experience._grounding import CONVERSION_FACTORS, NAME, RULE_ID, close, literal_value, numbers_in
from recallserve.serve.experience._rules import RuleTable
from recallserve.serve.experience._schema import ExperienceRecord, VerificationItem
from recallserve.serve.experience._units import Quantity, parse_unit

__all__ = ["ground", "ground_record", "verified_by_grounded", "grounded_numbers", "rule_numbers_of",
           "SAME_DIMENSION_UNITS", "COMPUTING", "TAG", "NOTE_PREFIX", "CONSTANTS"]

# NOTE: the check types that compute a value from their inputs; a boundary test or a grounding
# check tests a value, so it is never "the check that computed the answer".
COMPUTING = frozenset({"recomputation", "unit_check", "back_substitution", "regulatory_check"})
TAG = "ungrounded_check"
NOTE_PREFIX = "; not grounded: "
# NOTE: 3.6 is the km/h <-> m/s factor (3600 / 1000), written as such far more often than
# * 1000 / 3600; reciprocals because a formula may divide or multiply by a factor.
CONSTANTS = frozenset({0.0, *CONVERSION_FACTORS, *(1 / f for f in CONVERSION_FACTORS), 3.6, 1 / 3.6})
# NOTE: the units a stated quantity is also read in (same dimension, converted by code): the
# everyday units of time, length, mass, volume, speed, energy and power.
SAME_DIMENSION_UNITS = ("s", "min", "h", "day", "mm", "cm", "m", "km", "g", "kg", "t", "ml", "l",
                        "m/s", "km/h", "J", "Wh", "kWh", "W", "kW")
_EQ = re.compile(r"(?<![<>=!])=(?!=)|==")
# NOTE: an exponent (``m/s^2``, ``m**3``) is no quantity of the problem.
_EXPONENT = re.compile(r"(?:\^|\*\*)\s*-?\d+")
_MAX_CHARS = 2000
# NOTE: :data:`~._grounding.LITERAL` without its look-ahead: a coefficient written against its
# unknown or unit (``1.5x``, ``120km``) is a number of the formula too; missed, ``1.5x = 90``
# would look grounded by the 90 alone.
_LITERAL = re.compile(r"(?<![\w.])\d+(?:,\d{3}(?!\d))*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def grounded_numbers(stated: Iterable[tuple[float, str]]) -> list[float]:
    """``S`` of the module docstring from the stated readings ``(value, unit)``: each value; a
    percent's fraction and growth factors (35% -> 0.35, 1.35, 0.65); a value with a unit also in the
    other units of its dimension of :data:`SAME_DIMENSION_UNITS` (15 min -> 0.25 h, 900 s): code
    converts it, so a formula that writes the converted value is still tied to the problem."""
    out: list[float] = []
    for value, unit in stated:
        out.append(value)
        if unit in ("%", "percent"):
            out += [value / 100, 1 + value / 100, 1 - value / 100]
        elif unit:
            out += _converted(value, unit)
    return out


def _converted(value: float, unit: str) -> list[float]:
    try:
        q = parse_unit(unit)
    except (CalcError, TypeError, ValueError, ArithmeticError, RecursionError):
        return []
    out = []
    for w in SAME_DIMENSION_UNITS:
        u = _unit(w)
        if u is not None and u.dims == q.dims and u.value != q.value:
            out.append(value * q.value / u.value)
    return out


def _unit(text: str) -> Quantity | None:
    try:
        return parse_unit(text)
    except (CalcError, TypeError, ValueError, ArithmeticError, RecursionError):
        return None


def _formula(v: VerificationItem) -> str:
    """The text of the formula code evaluated for ``v`` (see the module docstring)."""
    if v.type == "regulatory_check":
        inputs = " ".join(str(x) for k, x in v.input.items() if k != "rule" and isinstance(x, (int, float, str))
                          and not isinstance(x, bool))
        return RULE_ID.sub(" ", f"{v.target} {inputs}")
    if v.type == "back_substitution":
        return str(v.input.get("equation") or v.target)
    expr = str(v.input.get("expression") or v.target)
    if v.type == "recomputation" and v.expected is None and _EQ.search(expr):
        return _EQ.split(expr)[-2]
    return expr


def _numbers(formula: str, env: Mapping[str, float], rule_vars: Sequence[str]) -> list[float]:
    """The numbers of ``formula``: its literals (exponents aside) and the values of the named
    quantities it uses; for a rule check that names none, the values of the rule's variables."""
    text = _EXPONENT.sub(" ", formula[:_MAX_CHARS])
    out = [literal_value(m.group(0)) for m in _LITERAL.finditer(text)]
    names = [m.group(0) for m in NAME.finditer(text) if m.group(0) in env]
    if not out and not names:
        names = [n for n in rule_vars if n in env]
    return out + [env[n] for n in names]


def _computed_values(v: VerificationItem) -> list[float]:
    return [float(c) for c in computed_values(v) if not isinstance(c, bool)]


def ground(checked: Sequence[VerificationItem], stated: Sequence[float], *,
           env: Mapping[str, float] | None = None, rule_numbers: Sequence[float] = (),
           rule_variables: Mapping[str, Sequence[str]] | None = None,
           ) -> tuple[list[VerificationItem], list[bool | None]]:
    """Judge each check: ``True`` a grounded computing pass, ``False`` an ungrounded one, ``None`` not
    judged (not passing, not computing, or the asked-unit check); the checks come back with each
    ungrounded pass's ``notes`` extended by :data:`NOTE_PREFIX` and its numbers of unknown origin
    (or "no stated quantity"). The status stays ``pass`` (the formula does give its result), so
    the pass rate still counts it.

    Args:
        checked: The executed checks, in order.
        stated: ``S`` (:func:`grounded_numbers`).
        env: The record's named quantities (name -> value); a name counts as its value.
        rule_numbers: The numbers of the cited registered rules' expressions (part of ``K``).
        rule_variables: Rule id -> its variables, for a rule check that writes no input.

    Example:
        >>> from recallserve.serve.experience._schema import VerificationItem as V
        >>> own = V(type="back_substitution", target="3x = 18", status="pass", notes="with x=6: ok")
        >>> ground([own], grounded_numbers([(3, ""), (7, ""), (25, "")]))[1]
        [False]
    """
    env, rule_variables = env or {}, rule_variables or {}
    constants = [*CONSTANTS, *rule_numbers]
    known = list(stated)
    judged = [v.status == "pass" and v.type in COMPUTING and not v.input.get(ASKED) for v in checked]
    numbers = []
    for v, j in zip(checked, judged, strict=True):
        rule = str(v.input.get("rule") or v.target)
        rule_vars = next((vs for r, vs in rule_variables.items() if r in rule), ()) if v.type == "regulatory_check" else ()
        numbers.append(_numbers(_formula(v), env, rule_vars) if j else [])

    def ok(n: float) -> bool:
        return any(close(n, k) for k in known) or any(close(n, k) for k in constants)

    flags: list[bool | None] = [False if j else None for j in judged]
    # NOTE: at most one round per check: each round either grounds one more check or stops.
    for _ in range(len(checked)):
        grew = False
        for i, v in enumerate(checked):
            nums = numbers[i]
            if flags[i] is False and nums and all(ok(n) for n in nums) and any(any(close(n, k) for k in known) for n in nums):
                flags[i] = True
                known += _computed_values(v)
                grew = True
        if not grew:
            break
    out = []
    for v, flag, nums in zip(checked, flags, numbers, strict=True):
        if flag is not False or NOTE_PREFIX in v.notes:
            out.append(v)
            continue
        unknown = list(dict.fromkeys(f"{n:g}" for n in nums if not ok(n)))
        why = f"{', '.join(unknown)} of unknown origin" if unknown else "no stated quantity"
        out.append(v.model_copy(update={"notes": f"{v.notes}{NOTE_PREFIX}{why}"[:1000]}))
    return out, flags


def rule_numbers_of(expressions: Iterable[str]) -> list[float]:
    """The numbers of the cited rules' expressions (``K``)."""
    return [n for e in expressions for n in numbers_in(e)]


def ground_record(record: ExperienceRecord, checked: Sequence[VerificationItem], rules: RuleTable | None,
                  cited: Sequence[str] = ()) -> tuple[list[VerificationItem], list[bool | None]]:
    """:func:`ground` for a record's executed checks: ``S`` from its context's raw text
    (:func:`recallserve.serve.experience._extract.stated_quantities`), the constants of the ``cited`` rules,
    the variables of every registered rule (for a rule check without inputs)."""
    stated = grounded_numbers(r for q in stated_quantities(record.context.raw_text) for r in q.readings())
    env = {q.name: q.value for q in record.context.quantities if q.name.isidentifier()}
    table = rules.rules() if rules is not None else []
    numbers = rule_numbers_of(r.expression for r in table if r.id in cited)
    return ground(checked, stated, env=env, rule_numbers=numbers, rule_variables={r.id: r.variables for r in table})


def verified_by_grounded(checked: Sequence[VerificationItem], flags: Sequence[bool | None], answer: str | None,
                         question: str, cited: Sequence[str] = (), forms: Sequence[AnswerForm] = ()) -> bool:
    """Whether a grounded pass verified the trace: one computed its answer
    (:func:`recallserve.serve.experience._computed.answer_computed` over the grounded passes only), or, for an
    answer with neither a number nor a yes/no, at least one pass is grounded."""
    computed = answer_computed(checked, answer, question, cited, only=flags, forms=forms)
    return computed if computed is not None else any(f is True for f in flags)
