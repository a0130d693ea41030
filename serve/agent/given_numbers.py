"""Given numbers: a tool argument may only use numbers that the conversation gives.

The evidence is the prompt of the turn (the user's messages, the recalled memories, the image
notes) plus every observation of the turn so far. A number ``v`` of an argument is grounded when

* ``v`` occurs in the evidence (compared as numbers: ``39.9`` matches ``39.90`` and ``1,299`` matches ``1299``),
* or ``v`` is a percentage form of an evidence number ``e``: ``v = e / 100``, ``v = 1 - e / 100`` or
  ``v = 1 + e / 100`` (``15%`` off written as ``0.15`` or ``0.85``),
* or ``v`` is one of :data:`FREE_NUMBERS` written as a whole number (``10``, not ``10.00``):
  counts and unit factors a question gives in words or not at all ("two kettles", "an average
  of three", "per hour"). A count has no decimals; ``10.00`` is an amount, and an amount must be given.

NOTE: a small model computes with numbers nobody gave (an amount it half-remembers, a discount
it assumes); the tool grammar cannot know which numbers are real, so this check refuses the call,
names the number that was not given, and the model calls again. A free number must be written as
a count (no decimals): an amount written ``10.00`` must be given, or a made-up amount passes as a
count.

Not the experience verifier's grounding (:mod:`recallserve.serve.experience._grounded`), which
judges a finished trace's checks; this one gates a tool call before it runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

__all__ = ["FREE_NUMBERS", "numbers_in", "ungrounded", "zh_number"]

#: Numbers allowed without evidence: small counts (written as words or implied by the question),
#: percent, and time and size factors.
FREE_NUMBERS: frozenset[float] = frozenset([*range(0, 13), 24, 30, 31, 52, 60, 100, 365, 1000])

# A number as people write it: thousands separators, a decimal point. Digits inside ids and dates
# are numbers too (harmless: they only widen what is allowed).
_NUM = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+")
_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30,
    "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100,
    "dozen": 12, "half": 2, "quarter": 4, "double": 2, "twice": 2, "triple": 3,
}
_FRACTIONS = {"half": 0.5, "quarter": 0.25}
_WORD = re.compile(r"\b(" + "|".join(_WORDS) + r")\b", re.IGNORECASE)
#: A Chinese discount: 八五折 / 8.5折 / 85折 = pay 85%, 九折 / 9折 = 90% (the percent it gives, so that
#: 0.85 and 0.15 are its percentage forms).
_ZH_DISCOUNT = re.compile(r"([一二三四五六七八九\d])(?:[.点]?([一二三四五六七八九\d]))?折")
_ZH_DIGITS = {c: i for i, c in enumerate("〇一二三四五六七八九")}
_ZH_DIGITS["两"] = _ZH_DIGITS["二"]
_ZH_DIGITS["零"] = 0
_ZH_UNITS = {"十": 10, "百": 100, "千": 1000}
#: A number in Chinese numerals (三, 十二, 一百五十, 两千, 三万), at most 8 characters.
_ZH_NUMBER = re.compile(r"[〇零一二两三四五六七八九十百千万]{1,8}")


def zh_number(text: str) -> int:
    """The value of Chinese numerals: digits times 十/百/千 summed, 万 scaling what comes before it.

    Example:
        >>> [zh_number(s) for s in ("三", "十二", "二十", "一百五十", "两千", "三万五千")]
        [3, 12, 20, 150, 2000, 35000]
    """
    total = section = digit = 0
    for ch in text:
        if ch in _ZH_DIGITS:
            digit = _ZH_DIGITS[ch]
        elif ch in _ZH_UNITS:
            section += (digit or 1) * _ZH_UNITS[ch]
            digit = 0
        elif ch == "万":
            total += (section + digit) * 10_000
            section = digit = 0
    return total + section + digit
#: An amount of money with its tenths: 三十九块九 / 39块9 / 12元5角 = 39.9 / 39.9 / 12.5.
_ZH_MONEY = re.compile(r"(\d+|[〇零一二两三四五六七八九十百千万]{1,8})\s*[块元]\s*([一二三四五六七八九\d])(?![\d十百千万])")
#: Digits scaled by a Chinese unit: 3万 = 30000, 1.5万 = 15000, 2千 = 2000.
_ZH_SCALED = re.compile(r"(\d+(?:\.\d+)?)\s*([万千百])")
_SCALE = {"万": 10_000, "千": 1_000, "百": 100}
#: Evidence is read up to this many characters (prompts are capped long before).
_MAX_CHARS = 200_000


def numbers_in(text: str) -> set[float]:
    """Every number written in ``text``, in digits or as a number word up to a hundred ("half" and
    "quarter" give both the divisor and the fraction: 2 and 0.5, 4 and 0.25), in Chinese numerals
    (三 -> 3, 两千 -> 2000), money with its tenths (三十九块九 -> 39.9), digits with a Chinese unit
    (3万 -> 30000), and a Chinese discount as its percent (八五折 -> 85).

    Example:
        >>> sorted(numbers_in("689欧元，打八五折")), sorted(numbers_in("打9折"))
        ([85.0, 689.0], [9.0, 90.0])
    """
    text = text[:_MAX_CHARS]
    out = {float(m.group(0).replace(",", "")) for m in _NUM.finditer(text)}
    for m in _WORD.finditer(text):
        word = m.group(1).lower()
        out.add(float(_WORDS[word]))
        if word in _FRACTIONS:  # NOTE: "half an hour" is 0.5 as well as "halve" (/ 2)
            out.add(_FRACTIONS[word])
    for m in _ZH_DISCOUNT.finditer(text):
        tens, ones = (int(_ZH_DIGITS.get(d, d)) if d else 0 for d in m.groups())
        out.add(float(tens * 10 + ones))
    for m in _ZH_MONEY.finditer(text):
        whole = m.group(1)
        out.add(float(whole if whole.isdigit() else zh_number(whole)) + int(_ZH_DIGITS.get(m.group(2), m.group(2))) / 10)
    for m in _ZH_SCALED.finditer(text):
        out.add(float(m.group(1)) * _SCALE[m.group(2)])
    for m in _ZH_NUMBER.finditer(text):
        if text[m.end():m.end() + 1] != "折":  # NOTE: a discount is read above (八五折 is 85, not a count)
            out.add(float(zh_number(m.group(0))))
    return out


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def ungrounded(value: str, evidence: Iterable[float]) -> list[str]:
    """The numbers of ``value`` (as written there) that the evidence does not give, in order."""
    known = set(evidence)
    bad: list[str] = []
    for m in _NUM.finditer(value[:_MAX_CHARS]):
        v = float(m.group(0).replace(",", ""))
        if (v in FREE_NUMBERS and "." not in m.group(0)) or v in known:
            continue
        if any(_close(v, e) or _close(v, e / 100) or _close(v, 1 - e / 100) or _close(v, 1 + e / 100) for e in known):
            continue
        if m.group(0) not in bad:
            bad.append(m.group(0))
    return bad
