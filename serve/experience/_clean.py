"""Context cleaning before keying and embedding, and the quantities of a cleaned context.

Two problems that differ only in how they are written should find the same experiences, so
both the stored record's search text and every query are cleaned the same way first
(:func:`clean_context`):

1. **Unicode** NFKC (full-width digits and letters -> ASCII, ``１２０`` -> ``120``), case folded.
2. **Number forms unified** (:func:`unify_numbers`), in this order:
   Chinese numerals -> digits (``一百二十`` -> ``120``, ``一点五`` -> ``1.5``; the ``cn2an``
   library); English number words -> digits (``twenty five`` -> ``25``; the ``text2num``
   library, which leaves a lone "one" alone); thousands separators dropped (``1,100,000``);
   scale words multiplied out: ``k`` / ``thousand`` / ``千`` = 1e3, ``million`` / ``mn`` = 1e6,
   ``billion`` / ``bn`` = 1e9, ``万`` = 1e4, ``亿`` = 1e8. So ``1.1 million``, ``1,100,000``
   and ``110万`` all become ``1100000``.
3. **Entities normalised**: dotted abbreviations closed up (``U.S.`` -> ``us``), possessives
   dropped (``Alice's`` -> ``alice``), currency signs named (``$`` -> ``usd``), unit words
   reduced to their symbol (``kilometres`` -> ``km``, ``hours`` -> ``h``).
4. **Question words dropped** (what, how many, 多少, 吗 ...) with the question marks: they are
   in every query and carry nothing of the problem.

The raw text of a record is kept as written (it is the fact); cleaning only decides what is
compared. :func:`extract_quantities` reads the numbers (with their units) of a cleaned context,
the input of the extracted checks (:mod:`recallserve.serve.experience._extract`).
"""

from __future__ import annotations

import re
import unicodedata
import warnings
from dataclasses import dataclass

from recallserve.serve.experience._calculator import CalcError
from recallserve.serve.experience._units import parse_unit

__all__ = ["clean_context", "unify_numbers", "extract_quantities", "ContextQuantity", "MAX_CLEAN_CHARS"]

# NOTE: the schema's bound on a context (8000 characters); longer input is cut before any regex.
MAX_CLEAN_CHARS = 8000
MAX_QUANTITIES = 32

_SCALE = {"k": 1e3, "thousand": 1e3, "千": 1e3, "million": 1e6, "mn": 1e6, "millions": 1e6, "billion": 1e9,
          "bn": 1e9, "billions": 1e9, "万": 1e4, "亿": 1e8}
# "1.1 million", "3.5k", "110万", "2 亿"; "k" only lower-case and glued to the number (so "5 kg"
# and "300K", kelvin, stay).
_SCALED = re.compile(r"(?<![0-9A-Za-z_.])(\d+(?:\.\d+)?)(?:\s*(thousand|millions?|billions?|mn|bn|千|万|亿)\b|\s*(千|万|亿)|((?-i:k))\b)", re.I)
_THOUSANDS = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3})+)(?![\d,])")
# NOTE: text2num writes "one point five million" as "1.5 1000000": a decimal then a power of ten.
_SPLIT_SCALE = re.compile(r"(?<![0-9A-Za-z_.])(\d+\.\d+) (1000(?:000){0,2})\b")
_ABBREV = re.compile(r"\b(?:[a-z]\.){2,}", re.I)
_POSSESSIVE = re.compile(r"(\w)['’]s\b")
_CURRENCY = {"$": " usd ", "€": " eur ", "£": " gbp ", "¥": " cny ", "元": " cny "}
# NOTE: longest words first so "kilometres" is not read as "kilometre" + "s".
_SIGN_AMOUNT = re.compile(r"([$€£¥])\s*(\d[\d,]*(?:\.\d+)?(?:\s*(?:thousand|million|billion|mn|bn)\b|k\b|\s*[千万亿])?)", re.I)
_UNIT_WORDS = {
    "kilometres": "km", "kilometers": "km", "kilometre": "km", "kilometer": "km", "公里": "km", "千米": "km",
    "metres": "m", "meters": "m", "metre": "m", "meter": "m", "米": "m",
    "hours": "h", "hour": "h", "hrs": "h", "hr": "h", "小时": "h",
    "minutes": "min", "minute": "min", "mins": "min", "分钟": "min",
    "seconds": "s", "second": "s", "secs": "s", "sec": "s", "秒": "s",
    "kilograms": "kg", "kilogram": "kg", "kgs": "kg", "公斤": "kg", "千克": "kg",
    "grams": "g", "gram": "g", "克": "g", "litres": "l", "liters": "l", "litre": "l", "liter": "l", "升": "l",
    "miles": "mi", "mile": "mi", "percent": "%", "per cent": "%", "dollars": "usd", "dollar": "usd",
    "euros": "eur", "euro": "eur", "yuan": "cny", "rmb": "cny",
}
_UNIT_RE = re.compile("|".join(sorted((re.escape(w) for w in _UNIT_WORDS), key=len, reverse=True)), re.I)
_QUESTION_EN = re.compile(
    r"\b(?:what|which|who|whom|whose|when|where|why|how\s+(?:many|much|long|far|fast|old)|how|"
    r"is|are|was|were|does|do|did|please|tell\s+me|can\s+you|could\s+you|do\s+you\s+know|find|calculate|compute|determine)\b",
    re.I)
