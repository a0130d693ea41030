"""Checks derived from the problem itself: the quantities of the cleaned context, recomputed at
and around their stated values, with their units.

The model's own checks can be beside the point (a recomputation of a number it invented), so
the numbers the problem states are turned into checks too (:func:`extracted_checks`). They are
ordinary :class:`VerificationItem` s, marked ``input.source = "context"``, and run by the same
bounded verifier as the model's (:func:`recallserve.serve.experience._verify.verify_record`). From the
trace's formula ``E`` (its first recomputation that claims the answer) and answer ``a``:

* **recompute at** (``recomputation``): ``E`` evaluated as written must give ``a``;
* **with units** (``unit_check``): every literal of ``E`` that is a stated quantity with a unit is
  given its unit (``120 / 1.5`` -> ``120 km / 1.5 h``) and the result must be the answer in the
  answer's unit (only its dimension when ``E`` also holds a conversion factor such as 1000 or 3600;
  no check when ``E`` holds a number of unknown origin or a stated number without a unit, which
  may be a count or carry its unit unsaid). The unit check cannot decide a formula with a number
  of unknown origin (any unit given to the others would make the dimension a guess), so such a
  formula is decided by grounding instead: its passes are ungrounded and verify nothing
  (:mod:`recallserve.serve.experience._grounded`), and the trace waits in review (``90 / 1.5`` for 90 km/h in m/s);
* **recompute around** (``boundary_test``, two per stated quantity ``q`` used in ``E``): the
  answer must lie within the values ``E`` takes with ``q`` at ``q (1 - d)``, ``q`` and
  ``q (1 + d)`` (``d = 1%``), widened by the verifier's rounding tolerance (1% of the answer):
  ``min(E(q-), E(q), E(q+)) <= a (1 + 1%)`` and ``max(...) >= a (1 - 1%)``. The answer of a
  correct formula is ``E(q)`` and always passes, however sensitive the problem is (a difference
  of near-equal terms, a ``ceil`` at a step, a rule at its threshold); an answer the problem's
  numbers do not give, even moved by their rounding, fails. The bounds are the answer's, the
  values are computed by the verifier. Such a failure always comes with a failed recompute-at
  (the answer is off ``E(q)`` by more than 1%), so it adds no error tag of its own
  (:func:`recallserve.serve.experience._verify.error_tags_for`); a pass of it next to a failed recompute-at
  says the answer is within what the inputs' rounding can give.

Only what can be recomputed is: no checks when ``E`` does not evaluate at the stated values (the
model's own check already fails and says why); a literal that equals two stated quantities of
different units gets no unit (which one is meant is a guess), so no unit check then.

:func:`problem_check_types` names the check types a problem exposes before any answer exists,
which is what the archive is asked about (error tags) when a trace is produced.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from recallserve.serve.experience._calculator import MAX_EXPR_CHARS, CalcError, evaluate, extract_number
from recallserve.serve.experience._clean import ContextQuantity, clean_context, extract_quantities
from recallserve.serve.experience._grounding import CHECK as GROUNDING_CHECK
from recallserve.serve.experience._grounding import (
    CONVERSION_FACTORS,
    LITERAL,
    NAME,
    cited_rules,
    close,
    literal_value,
    not_quantities,
    not_quantity_spans,
)
from recallserve.serve.experience._schema import ExperienceRecord, VerificationItem
from recallserve.serve.experience._units import parse_unit

__all__ = ["extracted_checks", "problem_check_types", "stated_quantities", "SOURCE", "DELTA", "ROUNDING", "MAX_AROUND", "CONVERSION_FACTORS"]

SOURCE = "context"
DELTA = 0.01
# NOTE: the verifier's rounding tolerance (_compare._REL_DOUBT): an answer rounded to 2-3
# significant digits is doubtful at recompute-at, so it must not be out of bounds around.
ROUNDING = 0.01
# NOTE: at most 4 quantities are moved (2 items each): with the two other items, 10 items, well
# inside the schema's 32 and the calculator budget (each item is one expression of at most
# MAX_EXPR_CHARS; a formula too long to appear three times in one gets no around checks).
MAX_AROUND = 4
_FUNCTIONS = frozenset({"sqrt", "abs", "min", "max", "round", "log", "log10", "exp", "floor", "ceil", "pi", "e"})
_EQ = re.compile(r"(?<![<>=!])=(?!=)|==")
_UNIT_OF_ANSWER = re.compile(r"^\s*[-+]?\$?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?\s*(.*?)\s*$")


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _formula(record: ExperienceRecord, answer: float) -> str | None:
    """The left side of the first recomputation that claims the answer (its stated result, or no
    result, which compares with the answer), if it is a usable expression. A recomputation of an
    intermediate value (``20 * 40 = 800`` on the way to 950) is not the formula of the answer."""
    for v in record.verification:
        if v.type != "recomputation":
            continue
        expr = v.input.get("expression") if isinstance(v.input.get("expression"), str) else v.target
        if not isinstance(expr, str) or not expr.strip():
            continue
        sides = _EQ.split(expr)
        claimed = v.expected if v.expected is not None else (sides[-1] if len(sides) > 1 else None)
        if claimed is not None:
            value = extract_number(claimed)
            if value is None or not close(value, answer):
                continue
        expr = sides[0].strip()
        if 0 < len(expr) <= MAX_EXPR_CHARS:
            return expr
    return None


@dataclass(frozen=True)
class _Use:
    """A place in the formula where a stated quantity is used: a literal or a quantity's name."""

    start: int
    end: int
    text: str
    value: float
    unit: str


