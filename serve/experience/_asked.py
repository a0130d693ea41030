"""What the question asks for, as checks on the answer's form: its unit, and a percent.

Found on `recallserve eval experiences` (24 problems, E-CoT on): three wrong traces reached the
active cache with every check passing. Two answered in another unit than the one asked
("0.2 km/min" for "the speed in km/h", "0.06 L/km" for "how many liters ... for 250 km"); their
formulas carried units, so no check was derived from the context's numbers. One answered a
percentage with a difference ("92 - 80 = 12" -> "12%"), which every check recomputed correctly.

* **the asked unit** (:func:`asked_unit_check`): a question ending in ``in <unit>?``, asking
  ``how many <unit>`` or ``convert ... to <unit>`` names the unit of its answer; a unit may be
  written with ``per`` and a count (``liters per 100 km`` is ``liters/(100 km)``). A question that
  converts a stated quantity (``Convert 90 km/h to m/s.``) is checked against that quantity. An answer with a unit ``u`` and number ``a``
  must be that quantity in the asked unit ``w``: a ``unit_check`` of ``a u`` against ``a w``
  (another dimension, or the same dimension with another magnitude, fails: ``unit_mismatch``).
  Answers without a unit, dimensionless units and words that are no unit are not checked.
* **a percent is a ratio** (:func:`is_percent`, used by :func:`recallserve.serve.experience._computed.answer_computed`): when the answer is a
  percentage (``%``, or the question asks "what percent(age)", "as a percentage" or for a
  "percentage increase / decrease / change"), a check computes it only when its expression has a
  division, a ``%`` or a factor 100.

* **a mean divides** (:func:`asks_mean`, also used by ``answer_computed``): when the question asks
  for the average or mean of its numbers, a check computes the answer only when its expression
  divides. With checks written in prose counted as not run, nothing else held back a sum given as
  the average (shipped a5: ``4 + 8 + 15 + 23 = 50`` for "the average of 4, 8, 15 and 23", every
  executed check passing); this rule was written after seeing that trace.

The three forms ``convert ... to``, ``per 100 km`` and "the percentage increase" were not read
before (held-out h7, h10, h2 of ``recallserve eval experiences``): their answers were not checked
against the form asked.
"""

from __future__ import annotations

import re

from recallserve.serve.experience._calculator import CalcError, extract_number
from recallserve.serve.experience._schema import ExperienceRecord, VerificationItem
from recallserve.serve.experience._units import parse_unit

__all__ = ["ASKED", "asked_unit", "asked_unit_check", "is_percent", "is_ratio_expression", "asks_mean"]

ASKED = "asked"
"""``input`` key of the asked-unit check: it tests the answer's form and computes no answer."""

_MAX_CHARS = 8000
_UNIT = r"[A-Za-z\u00b5\u00b0][\w/\u00b5\u00b0\u00b2\u00b3^*.-]*?"
# NOTE: "liters per 100 km", "km per hour": a unit, "per", an optional count and a unit word.
_UNIT_PHRASE = rf"{_UNIT}(?:\s+per\s+(?:\d+(?:\.\d+)?\s+)?[A-Za-z]\w*)?"
_IN_UNIT = re.compile(rf"\bin\s+({_UNIT_PHRASE})\s*\?")
_HOW_MANY = re.compile(r"\bhow\s+many\s+([A-Za-z]+)\b", re.IGNORECASE)
# NOTE: "Convert 15 m/s to km/h.": the unit after to/into, up to the end of the sentence.
_CONVERT = re.compile(rf"\bconvert\b[^?!]*?\b(?:to|into)\s+({_UNIT_PHRASE})\s*(?:[.?!,](?:\s|$)|$)", re.IGNORECASE)
# NOTE: "Convert 90 km/h to m/s": the stated quantity itself, whose value in the asked unit is the answer.
_CONVERTED = re.compile(rf"\bconvert\s+(\d[\d,]*(?:\.\d+)?)\s*({_UNIT_PHRASE})\s+(?:to|into)\s", re.IGNORECASE)
_PER_COUNT = re.compile(r"\s+per\s+(\d+(?:\.\d+)?)\s+([A-Za-z]\w*)\b")
_PER = re.compile(r"\s+per\s+")
_CHANGE = r"(?:increase|decrease|rise|drop|fall|change|growth|gain|loss|reduction|discount|markup|difference)"
_PERCENT_ASKED = re.compile(rf"\b(?:what|which)\s+percent(?:age)?\b|\bas\s+a\s+percent(?:age)?\b"
                            rf"|\bpercent(?:age)?\s+{_CHANGE}\b|\b{_CHANGE}\s+in\s+percent(?:age)?\b", re.IGNORECASE)
