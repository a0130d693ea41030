"""Key-fact scoring of an answer: does it state what it must, and nothing it must not?

A question of the demo sets (:mod:`recallserve.serve.agent.demo.questions`) lists ``facts``: each item is one
fact, given as a string or a list of acceptable alternatives (any one suffices); and ``must_not``:
strings none of which may appear. Matching is on normalised text (:func:`normalise`):

* lower case, Unicode dashes to ``-``, whitespace runs to one space;
* numbers written one way: thousands commas dropped (``1,818.96`` -> ``1818.96``), trailing
  decimal zeros dropped (``79.80`` -> ``79.8``, ``387.00`` -> ``387``);
* a fact that starts with a letter or digit must start a word (``12`` does not match in ``112``),
  one that ends with a digit must end one (``E12`` does not match ``E120``); one that ends with a
  letter may continue (``prim`` matches ``priming``);
* a fact written ``re:<pattern>`` is a regular expression searched in the normalised answer
  (used where the right value changes with the run, e.g. the current time).

An answer passes when every fact is found and no ``must_not`` string is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["FactScore", "Fact", "fact_label", "normalise", "score_answer"]

#: One key fact: a string, or acceptable alternatives.
Fact = str | list[str]

_DASHES = re.compile("[\u2010-\u2015\u2212]")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_TRAILING_ZEROS = re.compile(r"(\d)\.(\d*?)0+(?!\d)")
_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """``text`` in the form facts are matched on (see the module docstring)."""
    t = _DASHES.sub("-", text.lower())
    t = _THOUSANDS.sub("", t)
    t = _TRAILING_ZEROS.sub(lambda m: m.group(1) + ("." + m.group(2) if m.group(2) else ""), t)
    return _SPACE.sub(" ", t).strip()


def _found(alternative: str, answer: str) -> bool:
    """Whether one alternative occurs in the normalised ``answer``."""
    if alternative.startswith("re:"):
        return re.search(alternative[3:], answer, re.IGNORECASE) is not None
    needle = normalise(alternative)
    if not needle:
        return False
    # NOTE: a Chinese fact ("已发货") may follow an id directly ("订单104365已发货"): only a Latin or digit
    # start needs the boundary.
    head = r"(?<![a-z0-9])" if needle[0].isascii() and needle[0].isalnum() else ""
    tail = r"(?![0-9])(?!\.\d)" if needle[-1].isdigit() else ""
    return re.search(head + re.escape(needle) + tail, answer) is not None


def fact_label(fact: Fact) -> str:
    """A fact as one line (alternatives joined by ``|``)."""
    return fact if isinstance(fact, str) else " | ".join(fact)


@dataclass(frozen=True)
class FactScore:
    """The key-fact verdict of one answer."""

    passed: bool
    missing: list[str] = field(default_factory=list)
    forbidden: list[str] = field(default_factory=list)


def score_answer(answer: str, facts: Sequence[Fact], must_not: Sequence[str] = ()) -> FactScore:
    """Score ``answer``: every fact stated (one alternative each) and no ``must_not`` string.

    Example:
        >>> score_answer("Order 104208 was delivered by DPD.", ["delivered", ["DPD", "UPS"]]).passed
        True
        >>> score_answer("Refund: EUR 79.80", ["79.8"], ["cancelled"]).passed
        True
        >>> score_answer("It is 112 euros", ["12"]).missing
        ['12']
    """
    text = normalise(answer)
    missing = [fact_label(f) for f in facts
               if not any(_found(alt, text) for alt in ([f] if isinstance(f, str) else f))]
    forbidden = [s for s in must_not if _found(s, text)]
    return FactScore(passed=not missing and not forbidden, missing=missing, forbidden=forbidden)
