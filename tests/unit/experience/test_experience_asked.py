"""The asked-unit check and the percent rule (serve.experience._asked)."""

from __future__ import annotations

import pytest

from recallserve.serve.experience._asked import answer_unit, asked_unit, is_percent, is_ratio_expression


@pytest.mark.parametrize(("question", "unit"), [
    ("A runner covers 5 km in 25 minutes. What is the speed in km/h?", "km/h"),
    ("A 1500 W heater runs for 3 hours. How much energy does it use in kWh?", "kWh"),
    ("A car uses 6 L of fuel per 100 km. How many liters does it use for 250 km?", "liters"),
    ("How many seconds are in 2.5 hours?", "seconds"),
    ("A box holds 12 bottles. How many bottles are in 7 boxes?", None),  # not a unit
    ("What is the total in 2023?", None),
    ("Is it allowed in total?", None),
    ("What is 15% of 240?", None),
    ("What is the ratio in percent?", None),  # dimensionless: not checked
    # Issue 19, review load: "convert ... to" and a unit per a count.
    ("Convert 15 m/s to km/h.", "km/h"),
    ("Please convert 3 miles into km, rounded.", "km"),
    ("A car drives 480 km on 32 liters of fuel. What is its fuel consumption in liters per 100 km?", "liters/(100 km)"),
    ("What is the speed in km per hour?", "km/hour"),
    ("Convert the recipe to English.", None),  # not a unit
])
def test_asked_unit(question: str, unit: str | None) -> None:
    assert asked_unit(question) == unit


@pytest.mark.parametrize(("answer", "unit"), [
    ("0.2 km/min", "km/min"), ("84 liters", "liters"), ("$19", None), ("36", None), ("60 km/h.", "km/h"),
    ("16 (LATE-1)", None), ("6.25 liters per 100 km", "liters/(100 km)"), ("6.25 L/100 km", "L/100 km")])
def test_answer_unit(answer: str, unit: str | None) -> None:
    assert answer_unit(answer) == unit


def test_a_percentage_is_computed_by_a_ratio_only() -> None:
    assert is_percent("12%", "A price rises from 80 to 92. How much?")
    assert is_percent("15", "By what percentage did it increase?")
    assert not is_percent("36", "What is 15% of 240?")
    for question in ("What was the percentage increase?", "Find the percent change.", "What is the drop in percent?"):
        assert is_percent("1800", question)
    assert not is_percent("1800", "What was the increase?")
    assert is_ratio_expression("(92 - 80) / 80 * 100") and is_ratio_expression("0.15 * 100")
    assert not is_ratio_expression("92 - 80")
