"""Calendar dates written the way people write them, rewritten as ISO dates for the routing rules.

The tools take ISO dates (``2025-07-01``); users write "2025年7月1日到7月31日", "July 1, 2025" or
"1 March 2025". :func:`iso_dates` rewrites each such date in the text the routing rules read, so a
date-taking tool's hint binds it (its grammar enum holds the ISO value, the model copies it) and
the calculator's rule no longer reads its digits as the numbers of a sum. The model still reads
the question as the user wrote it.

Forms (case-insensitive, but "may" and "march" in lower case are verbs; years 1900-2099; a form
without a year takes the year of the full date before it in the same text, else of the one after it,
and is left as written when there is none: a year is never guessed):

* Chinese: ``2025年7月1日`` (or 号), ``7月1日`` (also after an ISO date: ``2025-09-01到10月31日``), and
  a bare day right after a date and a range word: ``7月1日到31日`` -> the 31st of the same month
  (``3号仓库到5号仓库`` and ``3-5日`` are no dates);
* numeric: ``2025/7/1``, ``2025.7.1``;
* English: ``July 1, 2025``, ``July 1st 2025``, ``1 July 2025``, ``the 1st of July``, ``Jul 1``.

A form that is no real date (``2月30日``) is left as written. Bounded: the text is cut to
:data:`MAX_CHARS` characters before matching (a routing text is a question plus OCR notes).
"""

from __future__ import annotations

import datetime as dt
import re

__all__ = ["MAX_CHARS", "iso_dates"]

#: Longest text rewritten (the rest is kept as it is).
MAX_CHARS = 8_000

_MONTHS = {m: i for i, names in enumerate(
    [("jan", "january"), ("feb", "february"), ("mar", "march"), ("apr", "april"), ("may",), ("jun", "june"),
     ("jul", "july"), ("aug", "august"), ("sep", "sept", "september"), ("oct", "october"), ("nov", "november"),
     ("dec", "december")], start=1) for m in names}
_MONTH = r"(?P<mon>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_Y = r"(?:19|20)\d\d"
_YEAR_TAIL = rf"(?:,?\s+(?P<year>{_Y}))?"
# NOTE: digits and Latin letters only at the edges: Han characters may touch a Chinese date ("从2025年7月1日到").
_L, _R = r"(?<![A-Za-z0-9-])", r"(?![A-Za-z0-9])"
_ISO = re.compile(r"(?<![A-Za-z0-9-])(\d{4})-\d{2}-\d{2}(?![A-Za-z0-9])")
_FORMS = re.compile(
    rf"{_L}(?P<zy>{_Y})\s*年\s*(?P<zm>\d{{1,2}})\s*月\s*(?P<zd>\d{{1,2}})\s*[日号]"
    rf"|{_L}(?P<zm2>\d{{1,2}})\s*月\s*(?P<zd2>\d{{1,2}})\s*[日号]"
    rf"|(?P<zrange>[到至~～—-])\s*(?P<zd3>\d{{1,2}})\s*[日号]"
    rf"|{_L}(?P<ny>{_Y})[/.](?P<nm>\d{{1,2}})[/.](?P<nd>\d{{1,2}}){_R}"
    rf"|{_L}{_MONTH}\s+{_DAY}{_YEAR_TAIL}{_R}"
    rf"|{_L}(?:the\s+)?(?P<day2>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<mon2>{'|'.join(sorted(_MONTHS, key=len, reverse=True))})\.?"
    rf"(?:,?\s+(?P<year2>{_Y}))?{_R}",
    re.IGNORECASE,
)


def _date(year: int | None, month: int, day: int) -> dt.date | None:
    if year is None:
        return None
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None


def iso_dates(text: str) -> str:
    """``text`` with each date written in words or Chinese rewritten as ``YYYY-MM-DD`` (see the module docstring).

    Example:
        >>> iso_dates("2025年7月1日到7月31日之间库存变了多少")
        '2025-07-01到2025-07-31之间库存变了多少'
        >>> iso_dates("stock from July 1 to July 31, 2025"), iso_dates("between 1 March and 5 March")
        ('stock from 2025-07-01 to 2025-07-31', 'between 1 March and 5 March')
    """
    head, tail = text[:MAX_CHARS], text[MAX_CHARS:]
    found: list[tuple[re.Match[str], int | None, int | None, int]] = []  # match, year, month, day
    for m in _FORMS.finditer(head):
        g = m.groupdict()
        if g["zy"]:
            found.append((m, int(g["zy"]), int(g["zm"]), int(g["zd"])))
        elif g["zm2"]:
            found.append((m, None, int(g["zm2"]), int(g["zd2"])))
        elif g["zd3"]:
            found.append((m, None, None, int(g["zd3"])))
        elif g["ny"]:
            found.append((m, int(g["ny"]), int(g["nm"]), int(g["nd"])))
        elif g["mon"]:
            found.append((m, int(g["year"]) if g["year"] else None, _MONTHS[g["mon"].lower()], int(g["day"])))
        else:
            found.append((m, int(g["year2"]) if g["year2"] else None, _MONTHS[g["mon2"].lower()], int(g["day2"])))
    # NOTE: an ISO date already in the text gives its year too ("2025-09-01到10月31日").
    iso = [(m.start(), int(m.group(1))) for m in _ISO.finditer(head)]
    dated = sorted([(f.start(), y) for f, y, _, _ in found if y is not None] + iso)
    out, at, month, last_end = [], 0, None, -10
    for m, year, mon, day in found:
        word = m.group("mon") or m.group("mon2")
        if word in ("may", "march"):
            continue  # NOTE: lower case: the verbs ("these 2 may have shipped")
        if mon is None:  # a bare day right after a date and a range word: that date's month
            if month is None or m.start() - last_end > 1:
                continue
            mon = month
        month, last_end = mon, m.end()
        if year is None and dated:
            before = [y for at_, y in dated if at_ < m.start()]
            year = before[-1] if before else next(y for at_, y in dated if at_ > m.start())
        date = _date(year, mon, day)
        if date is None:
            continue
        prefix = (m.group("zrange") or "") if m.group("zd3") else ""
        out.append(head[at:m.start()] + prefix + date.isoformat())
        at = m.end()
    return "".join(out) + head[at:] + tail
