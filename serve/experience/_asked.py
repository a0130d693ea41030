"""What the question asks for, as checks on the answer's form: its unit, and a percent.

Found on `recallserve eval experiences` (24 problems, E-CoT on): three wrong traces reached the
active cache with every check passing. Two answered in another unit than the one asked
("0.2 km/min" for "the speed in km/h", "0.06 L/km" for "how many liters ... for 250 km"); their
formulas carried units, so no check was derived from the context's numbers. One answered a
percentage with a difference ("92 - 80 = 12" -> "12%"), which every check recomputed correctly.

* **the asked unit** (:func:`asked_unit_check`): a question ending in ``in <unit>?`` or asking
  ``how many <unit>`` names the unit of its answer. An answer with a unit ``u`` and number ``a``
  must be that quantity in the asked unit ``w``: a ``unit_check`` of ``a u`` against ``a w``
  (another dimension, or the same dimension with another magnitude, fails: ``unit_mismatch``).
  Answers without a unit, dimensionless units and words that are no unit are not checked.
* **a percent is a ratio** (:func:`is_percent`, used by :func:`serve.experience._computed.answer_computed`): when the answer is a
  percentage (``%``, or the question asks "what percent(age)"), a check computes it only when its
  expression has a division, a ``%`` or a factor 100.
"""

from __future__ import annotations

import re

from serve.experience._calculator import CalcError, extract_number
from serve.experience._schema import ExperienceRecord, VerificationItem
from serve.experience._units import parse_unit

__all__ = ["ASKED", "asked_unit", "asked_unit_check", "is_percent", "is_ratio_expression"]

ASKED = "asked"
"""``input`` key of the asked-unit check: it tests the answer's form and computes no answer."""

_MAX_CHARS = 8000
_IN_UNIT = re.compile(r"\bin\s+([A-Za-z\u00b5\u00b0][\w/\u00b5\u00b0\u00b2\u00b3^*.-]*?)\s*\?")
_HOW_MANY = re.compile(r"\bhow\s+many\s+([A-Za-z]+)\b", re.IGNORECASE)
_PERCENT_ASKED = re.compile(r"\b(?:what|which)\s+percent(?:age)?\b|\bas\s+a\s+percent(?:age)?\b", re.IGNORECASE)
_ANSWER = re.compile(r"^\s*[-+]?\$?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?\s*(.*?)\s*\.?\s*$")
_RATIO = re.compile(r"/|%|\b100\b|percent", re.IGNORECASE)


def _unit(text: str) -> str | None:
    """``text`` when it parses as a unit with a dimension, else None."""
    try:
        unit = parse_unit(text)
    except (CalcError, TypeError, ValueError, ArithmeticError, RecursionError):
        return None
    return text if any(unit.dims) else None


def asked_unit(question: str) -> str | None:
    """The unit the question asks its answer in: the last ``in <unit>?``, else the last
    ``how many <unit>``; None when it names none (or a word that is not a unit)."""
    text = question[:_MAX_CHARS]
    for pattern in (_IN_UNIT, _HOW_MANY):
        found = [m.group(1) for m in pattern.finditer(text)]
        for word in reversed(found):
            unit = _unit(word)
            if unit is not None:
                return unit
    return None


def answer_unit(answer: str) -> str | None:
    """The unit written after the answer's number (``0.2 km/min`` -> ``km/min``), when it is one."""
    m = _ANSWER.match(answer[:200])
    return _unit(m.group(1)) if m and m.group(1) else None


def asked_unit_check(record: ExperienceRecord) -> VerificationItem | None:
    """The asked-unit ``unit_check`` of ``record`` (see the module docstring), not yet run."""
    answer = record.outcome.answer or ""
    asked = asked_unit(record.context.raw_text)
    given = answer_unit(answer) if asked else None
    a = extract_number(answer) if given else None
    if asked is None or given is None or a is None:
        return None
    return VerificationItem(type="unit_check", target=f"{a:.12g} {given}", expected=f"{a:.12g} {asked}",
                            input={"source": "context", ASKED: True})


def is_percent(answer: str | None, question: str) -> bool:
    """Whether the answer is a percentage: it has ``%``, or the question asks "what percent(age)"."""
    return bool(answer and "%" in answer) or bool(_PERCENT_ASKED.search(question[:_MAX_CHARS]))


def is_ratio_expression(expression: str) -> bool:
    """Whether ``expression`` can compute a percentage: it divides, or has ``%`` or a factor 100."""
    return bool(_RATIO.search(expression))