def _known_unit(unit: str) -> str:
    try:
        parse_unit(unit)
    except (CalcError, TypeError, ValueError, ArithmeticError, RecursionError):
        return ""
    return unit


def _uses(expr: str, record: ExperienceRecord, quantities: Sequence[ContextQuantity]) -> list[_Use]:
    """Literals of ``expr`` equal to a stated quantity, and names of the record's quantities, in order.

    The unit is the one written in the problem after that number, else the one the record gives
    the named quantity (when the unit table knows it).
    """
    out = []
    for m in LITERAL.finditer(expr):
        value = literal_value(m.group(0))
        units = _units_of(value, quantities)
        if units is not None:
            out.append(_Use(m.start(), m.end(), m.group(0), value, _one(units)))
    named = {q.name: q for q in record.context.quantities if q.name.isidentifier()}
    for m in NAME.finditer(expr):
        nq = named.get(m.group(0))
        if nq is None:
            continue
        units = _units_of(nq.value, quantities) or set()
        stated = _one(units)
        unit = stated if stated else "" if len(units) > 1 else _known_unit(nq.unit)
        out.append(_Use(m.start(), m.end(), m.group(0), nq.value, unit))
    return sorted(out, key=lambda u: u.start)


def _units_of(value: float, quantities: Sequence[ContextQuantity]) -> set[str] | None:
    """The units the problem writes after ``value`` (None when it does not state the value); a
    compound quantity (``1 h 45 min``) is stated as a whole (1.75 h), in its last unit (105 min)
    and by part (1 h, 45 min)."""
    units = {u for q in quantities for v, u in q.readings() if _same(v, value)}
    return units or None


def _one(units: set[str]) -> str:
    """The unit of a stated value when the problem gives it one unit only, else '' ("2 h ... 2 km": a guess)."""
    return next(iter(units)) if len(units) == 1 else ""


def _all_accounted(expr: str, used: Sequence[_Use]) -> bool | None:
    """Whether every number and name of ``expr`` has a known unit: ``True`` when all are stated
    quantities with a unit, ``False`` when some are plain conversion factors
    (:data:`CONVERSION_FACTORS`, dimensionless), ``None`` when one is of unknown origin or a stated
    quantity without a unit: it could carry any unit ("Alice is 42 years old, Bob is 40": 40 is in
    years; "12 bottles": a count), so giving units to the others would make the dimension a guess."""
    if any(not u.unit for u in used):
        return None
    at = {u.start for u in used}
    factors = False
    for m in LITERAL.finditer(expr):
        if m.start() in at:
            continue
        if literal_value(m.group(0)) not in CONVERSION_FACTORS:
            return None
        factors = True
    if not all(m.start() in at or m.group(0) in _FUNCTIONS for m in NAME.finditer(expr)):
        return None
    return not factors


def _value_at(expr: str, record: ExperienceRecord) -> float | None:
    """``E`` at the stated values, or None when it does not evaluate to a finite number (then
    there is nothing to recompute). One expression of at most MAX_EXPR_CHARS, under the
    calculator's own step and size caps."""
    env = {q.name: q.value for q in record.context.quantities if q.name.isidentifier()}
    try:
        v = evaluate(expr, env)
    except (CalcError, TypeError, ValueError, ArithmeticError, RecursionError):
        # NOTE: the same failures run_check turns into a failed check; here: no extracted checks.
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _replace(expr: str, u: _Use, text: str) -> str:
    return f"{expr[: u.start]}{text}{expr[u.end:]}"