# NOTE: "the average of 4, 8 and 15", "what is their mean?"; not "average speed" (a quotient anyway).
_MEAN_ASKED = re.compile(r"\b(?:average|mean)\s+of\b|\b(?:their|its|the)\s+(?:average|mean)\s*\?", re.IGNORECASE)
_ANSWER = re.compile(r"^\s*[-+]?\$?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?\s*(.*?)\s*\.?\s*$")
_RATIO = re.compile(r"/|%|\b100\b|percent", re.IGNORECASE)


def _unit(text: str) -> str | None:
    """``text`` as a unit expression when it parses as a unit with a dimension, else None
    (``liters per 100 km`` -> ``liters/(100 km)``)."""
    text = _PER.sub("/", _PER_COUNT.sub(r"/(\1 \2)", text.strip()))
    try:
        unit = parse_unit(text)
    except (CalcError, TypeError, ValueError, ArithmeticError, RecursionError):
        return None
    return text if any(unit.dims) else None


def asked_unit(question: str) -> str | None:
    """The unit the question asks its answer in: the last ``in <unit>?``, else the last
    ``convert ... to <unit>``, else the last ``how many <unit>``; None when it names none (or a
    word that is not a unit)."""
    text = question[:_MAX_CHARS]
    for pattern in (_IN_UNIT, _CONVERT, _HOW_MANY):
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
    """The asked-unit ``unit_check`` of ``record`` (see the module docstring), not yet run.

    A conversion of a stated quantity ("Convert 90 km/h to m/s.") checks the magnitude too: the
    quantity as stated, in the asked unit, must be the answer. NOTE: found on the second held-out
    set (g3, E-CoT on): ``90 / 1.5 = 60`` copied from an injected experience, answered "60 m/s", passed
    every other check (1.5 is of unknown origin, so no extracted unit check).
    """
    answer = record.outcome.answer or ""
    asked = asked_unit(record.context.raw_text)
    given = answer_unit(answer) if asked else None
    a = extract_number(answer) if given else None
    if asked is None or given is None or a is None:
        return None
    target = f"{a:.12g} {given}"
    converted = _CONVERTED.search(record.context.raw_text[:_MAX_CHARS])
    if converted is not None and _unit(converted.group(2)) is not None:
        target = f"{converted.group(1).replace(',', '')} {_unit(converted.group(2))}"
    return VerificationItem(type="unit_check", target=target, expected=f"{a:.12g} {asked}",
                            input={"source": "context", ASKED: True})


def is_percent(answer: str | None, question: str) -> bool:
    """Whether the answer is a percentage: it has ``%``, or the question asks "what percent(age)"."""
    return bool(answer and "%" in answer) or bool(_PERCENT_ASKED.search(question[:_MAX_CHARS]))


def is_ratio_expression(expression: str) -> bool:
    """Whether ``expression`` can compute a percentage: it divides, or has ``%`` or a factor 100."""
    return bool(_RATIO.search(expression))


def asks_mean(question: str) -> bool:
    """Whether the question asks for the average (mean) of its numbers: then its answer is a quotient."""
    return bool(_MEAN_ASKED.search(question[:_MAX_CHARS]))
