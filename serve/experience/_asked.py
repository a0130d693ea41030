"""What the question asks for, as checks on the answer's form: its unit, a percent, a mean.

A check can pass and still answer another question than the one asked: every check of a trace
recomputes its own formula, so a wrong form (another unit, a difference given as a percentage, a
sum given as an average) passes them all. The question names the form; these rules read it.

* **the asked unit** (:func:`asked_unit_check`): a question ending in ``in <unit>?``, asking
  ``how many <unit>`` or ``convert ... to <unit>`` names the unit of its answer; a unit may be
  written with ``per`` and a count (``liters per 100 km`` is ``liters/(100 km)``). A question that
  converts a stated quantity (``Convert 90 km/h to m/s.``) is checked against that quantity. An
  answer with a unit ``u`` and number ``a`` must be that quantity in the asked unit ``w``: a
  ``unit_check`` of ``a u`` against ``a w`` (another dimension, or the same dimension with another
  magnitude, fails: ``unit_mismatch``). Answers without a unit, dimensionless units and words
  that are no unit are not checked.
* **a percent is a ratio** (:data:`PERCENT_FORM`): when the answer is a percentage (``%``, or the
  question asks "what percent(age)", "as a percentage" or for a "percentage increase / decrease /
  change"), a check computes it only when its expression has a division, a ``%`` or a factor 100.
* **a mean divides** (:data:`MEAN_FORM`): when the question asks for the average or mean of its
  numbers, a check computes the answer only when its expression divides.

The two forms are read by :func:`recallserve.serve.experience._computed.answer_computed` through
the registry (:mod:`recallserve.serve.experience.checks`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from recallserve.serve.experience._calculator import CalcError, extract_number
from recallserve.serve.experience._schema import ExperienceRecord, VerificationItem
from recallserve.serve.experience._units import parse_unit

__all__ = ["AnswerForm", "PERCENT_FORM", "MEAN_FORM", "ASKED", "asked_unit", "asked_unit_check", "is_percent", "is_ratio_expression", "asks_mean"]

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
    quantity as stated, in the asked unit, must be the answer. A formula with a divisor of unknown
    origin gets no extracted unit check (its dimension would be a guess), so only the question's
    own quantity can check such an answer's magnitude.
    """
    answer = record.outcome.answer_text or ""
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


@dataclass(frozen=True)
class AnswerForm:
    """A form of answer the question may ask for, and which expressions can compute it.

    Attributes:
        name: the registry's name of the rule.
        asked: ``(answer, question) -> bool``: whether the answer must have this form.
        computes: ``expression -> bool``: whether a check with this expression can compute it.
    """

    name: str
    asked: Callable[[str, str], bool]
    computes: Callable[[str], bool]


#: A percentage is a ratio: only an expression that divides, or has ``%`` or a factor 100, computes it.
PERCENT_FORM = AnswerForm("percent_is_ratio", is_percent, is_ratio_expression)
#: A mean is a quotient: only an expression that divides computes it.
MEAN_FORM = AnswerForm("mean_divides", lambda _answer, question: asks_mean(question), lambda expr: "/" in expr)