def extracted_checks(record: ExperienceRecord) -> list[VerificationItem]:
    """Checks derived from the record's cleaned context and its formula (see the module docstring).

    Empty when the trace gives no recomputation or its answer has no number: then there is
    nothing of the problem's to recompute. A formula that uses none of the stated quantities
    gets its grounding check only.
    """
    answer = record.outcome.answer_text
    a = extract_number(answer)
    expr = _formula(record, a) if a is not None else None
    if expr is None or a is None:
        return []
    quantities = stated_quantities(record.context.raw_text)
    used = _uses(expr, record, quantities)
    if _value_at(expr, record) is None:
        # NOTE: a formula that does not evaluate at the stated values cannot be recomputed; the
        # model's own recomputation of it already fails and says why (no second, extracted failure).
        return []
    grounding = _grounding_item(expr, record, quantities)
    if not used:
        # NOTE: a formula of none of the stated numbers: nothing to recompute around, but whether
        # it leaves the problem's quantities out is exactly the question.
        return [grounding] if grounding.input["stated"] else []
    src: dict[str, object] = {"source": SOURCE}
    checks = [VerificationItem(type="recomputation", target=expr, expected=a, input=src), grounding]
    m_unit = _UNIT_OF_ANSWER.match(answer)
    answer_unit = _known_unit(m_unit.group(1)) if m_unit and m_unit.group(1) else ""
    accounted = _all_accounted(expr, used)
    if answer_unit and any(u.unit for u in used) and accounted is not None:
        with_units = expr
        for u in reversed(used):  # NOTE: right to left, so earlier offsets stay valid
            if u.unit:
                with_units = _replace(with_units, u, f"({u.value:.12g} {u.unit})")
        # NOTE: with a conversion factor in E (2000 W * 0.5 h / 1000 -> kWh) the units already
        # convert, so only the dimension is compared; otherwise the magnitude in the answer's unit too.
        expected = f"{a:.12g} {answer_unit}" if accounted else answer_unit
        checks.append(VerificationItem(type="unit_check", target=with_units, expected=expected, input=src))
    tol = max(1e-9, ROUNDING * abs(a))
    for u in used[:MAX_AROUND]:
        values = ", ".join(_replace(expr, u, f"({u.value * (1 + sign * DELTA):.12g})") if sign else expr
                           for sign in (-1, 0, 1))
        if len(values) + 5 > MAX_EXPR_CHARS:
            continue  # NOTE: too long for one calculator expression: no around check of this quantity
        checks.append(VerificationItem(type="boundary_test", target=f"min({values})",
                                       input={**src, "strict": True, "max": a + tol}))
        checks.append(VerificationItem(type="boundary_test", target=f"max({values})",
                                       input={**src, "strict": True, "min": a - tol}))
    return checks


def stated_quantities(text: str) -> list[ContextQuantity]:
    """The quantities ``text`` states: those of its cleaned form (:func:`~._clean.extract_quantities`),
    less the numbers written as ids, indexes, years or dates (:func:`~._grounding.not_quantity_spans`).

    NOTE: by position, not by value: the ``1`` of ``LATE-1`` is no stated 1 (read as one, a
    formula's rule constant 1 was moved by the around checks and kept the unit check off), while a
    stated 1 elsewhere in the same text still is.
    """
    cleaned = clean_context(text, fold_case=False)
    spans = not_quantity_spans(cleaned)
    return [q for q in extract_quantities(cleaned) if not any(a <= q.start < b for a, b, _ in spans)]


def _grounding_item(expr: str, record: ExperienceRecord, quantities: Sequence[ContextQuantity]) -> VerificationItem:
    """The grounding check of ``expr`` (:mod:`recallserve.serve.experience._grounding`): the stated quantities
    that must be accounted for (not ids, indexes, years or dates; not a unitless 0 or 1) and the
    intermediate steps that may account for them (reasoning steps, the record's other checks as
    ``target inputs = expected``), at most 32 of each, each step cut to the schema's 1000 characters."""
    skip = not_quantities(record.context.raw_text)
    stated = [q for q in quantities if q.value not in skip and not (q.unit == "" and q.value in (0.0, 1.0))][:32]
    # NOTE: a compound (1 h 45 min) is accounted for as 1.75, as 105 or by its parts 1 and 45 together.
    compound = [(i, q) for i, q in enumerate(stated) if q.parts]
    steps = [s.text for s in record.reasoning]
    for v in record.verification:
        if v.input.get("source") == SOURCE:
            continue
        exp = v.input.get("expression") if isinstance(v.input.get("expression"), str) else v.target
        inputs = " ".join(f"{k}={x}" for k, x in v.input.items() if isinstance(x, (int, float)) and not isinstance(x, bool))
        step = f"{exp} {inputs}".strip()
        steps.append(f"{step} = {v.expected}" if isinstance(v.expected, (int, float, str)) and v.expected != "" else step)
    return VerificationItem(type=GROUNDING_CHECK, target=expr, input={
        "source": SOURCE, "stated": [q.value for q in stated], "units": [q.unit for q in stated],
        **({"smallest": [q.smallest if q.smallest is not None else q.value for q in stated],
            "parts": [p.value for _, q in compound for p in q.parts][:32],
            "part_of": [i for i, q in compound for _ in q.parts][:32]} if compound else {}),
        "steps": [s[:1000] for s in steps if s][:32], "rules": cited_rules(record.context.raw_text)})


def problem_check_types(question: str, *, rule_domain: bool = False, required: Sequence[str] = ()) -> list[str]:
    """Check types a problem exposes before it is answered: ``required`` (from injected experiences),
    ``recomputation`` and ``boundary_test`` when it states a number, ``unit_check`` when a number has
    a unit, ``regulatory_check`` when its domain has rules."""
    quantities = stated_quantities(question)
    out = list(required)
    wanted = []
    if quantities:
        wanted += ["recomputation", "boundary_test"]
    if any(q.unit for q in quantities):
        wanted.append("unit_check")
    if rule_domain:
        wanted.append("regulatory_check")
    return out + [t for t in wanted if t not in out]
