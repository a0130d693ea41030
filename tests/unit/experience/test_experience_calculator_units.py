"""The safe calculator and the unit table behind the verification checks."""

from __future__ import annotations

import math

import pytest

from recallserve.serve.experience import CalcError, DimensionError, evaluate, parse_quantity, to_unit
from recallserve.serve.experience._calculator import extract_number


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("2 * (3 + 4) ** 2", 98),
        ("7 // 2 + 7 % 3", 4),
        ("15% of 200", 30.0),
        ("200 * 15%", 30.0),
        ("1,250 + 2^3", 1258),
        ("12 × 3 ÷ 4", 9.0),
        ("sqrt(16) + max(1, 5) - abs(-2)", 7.0),
        ("120 / 1.5 =", 80.0),
        ("2*x + 3", 11),
    ],
)
def test_calculator_values(expr, value):
    assert evaluate(expr, {"x": 4}) == pytest.approx(value)


def test_calculator_comparisons_and_tolerant_equality():
    assert evaluate("0.1 + 0.2 == 0.3") is True
    assert evaluate("1 < 2 <= 2 < 1") is False
    assert evaluate("x > 3 and not x > 5", {"x": 4}) is True


@pytest.mark.parametrize(
    ("expr", "needle"),
    [
        ("__import__('os')", "not allowed"),
        ("(1).real", "Attribute"),
        ("'a' * 3", "not a number"),
        ("2 ** 10 ** 9", "exponent"),
        ("10 ** 400", "too large"),
        ("1 / 0", "division by zero"),
        ("y + 1", "unknown name 'y'"),
        ("[1, 2]", "List"),
        ("1 +", "cannot parse"),
        ("", "empty"),
        ("1" + "+1" * 300, "longer than"),
    ],
)
def test_calculator_refuses_unsafe_or_bad_input(expr, needle):
    with pytest.raises(CalcError, match=needle):
        evaluate(expr)


def test_extract_number():
    assert extract_number("$1,250.50 per week") == 1250.5
    assert extract_number("-3 degrees") == -3.0
    assert extract_number("no digits") is None
    assert extract_number(True) is None
    assert extract_number(7) == 7.0


def test_quantities_convert():
    assert to_unit(parse_quantity("120 km / 1.5 h"), "km/h") == pytest.approx(80.0)
    assert to_unit(parse_quantity("3 kg * 9.81 m/s^2"), "N") == pytest.approx(29.43)
    assert to_unit(parse_quantity("60 mph"), "km/h") == pytest.approx(96.56064)
    assert to_unit(parse_quantity("2 kW * 3 h"), "kWh") == pytest.approx(6.0)
    assert to_unit(parse_quantity("12 in"), "cm") == pytest.approx(30.48)
    assert to_unit(parse_quantity("d / t", {"d": 10, "t": 2}), "1") == pytest.approx(5.0)


def test_dimension_mismatch_is_an_error():
    with pytest.raises(DimensionError, match="cannot add m and s"):
        parse_quantity("1 m + 1 s")
    with pytest.raises(DimensionError, match="cannot be expressed in km/h"):
        to_unit(parse_quantity("5 km"), "km/h")
    with pytest.raises(CalcError, match="unknown name 'furlongs'"):
        parse_quantity("3 furlongs")
    assert math.isclose(parse_quantity("1 km").value, 1000.0)


def test_variables_shadow_units_outside_quantity_literals():
    # "t" is a tonne and "h" an hour, unless the problem defines them; "1.5 h" stays an hour.
    assert to_unit(parse_quantity("d / t", {"d": 10, "t": 2}), "1") == pytest.approx(5.0)
    assert to_unit(parse_quantity("120 km / 1.5 h", {"h": 99}), "km/h") == pytest.approx(80.0)
    assert to_unit(parse_quantity("um * 2"), "m") == pytest.approx(2e-6)
