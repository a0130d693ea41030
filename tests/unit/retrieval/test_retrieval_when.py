"""Time expressions of a query -> the window it names (memory_shards.retrieval.when)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from recallserve.memory_shards.retrieval.when import query_time_window

# NOTE: a Sunday afternoon, so weeks and weekends have a fixed answer.
NOW = datetime(2023, 8, 20, 15, tzinfo=timezone.utc).timestamp()


def _days(query: str) -> tuple[str, str] | None:
    w = query_time_window(query, NOW)
    if w is None:
        return None
    fmt = "%Y-%m-%d"
    return (datetime.fromtimestamp(w.start, tz=timezone.utc).strftime(fmt),
            datetime.fromtimestamp(w.end, tz=timezone.utc).strftime(fmt))


@pytest.mark.parametrize("query, window", [
    ("Who did Maria have dinner with on May 3, 2023?", ("2023-05-03", "2023-05-04")),
    ("What was the pet's name on 3 June, 2023?", ("2023-06-03", "2023-06-04")),
    ("see 2023-05-03", ("2023-05-03", "2023-05-04")),
    ("What did Maria donate in December 2023?", ("2023-12-01", "2024-01-01")),
    ("trips in the summer of 2022", ("2022-06-01", "2022-09-01")),
    ("winter 2022", ("2022-12-01", "2023-03-01")),
    ("beach visits in 2023", ("2023-01-01", "2024-01-01")),
    ("what did I eat yesterday", ("2023-08-19", "2023-08-20")),
    ("tasks for today", ("2023-08-20", "2023-08-21")),
    ("the meeting last week", ("2023-08-07", "2023-08-14")),
    ("budget this month", ("2023-08-01", "2023-09-01")),
    ("the trip last year", ("2022-01-01", "2023-01-01")),
    ("When did Melanie go camping in June?", ("2023-06-01", "2023-07-01")),
    ("in December", ("2022-12-01", "2023-01-01")),
    ("last summer", ("2022-06-01", "2022-09-01")),
    ("during the summer", ("2023-06-01", "2023-09-01")),
    ("the call two weeks ago", ("2023-07-30", "2023-08-13")),
    # a named date is the time relative expressions are read against
    ("What did Maria do last weekend before April 10, 2023?", ("2023-04-08", "2023-04-11")),
])
def test_windows(query: str, window: tuple[str, str]) -> None:
    assert _days(query) == window


@pytest.mark.parametrize("query", ["What kind of books does Caroline like?", "you may go", "February 30, 2023",
                                   "route 2023 is closed", "Mar is a name"])
def test_no_window(query: str) -> None:
    assert query_time_window(query, NOW) is None


def test_several_expressions_span_them_all_and_are_named() -> None:
    w = query_time_window("between May 2023 and July 2023", NOW)
    assert w is not None and "May 2023" in w.text and "July 2023" in w.text
    assert _days("between May 2023 and July 2023") == ("2023-05-01", "2023-08-01")


def test_long_queries_are_read_only_to_a_bound() -> None:
    assert query_time_window("x " * 5000 + "in May 2023", NOW) is None
    assert query_time_window("x " * 5000 + "in May 2023", NOW, max_chars=20_000) is not None
