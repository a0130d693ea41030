"""Grounding: does the answer's formula use every quantity the problem states?

A formula can agree with itself and still ignore the problem: ``17 / 17 = 1`` for "Pens cost 3
each. How much do 17 pens cost?" passes its recomputation, its unit check and its around checks,
and leaves out the price. The grounding check (``grounding_check``, one of the extracted checks of
:mod:`recallserve.serve.experience._extract`, run by the same bounded verifier) says *doubtful* when a stated
quantity ``q`` is not accounted for; the trace then waits in review with the error tag
``ungrounded_quantity``. ``q`` is accounted for when, with ``F`` the numbers of the formula (its
literals and the values of the record's named quantities it uses), ``U`` those literals of ``F`` that
are not stated (values the model derived, or a factor such as 12 = 92 - 80; not 0 or 1, nor a constant of a
cited rule: ``0.02`` of LATE-1, or ``2`` in ``2%``), ``C`` the conversion
factors and ``tol`` the verifier's rounding tolerance (1%):

* **used**: ``q`` is in ``G`` (up to ``tol``), where ``G`` starts as ``F`` and the answer, and grows
  by every number of an intermediate step (a reasoning step or another check with its inputs:
  ``20 * 40 = 800``, ``SHIP-1 total=40 weight=2 = 7``) one of whose results (the numbers right
  after an ``=``; ``= 10%`` is also 0.10) is already in ``G``; at most as many rounds as there are steps;
* **as a percent**: ``q %`` appears as ``q / 100`` or ``1 +- q / 100`` (``0.15 * 240``, ``1.15 * 80``);
* **a compound** (``1 h 45 min``, stated as 1.75): as the whole, in its last unit (105) or by all
  its parts (``210 / (1 + 45 / 60)``), each as ``used`` or ``derived`` says;
* **in a condition**: ``q`` is a number of a step that compares (``64 < 100 so not free``: the
  branch the formula takes depends on it) or says why it does not matter (``the 8 kg weight does
  not matter``);
* **derived**: some ``u`` in ``U`` is one operation of ``q`` with a number ``x`` of ``F``, of the
  stated values, of the factors of ``C`` from 10 up or of a cited rule's expression (``500 * 0.06`` under
  ``balance*min(0.02*months, 0.10)``) (``u = q + x, q - x, x - q, q x, q / x, x / q``: ``22*40 + 1.5*22*6``
  for 46 hours, ``6 = 46 - 40``), or a sum of 2 to 4 stated values that include ``q``
  (``1440 / 6 * 3`` for the ratio 1:2:3).

Numbers that are not quantities are not asked for (:func:`not_quantities`): rule and item ids
(``OT-1``, ``rule 3``, ``#2``, ``order 77123``), list indexes (``1.`` or ``(2)`` at the start of a line),
ordinals (``2nd``), years (``in 2024``) and dates (``2024-03-05``, ``5 March``), and a unitless
``0`` or ``1`` (``a box``, ``一辆车``: adding or multiplying by it changes nothing).

Bounded: at most 32 stated values and 32 steps of at most 2000 characters are read (the schema's
and the verifier's operand limits), the sums run over the first :data:`MAX_SUM_TERMS` values.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence

from recallserve.serve.experience._calculator import extract_number

__all__ = ["ungrounded", "not_quantities", "not_quantity_spans", "cited_rules", "RULE_ID", "numbers_in", "TAG", "CHECK",
           "MAX_SUM_TERMS", "TOLERANCE", "CONVERSION_FACTORS", "LITERAL", "NAME", "close", "literal_value"]

# NOTE: dimensionless factors of unit conversions and percentages, which a formula may use unstated.
CONVERSION_FACTORS = frozenset({1.0, 2.0, 7.0, 10.0, 12.0, 24.0, 60.0, 100.0, 365.0, 1000.0, 3600.0, 86400.0, 1e6})

CHECK = "grounding_check"
TAG = "ungrounded_quantity"
# NOTE: the verifier's rounding tolerance (_compare._REL_DOUBT): a step rounded to 2-3 digits still uses its inputs.
TOLERANCE = 0.01
# NOTE: sums of 2..4 of the first 12 stated values: at most C(12,2)+C(12,3)+C(12,4) = 781 sums.
MAX_SUM_TERMS = 12
_MAX_ITEMS = 32
_MAX_CHARS = 2000
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\d])")
# NOTE: a formula's number literals and names, as the extracted checks read them (shared with _extract).
# NOTE: a literal's thousands separators are read as the calculator reads them (a comma after a
# digit and before exactly three digits is dropped: ``1,200`` is 1200, as in normalise_expression):
# read as ``1`` and ``200``, a perturbed ``1`` of ``2% of 1,200`` lands inside an argument list
# (``min(2% of (0.99),200, ...)``) and the around check passes whatever the answer.
LITERAL = re.compile(r"(?<![\w.])\d+(?:,\d{3}(?!\d))*(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?![\w(])")
_COMPARES = re.compile(r"[<>≤≥]|\b(?:less|more|greater|fewer|at least|at most|below|above|exceeds?|under|over|"
                       r"regardless|irrelevant|does not matter|doesn't matter|not needed)\b", re.I)
_RESULT = re.compile(r"(?<![<>=!])=(?!=)\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?)(\s*%)?")
_MONTHS = ("jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec|january|february|march|april|june|july|august|"
           "september|october|november|december")
_NON_QUANTITY = [
    re.compile(r"(?<![\w-])[A-Za-z]+-(\d+)\b"),  # rule / product ids: OT-1, SHIP-1
    re.compile(r"\b(?:rule|step|item|section|article|clause|no\.?|number|question|problem|case|part|chapter|"
               r"table|figure|fig\.?|option|line|page|room|version|v|order|invoice|account|id|ticket|flight|serial|code)"
               r"\s*(?:no\.?|number)?\s*#?\s*(\d+)\b", re.I),
    re.compile(r"#\s*(\d+)\b"),
    re.compile(r"^\s*\(?(\d+)[.)](?=\s)", re.M),  # list indexes: "1. ...", "2) ...", "(3) ..."
    re.compile(r"\b(\d+)(?:st|nd|rd|th)\b", re.I),  # ordinals
    re.compile(r"\b(?:in|since|year|until|before|after|from|by|during)\s+((?:19|20)\d\d)\b", re.I),  # years
    re.compile(rf"\b(\d{{1,2}})\s+(?:{_MONTHS})\b", re.I),  # 5 March
    re.compile(rf"\b(?:{_MONTHS})\.?\s+(\d{{1,2}})\b", re.I),  # March 5
    re.compile(rf"\b(?:{_MONTHS})\.?\s+(?:\d{{1,2}},?\s+)?((?:19|20)\d\d)\b", re.I),  # March 2024
]
_DATE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b|\b(\d{1,2})/(\d{1,2})/(\d{2,4})\b")
# NOTE: a rule id as the rule table writes them (``OT-1``, ``SPEED-URBAN``, ``LATE-1``).
RULE_ID = re.compile(r"(?<![\w-])[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+(?![\w-])")


def cited_rules(text: str) -> list[str]:
    """The rule ids ``text`` cites, in order (no duplicates), at most 8 (the first 8000 characters)."""
    return list(dict.fromkeys(RULE_ID.findall(text[:8000])))[:8]


def literal_value(text: str) -> float:
    """The value of a :data:`LITERAL` match (``1,200`` -> 1200.0)."""
    return float(text.replace(",", ""))


def close(a: float, b: float) -> bool:
    """Equal up to rounding (1%, what ``_verify`` calls doubtful rather than wrong)."""
    return abs(a - b) <= max(1e-9, TOLERANCE * max(abs(a), abs(b)))


def _member(v: float, values: Iterable[float]) -> bool:
    return any(close(v, w) for w in values)


def not_quantity_spans(text: str) -> list[tuple[int, int, float]]:
    """Where ``text`` writes a number as an id, index, ordinal, year or date, not as a quantity:
    ``(start, end, value)`` of each such number (the ``1`` of ``LATE-1``, the ``2024`` of ``in 2024``)."""
    text = text[:8000]
    out: list[tuple[int, int, float]] = []
    for pat in _NON_QUANTITY:
        out += [(m.start(1), m.end(1), float(m.group(1))) for m in pat.finditer(text)]
    for m in _DATE.finditer(text):
        out += [(m.start(i), m.end(i), float(g)) for i, g in enumerate(m.groups(), start=1) if g is not None]
    return out


def not_quantities(text: str) -> set[float]:
    """Values written in ``text`` as ids, indexes, ordinals, years or dates, not as quantities."""
    return {v for _, _, v in not_quantity_spans(text)}


def numbers_in(text: str) -> list[float]:
    """The numbers of ``text`` (thousands separators removed), at most 64."""
    return [float(m.group(0)) for m in itertools.islice(_NUMBER.finditer(text[:_MAX_CHARS].replace(",", "")), 64)]


def _formula_numbers(formula: str, env: Mapping[str, float]) -> tuple[list[float], list[float], list[float]]:
    """The formula's literal values, the values of the named quantities it uses, and the fractions
    of its literals written as percents (``10%`` is also 0.10, as the calculator reads it)."""
    literals, fractions = [], []
    for m in LITERAL.finditer(formula):
        literals.append(literal_value(m.group(0)))
        if formula[m.end():m.end() + 8].lstrip().startswith("%"):
            fractions.append(literals[-1] / 100)
    names = [float(env[m.group(0)]) for m in NAME.finditer(formula) if m.group(0) in env]
    return literals, names, fractions


def _grown(start: list[float], steps: Sequence[str]) -> list[float]:
    """``start`` and every number of a step one of whose results is already in the set (fixed point)."""
    known = list(start)
    parsed = []
    for s in steps[:_MAX_ITEMS]:
        results: list[float] = []
        for m in _RESULT.finditer(s[:_MAX_CHARS]):
            r = extract_number(m.group(1).replace(",", ""))
            if r is not None:
                # NOTE: a result written as a percent is also its fraction, as the calculator reads
                # it: "5 months * 2% = 10%" gives the 0.10 of "1,200 * 0.10" (LATE-1 at its cap).
                results += [r, r / 100] if m.group(2) else [r]
        parsed.append((results, numbers_in(s)))
    # NOTE: a comparing step decides the branch the formula takes (or dismisses a number): its numbers are used.
    used = [bool(_COMPARES.search(s[:_MAX_CHARS])) for s in steps[:_MAX_ITEMS]]
    for flag, (_, numbers) in zip(used, parsed):
        if flag:
            known.extend(numbers)
    for _ in range(len(parsed)):
        grew = False
        for i, (results, numbers) in enumerate(parsed):
            if not used[i] and any(_member(r, known) for r in results):
                used[i], grew = True, True
                known.extend(numbers)
        if not grew:
            break
    return known


def _derived(q: float, unexplained: Sequence[float], others: Sequence[float]) -> bool:
    for u, x in itertools.product(unexplained, others):
        if close(x, u) or close(x, q):
            continue  # NOTE: u from itself (q - u = u) or q from itself (q / q = 1) grounds nothing
        forms = [q + x, q - x, x - q, q * x]
        if x != 0:
            forms.append(q / x)
        if q != 0:
            forms.append(x / q)
        if _member(u, forms):
            return True
    return False


def _in_a_sum(i: int, q: float, stated: Sequence[float], unexplained: Sequence[float]) -> bool:
    head = list(stated[:MAX_SUM_TERMS])
    if i >= len(head) or not unexplained:
        return False
    rest = head[:i] + head[i + 1:]
    for k in (1, 2, 3):
        for combo in itertools.combinations(rest, k):
            if _member(q + sum(combo), unexplained):
                return True
    return False


def ungrounded(formula: str, stated: Sequence[float], units: Sequence[str], steps: Sequence[str],
               env: Mapping[str, float], answer: float | None = None, rule_numbers: Sequence[float] = (),
               conversion_factors: Iterable[float] = CONVERSION_FACTORS, smallest: Sequence[float] = (),
               parts: Sequence[tuple[int, float]] = ()) -> list[float]:
    """The stated values ``formula`` does not account for (see the module docstring), in order.

    Args:
        formula: the answer's formula as written (its left side).
        stated: the quantities the cleaned context states that must be accounted for (the
            non-quantities already left out), at most 32 read.
        units: their units ('' or ``percent`` ...), parallel to ``stated``.
        steps: texts of the intermediate steps (reasoning steps, the record's other checks).
        env: values of the record's named quantities.
        answer: the trace's answer (the formula's value): a step that also gives it uses its inputs.
        rule_numbers: the numbers of the expressions of the rules the problem cites.
        conversion_factors: plain factors a formula may use unstated (1000, 3600, 100 ...).
        smallest: each stated value in the last unit of its compound (105 for 1 h 45 min; the value
            itself for a plain quantity), parallel to ``stated``.
        parts: ``(index in stated, value)`` of each part of a compound (1 and 45 of 1.75).
    """
    stated, units = list(stated[:_MAX_ITEMS]), list(units[:_MAX_ITEMS])
    factors = list(conversion_factors)
    literals, names, fractions = _formula_numbers(formula[:_MAX_CHARS], env)
    in_formula = literals + names
    # NOTE: 0 and 1 are no derived values (q / q, q - q); small factors (2, 7) make any half or week.
    # A constant of a cited rule, as written there or as a percent (0.02 as ``2%``), is given by the
    # rule, not derived from a stated value: counted as derived, a rule's ``2`` (of ``2%``) would
    # account for any stated quantity q with 2 q or q / 2 among the formula's numbers.
    given = [r for x in rule_numbers[:_MAX_ITEMS] for r in ((x, x * 100) if 0 < abs(x) < 1 else (x,))]
    unexplained = [v for v in literals if not _member(v, stated) and v not in (0.0, 1.0) and not _member(v, given)]
    factors = [f for f in factors if f >= 10]
    # NOTE: a percent literal's fraction grounds a step that gives it ("= 0.10" for "10%"), and
    # derives nothing (it is no operand of the derived forms below).
    grounded = _grown(in_formula + fractions + ([answer] if answer is not None else []), steps)
    others = in_formula + stated + factors + list(rule_numbers[:_MAX_ITEMS])
    out = []
    for i, q in enumerate(stated):
        forms = [q]
        if i < len(units) and units[i] == "percent":
            forms += [q / 100, 1 + q / 100, 1 - q / 100]
        whole = [q] + ([smallest[i]] if i < len(smallest) and smallest[i] != q else [])
        pieces = [v for j, v in parts[:_MAX_ITEMS] if j == i]
        if any(_member(f, grounded) for f in forms + whole[1:]):
            continue
        # NOTE: the smallest unit's value only as used: derived, 105 - 60 would "ground" a 45 h.
        if _derived(q, unexplained, others) or _in_a_sum(i, q, stated, unexplained):
            continue
        if pieces and all(_member(p, grounded) or _derived(p, unexplained, others) for p in pieces):
            continue
        out.append(q)
    return out