# NOTE: 002's question words (是不是, 会不会, 听说) and their kin (有没有, 能不能, 要不要) beside the plain ones.
_QUESTION_ZH = re.compile(r"请问|听说|是不是|会不会|有没有|能不能|要不要|可不可以|为什么|怎么样|怎么|如何|多少|什么|哪个|哪里|哪些|是否|几|吗|呢")
# NOTE: a full stop is punctuation unless a digit follows it (1.5 keeps its point).
_PUNCT = re.compile(r"\.(?!\d)|[?？!！,，;；:：\"“”'‘’()（）\[\]【】]")
_SPACE = re.compile(r"\s+")


def _fmt(x: float) -> str:
    """A number as plain digits: ``1100000`` not ``1.1e+06``; up to 12 significant digits."""
    if x == int(x) and abs(x) < 1e18:
        return str(int(x))
    return f"{x:.12g}"


def _chinese_to_digits(text: str) -> str:
    if not re.search(r"[零〇一二两三四五六七八九十百千万亿点壹贰叁肆伍陆柒捌玖拾佰仟]", text):
        return text
    import cn2an  # NOTE: imported on first use: ~50 ms, and most contexts are not Chinese

    with warnings.catch_warnings():
        # NOTE: cn2an warns (UserWarning) on fragments it leaves as written; those are not errors.
        warnings.simplefilter("ignore")
        try:
            return str(cn2an.transform(text, "cn2an"))
        except (ValueError, KeyError, IndexError):  # a malformed numeral is left as written
            return text


def _english_to_digits(text: str) -> str:
    if not re.search(r"[a-zA-Z]", text):
        return text
    from text_to_num import alpha2digit

    return str(alpha2digit(text, "en"))


def unify_numbers(text: str) -> str:
    """Every number of ``text`` as plain digits (see the module docstring for the forms).

    Example:
        >>> [unify_numbers(t) for t in ("1.1 million", "1,100,000", "110万", "3.5k", "二十五")]
        ['1100000', '1100000', '1100000', '3500', '25']
    """
    s = _chinese_to_digits(text[:MAX_CLEAN_CHARS])
    # NOTE: digits with a scale word first: text2num would turn "2 Million" into "2 1000000".
    s = _SCALED.sub(_scaled, s)
    s = _english_to_digits(s)
    s = _SPLIT_SCALE.sub(lambda m: _fmt(float(m.group(1)) * float(m.group(2))), s)
    s = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), s)
    return _SCALED.sub(_scaled, s)


def _scaled(m: re.Match[str]) -> str:
    word = next(g for g in m.groups()[1:] if g)
    return _fmt(float(m.group(1)) * _SCALE[word.lower()])


def clean_context(text: str, *, fold_case: bool = True) -> str:
    """The comparable form of a problem: NFKC, case folded, numbers unified, entities normalised,
    question words and punctuation dropped, spaces collapsed.

    ``fold_case=False`` keeps the case (unit symbols are case-sensitive: ``W`` is a watt, ``w``
    nothing): the form :func:`extract_quantities` reads.

    Example:
        >>> clean_context("What is the speed of a car that drives 1,200 kilometres in 1.5 hours?")
        'the speed of a car that drives 1200 km in 1.5 h'
    """
    s = unicodedata.normalize("NFKC", text[:MAX_CLEAN_CHARS])
    # NOTE: "$30" and "30 dollars" alike end as "30 usd": the sign moves behind its amount.
    s = _SIGN_AMOUNT.sub(lambda m: f"{m.group(2)}{_CURRENCY[m.group(1)]}", s)
    for sign, name in _CURRENCY.items():
        s = s.replace(sign, name)
    # NOTE: numbers before case folding, so "300K" (kelvin) is not read as 300 thousand.
    s = unify_numbers(s)
    s = s.casefold() if fold_case else s
    s = _ABBREV.sub(lambda m: m.group(0).replace(".", ""), s)
    s = _POSSESSIVE.sub(r"\1", s)
    s = _UNIT_RE.sub(_unit_word, s)
    s = _QUESTION_EN.sub(" ", s)
    s = _QUESTION_ZH.sub(" ", s)
    s = _PUNCT.sub(" ", s)
    return _SPACE.sub(" ", s).strip()


