"""Time expressions of a query -> the window of time it asks about (rules, no model, no fitting).

"What did Maria donate in December 2023?", "who did I meet yesterday?", "the talk two weeks ago":
the question names when. :func:`query_time_window` reads the expressions below relative to the
question's time ``now`` and returns the window they span (UTC calendar units)::

    full date      "May 3, 2023" | "3 May, 2023" | "2023-05-03"          -> that day
    month + year   "May 2023" | "May of 2023"                            -> that month
    season + year  "summer 2023" | "summer of 2023"                      -> its three months
    year           "in 2023" | "during 2023" | "of 2023" | "since 2023"  -> that year (since: to now)
    relative day   "today" | "tonight" | "yesterday" | "last night"      -> that day
    relative unit  "this|last week|weekend|month|year"                   -> that calendar unit
    ago            "N days|weeks|months|years ago" (N: digits, one..twelve, a, a couple of, a few)
                                                                         -> now - N units, +-1 unit
    month alone    "in June"                                             -> the last June begun by now
    season alone   "this|last summer", "in|during the summer"            -> the last one begun by now

When the query names a full date, month or year ("last weekend before April 10, 2023"), its
relative expressions are read against the end of the first one instead of ``now``. Seasons are meteorological and northern (spring = Mar-May, summer = Jun-Aug, autumn/fall =
Sep-Nov, winter = Dec-Feb). Several expressions give the span from the earliest start to the
latest end. A window is a hint to the ranking (see ``HybridRetriever``), never a filter: a memory
is dated when it was written, and what it tells may have happened before.
"""

from __future__ import annotations

import re
from calendar import monthrange
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

__all__ = ["TimeWindow", "query_time_window", "resolve_relative_dates"]


class TimeWindow(NamedTuple):
    """``[start, end)`` in epoch seconds and the expressions that gave it."""

    start: float
    end: float
    text: str


_MONTHS = {m: i for i, m in enumerate(
    "january february march april may june july august september october november december".split(), start=1)}
_MONTHS.update({m[:3]: i for m, i in list(_MONTHS.items())})
_MONTHS["sept"] = 9
_SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
_NUMBERS = {w: i for i, w in enumerate("one two three four five six seven eight nine ten eleven twelve".split(), start=1)}
_NUMBERS.update({"a": 1, "an": 1, "a couple of": 2, "a couple": 2, "a few": 3, "several": 3})

_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_SEASON = r"(?P<season>spring|summer|autumn|fall|winter)"
_N = r"(?P<n>\d{1,3}|" + "|".join(sorted(map(re.escape, _NUMBERS), key=len, reverse=True)) + r")"
_UNIT = r"(?P<unit>day|week|month|year)s?"

