"""Verification templates executed by code, and the confidence they imply.

Each :class:`VerificationItem` type has a template that computes ``actual`` itself (safe
calculator, unit table, registered rule table) and sets ``status``:

* ``pass``: the computed value agrees with the expectation (relative error <= 1e-6);
* ``doubtful``: it agrees only up to rounding (<= 1%), or the item cannot be checked
  (no expectation, unknown rule, missing input);
* ``fail``: it disagrees, a dimension mismatches, a bound is violated or the item is malformed;
* ``not_run``: the item is no expression code can execute (prose such as ``15% is a
  percentage``, an unknown name such as ``10 mugs * 7.50 each``, an expected unit that is no
  unit): it says nothing of the answer either way (:class:`~._calculator.NotAnExpression`).

Confidence (:func:`derive_confidence`): any fail -> ``low``; any doubtful, or no executed check
passing -> ``medium``; every executed check passing (at least one) -> ``high``. A ``not_run``
check is left out: a model that writes one check in prose beside executed ones that pass is not
doubted for it, and a trace of prose checks only is never ``high`` (nothing verified it). Each
failure also gives an error tag (:func:`error_tags_for`), added to ``evaluation.error_tags``: the
archive is searched by them.

Bounded work: a record comes from a client (``POST /v1/experiences``) or a model, so its checks
are untrusted code-like input. Each operand is size-checked before it is read (text length,
container sizes, number magnitudes), each calculator step is capped (see
:mod:`recallserve.serve.experience._calculator`), and one :class:`WorkBudget` of steps and time covers the
whole record. A check that hits a cap fails with the cap as its ``notes``; once the budget is
spent the remaining checks fail unrun. Verification is synchronous and CPU-bound: async callers
run it in a worker process (:mod:`recallserve.serve.experience._pool`) so the event loop keeps serving and
keeps its GIL.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from recallserve.serve.experience._calculator import (
    DEFAULT_MAX_STEPS,
    DEFAULT_SECONDS,
    MAX_EXPR_CHARS,
    CalcError,
    LimitExceeded,
    NotAnExpression,
    WorkBudget,
    budget_scope,
    evaluate,
    extract_number,
)
from recallserve.serve.experience._compare import as_bool, compare_values
from recallserve.serve.experience._extract import SOURCE, extracted_checks
from recallserve.serve.experience._grounding import CHECK as GROUNDING_CHECK
from recallserve.serve.experience._grounding import cited_rules, numbers_in, ungrounded
from recallserve.serve.experience._rules import RuleError, RuleTable, constraint_rules
from recallserve.serve.experience._schema import Confidence, ExperienceRecord, VerificationItem, VerificationStatus
from recallserve.serve.experience._tags import ANSWER_TAG, ERROR_TAGS, UNCHECKABLE_TAG, error_tags_for, exposure_tags
from recallserve.serve.experience._units import DimensionError, Quantity, format_dims, parse_quantity, parse_unit, to_unit
from recallserve.serve.experience.checks import added_checks, answer_forms, gates

__all__ = ["run_check", "is_verdict", "verify_record", "finish_record", "with_extracted_checks", "derive_confidence",
           "compare_values", "error_tags_for", "exposure_tags", "ERROR_TAGS", "UNCHECKABLE_TAG",
           "ANSWER_TAG"]

_EQ_SPLIT = re.compile(r"(?<![<>=!])=(?!=)|==")
# NOTE: operand bounds, checked before any regex or parse reads them: text twice the calculator's
# expression limit (an expected value may carry a unit and words), 32 entries per container
# (the schema's list bound), two levels of nesting, numbers within the calculator's magnitude.
_MAX_OPERAND_CHARS = 2 * MAX_EXPR_CHARS
_MAX_ENTRIES = 32
_MAX_DEPTH = 2
_MAX_NUMBER = 1e300
_MAX_TAGS = 16


def derive_confidence(statuses: Iterable[VerificationStatus]) -> Confidence:
    """Confidence from check results: fail -> low; doubtful, or no check passing -> medium; else high.

    ``not_run`` checks (no expression code can execute) are left out: they neither doubt nor
    verify the answer. So ``high`` needs at least one executed check that passed and none that
    did not (review before reuse: something must have verified the trace).
    """
    s = [x for x in statuses if x != "not_run"]
    if "fail" in s:
        return "low"
    if not s or any(x != "pass" for x in s):
        return "medium"
    return "high"


def _value(x: Any, variables: Mapping[str, Any], *, loose: bool = False) -> float | bool | Quantity:
    """A number, bool or quantity from a literal, expression or quantity expression.

    ``loose`` allows reading the first number of free text (``"$950 per week"``), used for
    expectations only, never for the operand being checked.
    """
    if isinstance(x, bool):
        return x
    if isinstance(x, (int, float)):
        return float(x)
    if not isinstance(x, str) or not x.strip():
        raise CalcError("no value given")
    b = as_bool(x)
    if b is not None and not x.strip().isdigit():
        return b
    try:
        v = evaluate(x, variables)
        return v if isinstance(v, bool) else float(v)
    except LimitExceeded:
        raise  # NOTE: a capped expression is not read another way (its first number is not its value)
    except CalcError:
        pass
    try:
        q = parse_quantity(x, dict(variables))
        return q.value if q.dims == Quantity(0.0).dims else q
    except LimitExceeded:
        raise
    except CalcError:
        if loose:
            n = extract_number(x.replace("$", "").replace("€", ""))
            if n is not None:
                return n
        raise


def _compare_any(actual: float | bool | Quantity, expected: float | bool | Quantity) -> tuple[VerificationStatus, str]:
    if isinstance(actual, bool) or isinstance(expected, bool):
        ok = actual is expected or (isinstance(actual, bool) and isinstance(expected, bool) and actual == expected)
        return ("pass" if ok else "fail"), f"{actual} vs expected {expected}"
    if isinstance(actual, Quantity) or isinstance(expected, Quantity):
        qa, qe = Quantity.of(actual), Quantity.of(expected)
        if qa.dims != qe.dims:
            if qe.dims == Quantity(0.0).dims:
                return "doubtful", f"expected {expected} has no unit; computed {format_dims(qa.dims)}"
            return "fail", f"dimension {format_dims(qa.dims)} vs expected {format_dims(qe.dims)}"
        return compare_values(qa.value, qe.value), "compared in SI units"
    return compare_values(float(actual), float(expected)), f"{actual:g} vs expected {expected:g}"


def _show(v: float | bool | Quantity) -> Any:
    if isinstance(v, Quantity):
        return f"{v.value:g} {format_dims(v.dims)}"
    return v


def _recomputation(item: VerificationItem, env: Mapping[str, Any], answer: str | None) -> VerificationItem:
    expr = str(item.input.get("expression") or item.target)
    expected = item.expected
    if expected is None and _EQ_SPLIT.search(expr):
        expr, expected = (p.strip() for p in _EQ_SPLIT.split(expr)[-2:])
    if expected is None:
        expected = answer
    actual = _value(expr, env)
    if expected is None:
        return item.model_copy(update={"actual": _show(actual), "status": "doubtful", "notes": "nothing to compare with"})
    exp_val = _value(expected, env, loose=True)
    if isinstance(exp_val, Quantity) and not isinstance(actual, Quantity):
        # NOTE: "120 / 1.5 = 80 km/h": a unitless recomputation is compared with the number as written.
        written = extract_number(expected)
        exp_val = written if written is not None else exp_val
    status, note = _compare_any(actual, exp_val)
    if status != "pass" and isinstance(expected, str) and expected.strip().endswith("%"):
        # NOTE: "(9 / 25) * 100 = 36%": a percentage is also its number of percent as written (36),
        # not only the fraction the calculator reads (0.36); a formula that gives neither still fails.
        written = extract_number(expected)
        if written is not None and not isinstance(actual, (bool, Quantity)):
            alt = _compare_any(actual, written)
            if ("fail", "doubtful", "pass").index(alt[0]) > ("fail", "doubtful", "pass").index(status):
                status, note = alt
    return item.model_copy(update={"actual": _show(actual), "status": status, "notes": note})


def _unit_check(item: VerificationItem, env: Mapping[str, Any], answer: str | None) -> VerificationItem:
    expr = str(item.input.get("expression") or item.target)
    expected = item.expected if item.expected not in (None, "") else item.input.get("unit") or answer
    q = parse_quantity(expr, dict(env))
    if not isinstance(expected, str) or not expected.strip():
        return item.model_copy(update={"actual": _show(q), "status": "doubtful", "notes": "no expected unit"})
    exp_text = expected.strip()
    m = re.match(r"^\s*([-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(.*)$", exp_text)
    unit_text = (m.group(2) if m else exp_text).strip()
    if not unit_text:
        return item.model_copy(update={"actual": _show(q), "status": "doubtful", "notes": "expected has no unit"})
    try:
        unit = parse_unit(unit_text)
    except NotAnExpression as exc:
        # NOTE: "36% is a percentage", "12 in [0, 100]": no unit to check the quantity against.
        return item.model_copy(update={"actual": _show(q), "status": "not_run",
                                       "notes": f"not executable: expected unit: {exc}"})
    except CalcError as exc:
        return item.model_copy(update={"actual": _show(q), "status": "doubtful", "notes": f"expected unit: {exc}"})
    if unit.dims != q.dims:
        return item.model_copy(update={
            "actual": _show(q), "status": "fail",
            "notes": f"dimension {format_dims(q.dims)} does not match {unit_text} ({format_dims(unit.dims)})",
        })
    magnitude = to_unit(q, unit_text)
    actual = f"{magnitude:g} {unit_text}"
    if m is None:
        return item.model_copy(update={"actual": actual, "status": "pass", "notes": "dimensions match"})
    status = compare_values(magnitude, float(m.group(1).replace(",", "")))
    return item.model_copy(update={"actual": actual, "status": status, "notes": "dimensions match; magnitude compared"})


def _parse_assignments(x: Any) -> dict[str, float]:
    if isinstance(x, Mapping):
        out: dict[str, float] = {}
        for k, v in x.items():
            n = extract_number(v)
            if n is not None:
                out[str(k)] = n
        return out
    if isinstance(x, str):
        return {k: float(v.replace(",", "")) for k, v in re.findall(r"([A-Za-z_]\w*)\s*=\s*([-+]?\d[\d,]*(?:\.\d+)?)", x)}
    return {}


def _back_substitution(item: VerificationItem, env: Mapping[str, Any], answer: str | None) -> VerificationItem:
    equation = str(item.input.get("equation") or item.target)
    sides = _EQ_SPLIT.split(equation)
    if len(sides) != 2:
        raise NotAnExpression(f"equation {equation!r} must have exactly one '='")
    values = {k: v for k, v in _parse_assignments(item.input).items() if k != "equation"}
    values.update(_parse_assignments(item.expected))
    free = {n for n in re.findall(r"[A-Za-z_]\w*", equation) if n not in env and n not in values}
    free -= {"sqrt", "abs", "min", "max", "round", "log", "log10", "exp", "sin", "cos", "tan", "floor", "ceil", "pi", "e"}
    if len(free) == 1:
        guess = extract_number(item.expected) if item.expected is not None else extract_number(answer)
        if guess is not None:
            values[free.pop()] = guess
    scope = {**env, **values}
    lhs, rhs = _value(sides[0], scope), _value(sides[1], scope)
    status, note = _compare_any(lhs, rhs)
    shown = ", ".join(f"{k}={v:g}" for k, v in values.items())
    return item.model_copy(update={"actual": f"{_show(lhs)} = {_show(rhs)}", "status": status, "notes": f"with {shown}: {note}"})


_RANGE_PATTERNS = [
    (re.compile(r"^\s*([-+]?[\d.]+)\s*(<=?)\s*\w*\s*(<=?)\s*([-+]?[\d.]+)\s*$"), "chain"),
    (re.compile(r"^\s*[\[(]\s*([-+]?[\d.]+)\s*[,;]\s*([-+]?[\d.]+)\s*[\])]\s*$"), "interval"),
    (re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*\.\.\s*([-+]?\d+(?:\.\d+)?)\s*$"), "interval"),
    (re.compile(r"^\s*between\s+([-+]?[\d.]+)\s+and\s+([-+]?[\d.]+)\s*$", re.I), "interval"),
    (re.compile(r"^\s*\w*\s*(>=?|<=?)\s*([-+]?[\d.]+)\s*$"), "one"),
]


def _bounds(item: VerificationItem) -> tuple[float | None, float | None, bool]:
    lo, hi = item.input.get("min"), item.input.get("max")
    inclusive = bool(item.input.get("inclusive", True))
    if lo is None and hi is None and isinstance(item.expected, str):
        for pat, kind in _RANGE_PATTERNS:
            m = pat.match(item.expected)
            if not m:
                continue
            if kind == "chain":
                lo, hi, inclusive = m.group(1), m.group(4), m.group(2) == "<=" and m.group(3) == "<="
            elif kind == "interval":
                lo, hi = m.group(1), m.group(2)
            elif m.group(1).startswith(">"):
                lo, inclusive = m.group(2), m.group(1) == ">="
            else:
                hi, inclusive = m.group(2), m.group(1) == "<="
            break
    return (extract_number(lo) if lo is not None else None, extract_number(hi) if hi is not None else None, inclusive)


_BOUNDARY_KEYS = frozenset({"value", "strict", "inclusive", "source", "min", "max"})


def _boundary_value(item: VerificationItem, env: Mapping[str, Any]) -> VerificationItem:
    """The design's boundary test: the formula (``target``) at the boundary ``input`` gives ``expected``.

    ``{"type": "boundary_test", "target": "non_standard / total_fund", "input": {"non_standard": 0},
    "expected": {"ratio": 0.0}}``: the formula is evaluated with the stated quantities, the input's
    numbers replacing theirs, and compared with the one expected value. Without a formula (the
    design's example writes none) code has nothing to execute: not run, kept as stated.
    """
    assert isinstance(item.expected, Mapping)
    if len(item.expected) != 1:
        return item.model_copy(update={"status": "doubtful", "notes": "expected must name one value"})
    ((name, want),) = item.expected.items()
    formula = str(item.input.get("value") or item.target).strip()
    if not formula:
        return item.model_copy(update={"status": "not_run", "notes": "no formula (target) to evaluate at the boundary input"})
    at = {k: v for k, v in item.input.items()
          if k not in _BOUNDARY_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)}
    got = _value(formula, {**env, **at})
    exp_val = _value(want, env, loose=True)
    status, note = _compare_any(got, exp_val)
    return item.model_copy(update={"actual": _show(got), "status": status, "notes": f"{str(name)[:64]} at {at}: {note}"[:1000]})


def _boundary_test(item: VerificationItem, env: Mapping[str, Any], answer: str | None) -> VerificationItem:
    if isinstance(item.expected, Mapping) and item.input.get("min") is None and item.input.get("max") is None:
        return _boundary_value(item, env)
    raw = item.input.get("value", item.target) or answer
    # NOTE: "strict" (the extracted checks): the value must evaluate; never its first number.
    v = _value(raw, env, loose=not item.input.get("strict"))
    if isinstance(v, Quantity):
        v = v.value  # NOTE: bounds of a dimensioned value are given in SI units.
    if isinstance(v, bool):
        raise CalcError("a boundary test needs a number, not a comparison")
    lo, hi, inclusive = _bounds(item)
    if lo is None and hi is None:
        return item.model_copy(update={"actual": v, "status": "doubtful", "notes": "no bounds given"})
    ok_lo = lo is None or (v >= lo if inclusive else v > lo)
    ok_hi = hi is None or (v <= hi if inclusive else v < hi)
    status: VerificationStatus = "pass" if ok_lo and ok_hi else "fail"
    return item.model_copy(update={"actual": v, "status": status, "notes": f"bounds [{lo}, {hi}] inclusive={inclusive}"})


def _regulatory_check(
    item: VerificationItem, env: Mapping[str, Any], answer: str | None, rules: RuleTable
) -> VerificationItem:
    rule_ref = str(item.input.get("rule") or item.target)
    rule = rules.get(rule_ref) if rule_ref in rules else rules.find_in(rule_ref)
    if rule is None:
        return item.model_copy(update={"status": "doubtful", "notes": f"rule {rule_ref!r} is not registered"})
    inputs = {**env, **{k: v for k, v in item.input.items() if k != "rule"}}
    try:
        result = rules.evaluate(rule.id, inputs)
    except RuleError as exc:
        return item.model_copy(update={"status": "doubtful", "notes": str(exc)})
    expected = item.expected if item.expected not in (None, "") else (True if isinstance(result, bool) else answer)
    if expected is None:
        return item.model_copy(update={"actual": result, "status": "doubtful", "notes": "nothing to compare with"})
    exp_val = as_bool(expected) if isinstance(result, bool) else _value(expected, env, loose=True)
    if exp_val is None:
        return item.model_copy(update={"actual": result, "status": "doubtful", "notes": f"expected {expected!r} unreadable"})
    status, note = _compare_any(result, exp_val)
    return item.model_copy(update={"actual": result, "status": status, "notes": f"rule {rule.id}: {note}"})


def _grounding_check(item: VerificationItem, env: Mapping[str, Any], answer: str | None,
                     rules: RuleTable) -> VerificationItem:
    stated, units, steps = item.input.get("stated", []), item.input.get("units", []), item.input.get("steps", [])
    cited = item.input.get("rules", [])
    if not isinstance(cited, list):
        raise CalcError("input.rules must be a list of rule ids")
    rule_numbers = [n for r in cited if isinstance(r, str) and r in rules for n in numbers_in(rules.get(r).expression)]
    if not isinstance(stated, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in stated):
        raise CalcError("input.stated must be a list of numbers")
    if not isinstance(units, list) or not isinstance(steps, list):
        raise CalcError("input.units and input.steps must be lists")
    smallest, parts, part_of = (item.input.get(k, []) for k in ("smallest", "parts", "part_of"))
    if not all(isinstance(x, list) and all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in x)
               for x in (smallest, parts, part_of)) or len(parts) != len(part_of):
        raise CalcError("input.smallest, input.parts and input.part_of must be lists of numbers, parts as long as part_of")
    names = {k: float(v) for k, v in env.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    missing = ungrounded(item.target, [float(x) for x in stated], [str(u) for u in units],
                         [s for s in steps if isinstance(s, str)], names,
                         extract_number(answer) if answer is not None else None, rule_numbers,
                         smallest=[float(x) for x in smallest],
                         parts=[(int(j), float(v)) for j, v in zip(part_of, parts, strict=True)])
    if missing:
        shown = ", ".join(f"{x:g}" for x in missing)
        return item.model_copy(update={"actual": missing, "status": "doubtful",
                                       "notes": f"stated but not used by the formula: {shown}"})
    return item.model_copy(update={"actual": [], "status": "pass", "notes": "every stated quantity is used"})


def _oversized(x: Any, where: str, depth: int = 0) -> str | None:
    """Why the operand ``x`` is too large to check, or None."""
    if isinstance(x, str):
        return f"{where} is longer than {_MAX_OPERAND_CHARS} characters" if len(x) > _MAX_OPERAND_CHARS else None
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        if isinstance(x, float) and not math.isfinite(x):
            return f"{where} is not a finite number"
        return f"{where} is larger than {_MAX_NUMBER:g} in magnitude" if abs(x) > _MAX_NUMBER else None
    if isinstance(x, (Mapping, list, tuple)):
        if depth >= _MAX_DEPTH or len(x) > _MAX_ENTRIES:
            return f"{where} has more than {_MAX_ENTRIES} entries or {_MAX_DEPTH} levels"
        pairs = x.items() if isinstance(x, Mapping) else enumerate(x)
        for k, v in pairs:
            why = _oversized(str(k), f"{where} key", depth + 1) or _oversized(v, f"{where}[{str(k)[:32]!r}]", depth + 1)
            if why:
                return why
    return None


def run_check(
    item: VerificationItem,
    rules: RuleTable,
    *,
    variables: Mapping[str, Any] | None = None,
    answer: str | None = None,
) -> VerificationItem:
    """Execute one verification template; returns a copy with ``actual``, ``status``, ``notes``.

    Args:
        item: The check as written (its ``actual``/``status`` are ignored).
        rules: Rule table for ``regulatory_check``.
        variables: Named quantities of the problem (usable in expressions).
        answer: The trace's answer, used when an item states no expectation.
    """
    env = dict(variables or {})
    why = _oversized(item.target, "target") or _oversized(item.expected, "expected") or _oversized(item.input, "input")
    if why:
        return item.model_copy(update={"actual": None, "status": "fail", "notes": f"not run: {why}"})
    try:
        if item.type == "recomputation":
            return _recomputation(item, env, answer)
        if item.type == "unit_check":
            return _unit_check(item, env, answer)
        if item.type == "back_substitution":
            return _back_substitution(item, env, answer)
        if item.type == "boundary_test":
            return _boundary_test(item, env, answer)
        if item.type == GROUNDING_CHECK:
            return _grounding_check(item, env, answer, rules)
        return _regulatory_check(item, env, answer, rules)
    except DimensionError as exc:
        return item.model_copy(update={"actual": None, "status": "fail", "notes": f"dimension error: {exc}"})
    except NotAnExpression as exc:
        # NOTE: prose, an unknown name, a construct outside the whitelist: not run, which is no
        # evidence of a mistake (no error tag) nor of a right answer (derive_confidence skips it).
        # A cap (LimitExceeded) or a malformed operand is not this: those fail below.
        return item.model_copy(update={"actual": None, "status": "not_run", "notes": f"not executable: {exc}"})
    except (CalcError, TypeError, ValueError, ArithmeticError, RecursionError) as exc:
        # NOTE: ArithmeticError: e.g. float() of a 4000-digit JSON integer; RecursionError: a
        # pathological nesting the size checks let through. Both are the record's fault, not a 500.
        return item.model_copy(update={"actual": None, "status": "fail", "notes": f"cannot execute: {exc}"})


def _run_within(budget: WorkBudget, item: VerificationItem, rules: RuleTable, env: Mapping[str, Any],
                answer: str | None) -> VerificationItem:
    """One check on the record's budget; fails unrun (or fails) once the budget is spent."""
    if budget.spent:
        return item.model_copy(update={"actual": None, "status": "fail", "notes": f"not run: {budget.reason()}"})
    out = run_check(item, rules, variables=env, answer=answer)
    if budget.spent:
        # NOTE: a fallback inside the check (e.g. reading the first number of the text) may have
        # swallowed the BudgetExceeded; a check cut short must not pass.
        return out.model_copy(update={"status": "fail", "notes": f"cannot execute: {budget.reason()}"})
    return out.model_copy(update={"verified": is_verdict(out)})


def is_verdict(item: VerificationItem) -> bool:
    """Whether code reached a verdict on the check: ``pass`` or ``fail`` by executing it.

    ``doubtful`` (an unregistered rule, nothing to compare with, no bounds) and ``not_run`` (prose)
    are not verdicts: the check stays unverified and its author's result is kept as stated
    (``VerificationItem.stated``). A check failed unrun (over the budget or the size bounds) is a
    verdict on the record, not on the check: unverified too.
    """
    return item.status in ("pass", "fail") and not item.notes.startswith("not run")


def verify_record(
    record: ExperienceRecord, rules: RuleTable, *, required: Sequence[str] = (),
    max_steps: int = DEFAULT_MAX_STEPS, seconds: float = DEFAULT_SECONDS, extract: bool = False,
) -> ExperienceRecord:
    """Run every check of ``record`` within one work budget and derive its confidence.

    Args:
        record: The trace; the model's stated confidence is kept in ``stated_confidence``.
        rules: Registered rule table.
        required: Check types the injected experiences require; a missing one is added as a
            ``doubtful`` item so the confidence cannot be ``high`` without it.
        max_steps: calculator steps for the whole record (see :class:`WorkBudget`).
        seconds: wall-clock budget for the whole record, counted from this call (so time spent
            queueing for a worker thread is not charged to the record).
        extract: also run the checks derived from the cleaned context's quantities
            (:func:`recallserve.serve.experience._extract.extracted_checks`), on the same budget, appended
            after the record's own checks (those of an earlier verification are replaced).
    """
    if extract:
        record = with_extracted_checks(record)
    env = {q.name: q.value for q in record.context.quantities if q.name.isidentifier()}
    # NOTE: the record's structured constraints ({regulation, threshold, quantity}) are rules code
    # can evaluate on the stated quantities; a registered rule of the same id wins.
    own_rules = [r for r in constraint_rules(record.context.constraints, env) if r.id not in rules]
    rules = rules.extended(own_rules)
    with budget_scope(WorkBudget(max_steps, seconds)) as budget:
        checked = [_run_within(budget, v, rules, env, record.outcome.answer_text)
                   for v in record.verification[:_MAX_ENTRIES]]
    # NOTE: a rule the context states as a structured constraint is cited by the context itself.
    cited = [rules.get(r).id for r in cited_rules(record.context.raw_text) if r in rules]
    cited += [r.id for r in own_rules if r.id not in cited]
    return finish_record(record, checked, required, cited, rules)


def with_extracted_checks(record: ExperienceRecord) -> ExperienceRecord:
    """``record`` with the checks derived from its cleaned context's quantities appended after its
    own (:func:`recallserve.serve.experience._extract.extracted_checks`; those of an earlier verification are
    replaced), at most 32 in all: the record's own are cut first, so the extracted checks always run.
    Not yet run: :func:`verify_record` runs them with the others."""
    own = [v for v in record.verification if v.input.get("source") != SOURCE]
    extra = extracted_checks(record.model_copy(update={"verification": own}))
    asked = [item for check in added_checks() if (item := check.make(record)) is not None]
    extra[:0] = asked  # NOTE: first, so the cut below never drops them
    # NOTE: the schema holds 32 checks; the record's own come first, then the extracted ones, and
    # the extracted ones keep their room: a reply that fills all 32 slots with its own checks
    # would otherwise skip the grounding and recompute checks code derives from the problem.
    extra = extra[:_MAX_ENTRIES]
    return record.model_copy(update={"verification": own[: _MAX_ENTRIES - len(extra)] + extra})


def finish_record(record: ExperienceRecord, checked: list[VerificationItem], required: Sequence[str] = (),
                  cited: Sequence[str] = (), rules: RuleTable | None = None) -> ExperienceRecord:
    """``record`` with ``checked`` as its checks, the missing ``required`` types added, its confidence
    and the error tags of its failures.

    Shared by :func:`verify_record` and the worker pool's failure path, so a record that could not
    be verified is shaped exactly like one that was. ``high`` needs, besides every check passing,
    a passing check that computed the answer (:func:`recallserve.serve.experience._computed.answer_computed`); else ``medium`` with the
    tag :data:`ANSWER_TAG`. ``cited``: the registered rules the context cites, whose check alone
    computes the answer then. And the check that computed it must be grounded in the context's
    quantities (:mod:`recallserve.serve.experience._grounded`: no number of unknown origin, ``rules`` gives the
    cited rules' constants); else ``medium`` with the tag ``ungrounded_check``. Both conditions are
    the confidence gates of the registry (:mod:`recallserve.serve.experience.checks`).
    """
    # NOTE: a required type must be among the model's own checks; an extracted one does not count.
    present = {v.type for v in checked if v.input.get("source") != SOURCE}
    for typ in required:
        if typ not in present and len(checked) < _MAX_ENTRIES:
            checked.append(VerificationItem(
                type=typ, status="doubtful", notes="required by the injected experiences but missing",  # type: ignore[arg-type]
            ))
            present.add(typ)  # type: ignore[arg-type]
    stated = record.outcome.stated_confidence
    if stated is None and "confidence" in record.outcome.model_fields_set:
        stated = record.outcome.confidence
    confidence = derive_confidence(v.status for v in checked)
    new_tags = error_tags_for(checked)
    forms = answer_forms()
    for gate in gates():
        verdict = gate.judge(record, checked, cited, rules, forms)
        checked = verdict.checked
        if confidence == "high" and not verdict.holds:
            # NOTE: high confidence means code computed the answer from the problem's numbers,
            # not only that every check agreed with itself (see recallserve.serve.experience.checks).
            confidence = "medium"
            new_tags.append(gate.tag)
    outcome = record.outcome.model_copy(update={"confidence": confidence, "stated_confidence": stated})
    # NOTE: the failures' tags join the tags already on the record (a client's or a reviewer's).
    tags = list(record.evaluation.error_tags)
    tags += [t for t in new_tags if t not in tags]
    evaluation = record.evaluation.model_copy(update={"error_tags": tags[:_MAX_TAGS]})
    return record.model_copy(update={"verification": checked, "outcome": outcome, "evaluation": evaluation})