def _unit_word(m: re.Match[str]) -> str:
    """A unit word as its symbol: an ASCII word only when whole ("hour" in "hourly" and "meter" in
    "parameter" stay), a Chinese one only right after a number ("米" in "玉米", corn, stays)."""
    s, word = m.string, m.group(0)
    symbol = _UNIT_WORDS[word.lower()]
    before = s[m.start() - 1] if m.start() > 0 else " "
    if word.isascii():
        after = s[m.end()] if m.end() < len(s) else " "
        return word if before.isalpha() or after.isalpha() else symbol
    return f" {symbol} " if before.isdigit() or before == " " and _DIGIT_BEFORE.search(s, 0, m.start()) else word


_DIGIT_BEFORE = re.compile(r"\d\s$")


@dataclass(frozen=True)
class ContextQuantity:
    """A number of a cleaned context, the unit written after it ('' if none) and where it stands.

    A compound of one dimension (``1 h 45 min``) is one quantity: ``value`` in its first unit
    (1.75 h), ``parts`` the quantities as written (1 h, 45 min) and ``smallest`` its value in the
    last part's unit (105 min); a plain quantity has no parts and ``smallest`` None.
    """

    value: float
    unit: str
    text: str
    start: int
    end: int = -1
    parts: tuple[ContextQuantity, ...] = ()
    smallest: float | None = None

    def readings(self) -> list[tuple[float, str]]:
        """``(value, unit)`` of every way a formula may write it: as a whole, in its last unit, by part."""
        out = [(self.value, self.unit)]
        if self.smallest is not None and self.parts:
            out.append((self.smallest, self.parts[-1].unit))
        return out + [(p.value, p.unit) for p in self.parts]


# NOTE: what may stand between the parts of a compound quantity: "1 h 45 min", "1 h and 45 min".
_COMPOUND_GAP = re.compile(r"\s*(?:and\s+)?")
_QUANTITY = re.compile(
    r"(?<![0-9A-Za-z_.])(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(%|[A-Za-zµΩ][A-Za-z0-9µΩ]*(?:/[A-Za-z][A-Za-z0-9]*)?(?:\^\d)?)?")


def extract_quantities(cleaned: str) -> list[ContextQuantity]:
    """The numbers of a cleaned context with the unit that follows each (when it is a known unit).

    Pass a context cleaned with ``fold_case=False`` (``W`` is a watt, ``w`` is not a unit).
    A word after a number is a unit only when the unit table knows it (``120 km`` -> km, but
    ``3 apples`` -> no unit); at most :data:`MAX_QUANTITIES` are read.
    """

    out: list[ContextQuantity] = []
    text = cleaned[:MAX_CLEAN_CHARS]
    for m in _QUANTITY.finditer(text):
        if len(out) >= MAX_QUANTITIES:
            break
        try:
            value = float(m.group(1))
        except ValueError:
            continue
        unit = m.group(2) or ""
        if unit == "%":
            unit = "percent"
        if unit:
            try:
                parse_unit(unit)
            except CalcError:
                unit = ""
        q = ContextQuantity(value=value, unit=unit, text=m.group(1), start=m.start(), end=m.end() if unit else m.end(1))
        joined = _compound(out[-1], q, text) if out else None
        if joined is not None:
            out[-1] = joined
        else:
            out.append(q)
    return out


def _si(unit: str) -> tuple[float, tuple[int, ...]] | None:
    """SI factor and dimension of a unit of the table (None when it has no dimension)."""

    one = parse_unit(unit)
    return (one.value, one.dims) if any(one.dims) else None


def _compound(head: ContextQuantity, q: ContextQuantity, text: str) -> ContextQuantity | None:
    """``head`` and ``q`` as one quantity when the text writes them as one (``1 h 45 min``,
    ``3 m 20 cm``, ``2 min and 30 s``), else None.

    Both have units of one dimension, only a space or "and" between them, and ``q`` is in a smaller
    unit and less than one of ``head``'s (45 min < 1 h): read apart, "1 hour 45 minutes" became the
    quantities 1 and 45, which a right formula ``210 / 1.75`` leaves out (eval experiences, held-out h6).
    """
    last = head.parts[-1] if head.parts else head
    if not (head.unit and q.unit and _COMPOUND_GAP.fullmatch(text, head.end, q.start)):
        return None
    first, lo, small = _si(head.unit), _si(last.unit), _si(q.unit)
    if first is None or lo is None or small is None or not first[1] == lo[1] == small[1]:
        return None
    if not (small[0] < lo[0] and q.value * small[0] < lo[0]):
        return None
    whole = head.value + q.value * small[0] / first[0]
    return ContextQuantity(value=whole, unit=head.unit, text=text[head.start:q.end], start=head.start, end=q.end,
                           parts=(head.parts or (head,)) + (q,), smallest=whole * first[0] / small[0])