# NOTE: order matters only for overlaps: a span taken by an earlier rule is not read again
# ("May 3, 2023" is a day, not also "May" and "2023").
_RULES: list[tuple[str, re.Pattern[str]]] = [(name, re.compile(p, re.IGNORECASE)) for name, p in [
    ("iso", r"\b(?P<year>(?:19|20)\d\d)-(?P<m>[01]\d)-(?P<day>[0-3]\d)\b"),
    ("mdy", rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b"),
    ("dmy", rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b"),
    ("month_year", rf"\b{_MONTH},?\s+(?:of\s+)?{_YEAR}\b"),
    ("season_year", rf"\b{_SEASON}\s+(?:of\s+)?{_YEAR}\b"),
    ("year", rf"\b(?P<prep>in|during|of|since|for)\s+(?:the\s+year\s+)?{_YEAR}\b"),
    ("day_word", r"\b(?P<word>today|tonight|this morning|this afternoon|this evening|yesterday|last night)\b"),
    ("ago", rf"\b{_N}\s+{_UNIT}\s+ago\b"),
    ("this_last", r"\b(?P<which>this|last|past)\s+(?P<unit>week|weekend|month|year)\b"),
    ("season_rel", rf"\b(?P<which>this|last|past|in the|during the|in|during)\s+{_SEASON}\b"),
    ("month_alone", rf"\b(?P<prep>in|during|since)\s+(?:early\s+|late\s+|mid-?\s*)?{_MONTH}\b(?!\s*\d)"),
]]


# NOTE: one pass that every rule needs a hit of: most queries name no time and stop here.
_GATE = re.compile(r"\d|\b(?:" + "|".join(sorted({*_MONTHS, *_SEASONS, "today", "tonight", "yesterday", "this", "last",
                                                      "past", "ago"}, key=len, reverse=True)) + r")\b", re.IGNORECASE)

_RELATIVE = frozenset({"day_word", "ago", "this_last", "season_rel", "month_alone"})
"""Rules read relative to a reference time (``now``, or the first full date the query names)."""


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


def _day(d: datetime) -> tuple[datetime, datetime]:
    start = d.replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=1)


def _month(year: int, month: int) -> tuple[datetime, datetime]:
    start = datetime(year, month, 1, tzinfo=timezone.utc)
    return start, start + timedelta(days=monthrange(year, month)[1])


def _add_months(year: int, month: int, n: int) -> tuple[int, int]:
    idx = year * 12 + (month - 1) + n
    return idx // 12, idx % 12 + 1


def _season(year: int, first_month: int) -> tuple[datetime, datetime]:
    """Three months from ``first_month`` of ``year`` (winter 2023 = Dec 2023 - Feb 2024)."""
    start = _month(year, first_month)[0]
    y, m = _add_months(year, first_month, 3)
    return start, _month(y, m)[0]


def _last_begun(now: datetime, first_month: int) -> int:
    """Year of the latest period starting on the 1st of ``first_month`` that has begun by ``now``."""
    return now.year if (now.month, now.day) >= (first_month, 1) else now.year - 1


def _window(name: str, m: re.Match[str], now: datetime) -> tuple[datetime, datetime] | None:
    g = {k: (v.lower() if isinstance(v, str) else v) for k, v in m.groupdict().items()}
    try:
        if name == "iso":
            return _day(datetime(int(g["year"]), int(g["m"]), int(g["day"]), tzinfo=timezone.utc))
        if name in ("mdy", "dmy"):
            return _day(datetime(int(g["year"]), _MONTHS[g["month"]], int(g["day"]), tzinfo=timezone.utc))
    except ValueError:
        return None  # NOTE: "February 30, 2023" is no day; the expression gives no window.
    if name == "month_year":
        return _month(int(g["year"]), _MONTHS[g["month"]])
    if name == "season_year":
        return _season(int(g["year"]), _SEASONS[g["season"]])
    if name == "year":
        start = datetime(int(g["year"]), 1, 1, tzinfo=timezone.utc)
        end = now if g["prep"] == "since" and now > start else datetime(int(g["year"]) + 1, 1, 1, tzinfo=timezone.utc)
        return start, end
    if name == "day_word":
        back = 1 if g["word"] in ("yesterday", "last night") else 0
        return _day(now - timedelta(days=back))
    if name == "ago":
        n = int(g["n"]) if g["n"].isdigit() else _NUMBERS[g["n"]]
        unit = {"day": timedelta(days=1), "week": timedelta(weeks=1), "month": timedelta(days=30.44),
                "year": timedelta(days=365.25)}[g["unit"]]
        # NOTE: "two weeks ago" is rarely exact: +-1 unit around it.
        return now - (n + 1) * unit, now - max(n - 1, 0) * unit + (timedelta(days=1) if n <= 1 else timedelta(0))
    if name == "this_last":
        back = 0 if g["which"] == "this" else 1
        unit = g["unit"]
        if unit == "week":
            monday = _day(now)[0] - timedelta(days=now.weekday())
            start = monday - timedelta(weeks=back)
            return start, start + timedelta(weeks=1)
        if unit == "weekend":
            saturday = _day(now)[0] - timedelta(days=(now.weekday() - 5) % 7)
            start = saturday - timedelta(weeks=back if now.weekday() >= 5 else max(back - 1, 0))
            return start, start + timedelta(days=2)
        if unit == "month":
            return _month(*_add_months(now.year, now.month, -back))
        return datetime(now.year - back, 1, 1, tzinfo=timezone.utc), datetime(now.year - back + 1, 1, 1, tzinfo=timezone.utc)
    if name == "season_rel":
        first = _SEASONS[g["season"]]
        year = _last_begun(now, first)
        start, end = _season(year, first)
        if g["which"] in ("last", "past") and end > now:
            start, end = _season(year - 1, first)
        return start, end
    if name == "month_alone":
        month = _MONTHS[g["month"]]
        start, end = _month(_last_begun(now, month), month)
        return (start, now) if g["prep"] == "since" and now > start else (start, end)
    return None


def query_time_window(query: str, now: float, max_chars: int = 2048) -> TimeWindow | None:
    """The window of time ``query`` names, read relative to ``now`` (epoch seconds); None if it names none.

    Only the first ``max_chars`` characters are read (a long query is a document, and the rules
    stay linear in its length).

    Example:
        >>> w = query_time_window("What did Maria donate in December 2023?", now=1.7e9)
        >>> datetime.fromtimestamp(w.start, tz=timezone.utc).date().isoformat(), w.text
        ('2023-12-01', 'December 2023')
    """
    text = query[:max_chars]
    if _GATE.search(text) is None:
        return None
    when = _utc(now)
    taken: list[tuple[int, int]] = []
    found: list[tuple[datetime, datetime, str]] = []
    for name, pattern in _RULES:
        if name in _RELATIVE and found:
            # NOTE: "last weekend before April 10, 2023": a date the query names is the time its
            # relative expressions are read against (the day after it, so "the week before" ends there).
            when = found[0][1]
        for m in pattern.finditer(text):
            if any(m.start() < b and a < m.end() for a, b in taken):
                continue
            w = _window(name, m, when)
            if w is None or w[1] <= w[0]:
                continue
            taken.append(m.span())
            found.append((w[0], w[1], m.group(0)))
    if not found:
        return None
    found.sort(key=lambda f: text.find(f[2]))
    return TimeWindow(min(f[0] for f in found).timestamp(), max(f[1] for f in found).timestamp(),
                      "; ".join(f[2] for f in found))


# ---- relative dates of a stored text, resolved against the time it was said ------------------

_WEEKDAYS = {d: i for i, d in enumerate("monday tuesday wednesday thursday friday saturday sunday".split())}
_STATED: list[tuple[str, re.Pattern[str]]] = [(name, re.compile(p, re.IGNORECASE)) for name, p in [
    ("day_word", r"\b(?P<word>today|tonight|this morning|this afternoon|this evening|yesterday|last night|tomorrow)\b"),
    ("weekday", r"\b(?P<which>last|this past|next)\s+(?P<wd>" + "|".join(_WEEKDAYS) + r")\b"),
    ("ago", rf"\b{_N}\s+{_UNIT}\s+ago\b"),
    ("this_last", r"\b(?P<which>this|last|past|next)\s+(?P<unit>week|weekend|month|year)\b"),
    ("season_rel", r"\b(?P<which>this|last|next)\s+(?P<season>spring|summer|autumn|fall|winter)\b"),
]]


def _stated_date(name: str, m: re.Match[str], now: datetime) -> str | None:
    """The absolute date one relative expression of a statement made at ``now`` names, in words."""
    g = {k: (v.lower() if isinstance(v, str) else v) for k, v in m.groupdict().items()}

    def day(d: datetime) -> str:
        return f"{d.day} {d.strftime('%B')} {d.year}"

    if name == "day_word":
        shift = {"yesterday": -1, "last night": -1, "tomorrow": 1}.get(g["word"], 0)
        return day(now + timedelta(days=shift))
    if name == "weekday":
        target = _WEEKDAYS[g["wd"]]
        if g["which"] == "next":
            return day(now + timedelta(days=(target - now.weekday() - 1) % 7 + 1))
        return day(now - timedelta(days=(now.weekday() - target - 1) % 7 + 1))
    if name == "ago":
        n = int(g["n"]) if g["n"].isdigit() else _NUMBERS[g["n"]]
        if g["unit"] == "day":
            return day(now - timedelta(days=n))
        if g["unit"] == "week":
            then = now - timedelta(weeks=n)
            return f"the week of {day(_day(then)[0] - timedelta(days=then.weekday()))}"
        if g["unit"] == "month":
            y, mo = _add_months(now.year, now.month, -n)
            return f"{datetime(y, mo, 1).strftime('%B')} {y}"
        return str(now.year - n)
    if name == "this_last":
        step = {"this": 0, "next": 1}.get(g["which"], -1)
        unit = g["unit"]
        if unit in ("week", "weekend"):
            monday = _day(now)[0] - timedelta(days=now.weekday()) + timedelta(weeks=step)
            return f"the {unit} of {day(monday + timedelta(days=5) if unit == 'weekend' else monday)}"
        if unit == "month":
            y, mo = _add_months(now.year, now.month, step)
            return f"{datetime(y, mo, 1).strftime('%B')} {y}"
        return str(now.year + step)
    if name == "season_rel":
        first = _SEASONS[g["season"]]
        year = _last_begun(now, first)
        if g["which"] == "last" and _season(year, first)[1] > now:
            year -= 1
        elif g["which"] == "next":
            year += 1
        return f"{g['season']} {year}"
    return None


def resolve_relative_dates(text: str, now: float) -> str:
    """``text`` with each relative time expression followed by the date it names when said at ``now``.

    A statement made on Monday 8 May 2023 that says "yesterday" means Sunday 7 May: the code does
    this arithmetic (a small model does not do it reliably) and writes the date after the words, so
    a question naming the date finds the statement by its words. Expressions (UTC calendar)::

        today | tonight | yesterday | last night | tomorrow     -> that day
        last | this past | next <weekday>                       -> the nearest such day before | after
        N days | weeks | months | years ago                    -> that day | week | month | year
        this | last | past | next week | weekend | month | year -> that week | weekend | month | year
        this | last | next <season>                            -> that season and its year

    An expression already followed by a bracket is left alone (no double resolution).

    Example:
        >>> resolve_relative_dates("Caroline went to a support group yesterday.", 1683504000.0)  # 8 May 2023
        'Caroline went to a support group yesterday (7 May 2023).'
    """
    when = _utc(now)
    out: list[str] = []
    taken: list[tuple[int, int, str]] = []
    for name, pattern in _STATED:
        for m in pattern.finditer(text):
            if any(m.start() < b and a < m.end() for a, b, _ in taken) or text[m.end():m.end() + 2].lstrip().startswith("("):
                continue
            date = _stated_date(name, m, when)
            if date is not None:
                taken.append((m.start(), m.end(), date))
    pos = 0
    for start, end, date in sorted(taken):
        out.append(f"{text[pos:end]} ({date})")
        pos = end
    out.append(text[pos:])
    return "".join(out)
