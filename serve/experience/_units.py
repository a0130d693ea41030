"""A small unit table and dimensional arithmetic for the unit / dimension verification check.

A :class:`Quantity` is an SI magnitude plus integer exponents of the six base dimensions
``(m, kg, s, A, K, mol)``. Quantity expressions are evaluated with the safe calculator:
``"120 km / 1.5 h"`` is read as ``(120 km) / (1.5 h)`` (a number followed by a compact unit
term such as ``km/h`` or ``m/s^2`` is one quantity), which is how people write them.

NOTE: affine temperature scales (degC, degF) are not in the table on purpose: their zero
offsets make products ambiguous; write kelvin or temperature differences in K.

Example:
    >>> to_unit(parse_quantity("120 km / 1.5 h"), "km/h")
    80.0
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from recallserve.serve.experience._calculator import CalcError, evaluate

__all__ = ["Quantity", "DimensionError", "parse_quantity", "parse_unit", "to_unit", "format_dims", "UNITS"]

_BASE = ("m", "kg", "s", "A", "K", "mol")
Dims = tuple[int, int, int, int, int, int]
_ZERO: Dims = (0, 0, 0, 0, 0, 0)


class DimensionError(CalcError):
    """Quantities of different dimensions were added, compared or converted."""


def _d(m: int = 0, kg: int = 0, s: int = 0, a: int = 0, k: int = 0, mol: int = 0) -> Dims:
    return (m, kg, s, a, k, mol)


def format_dims(dims: Dims) -> str:
    """Dimension exponents as text, e.g. ``(1, 0, -1, 0, 0, 0)`` -> ``"m*s^-1"``; ``"1"`` if none."""
    parts = [b if e == 1 else f"{b}^{e}" for b, e in zip(_BASE, dims, strict=True) if e != 0]
    return "*".join(parts) or "1"


@dataclass(frozen=True)
class Quantity:
    """An SI magnitude with dimension exponents."""

    value: float
    dims: Dims = _ZERO

    @staticmethod
    def of(x: Any) -> Quantity:
        """Wrap a plain number as a dimensionless quantity."""
        if isinstance(x, Quantity):
            return x
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise CalcError(f"{x!r} is not a number or quantity")
        return Quantity(float(x))

    def _same(self, other: Any, what: str) -> Quantity:
        o = Quantity.of(other)
        if o.dims != self.dims:
            raise DimensionError(f"cannot {what} {format_dims(self.dims)} and {format_dims(o.dims)}")
        return o

    def __add__(self, other: Any) -> Quantity:
        return Quantity(self.value + self._same(other, "add").value, self.dims)

    __radd__ = __add__

    def __sub__(self, other: Any) -> Quantity:
        return Quantity(self.value - self._same(other, "subtract").value, self.dims)

    def __rsub__(self, other: Any) -> Quantity:
        return Quantity(self._same(other, "subtract").value - self.value, self.dims)

    def __mul__(self, other: Any) -> Quantity:
        o = Quantity.of(other)
        return Quantity(self.value * o.value, tuple(a + b for a, b in zip(self.dims, o.dims, strict=True)))  # type: ignore[arg-type]

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Quantity:
        o = Quantity.of(other)
        if o.value == 0:
            raise ZeroDivisionError
        return Quantity(self.value / o.value, tuple(a - b for a, b in zip(self.dims, o.dims, strict=True)))  # type: ignore[arg-type]

    def __rtruediv__(self, other: Any) -> Quantity:
        return Quantity.of(other) / self

    def __pow__(self, exponent: Any) -> Quantity:
        if isinstance(exponent, Quantity):
            if exponent.dims != _ZERO:
                raise DimensionError("an exponent must be dimensionless")
            exponent = exponent.value
        if self.dims != _ZERO and float(exponent) != int(exponent):
            raise DimensionError("fractional powers of dimensioned quantities are not supported")
        e = int(exponent) if float(exponent).is_integer() else float(exponent)
        return Quantity(self.value**e, tuple(int(d * e) for d in self.dims))  # type: ignore[arg-type]

    def __neg__(self) -> Quantity:
        return Quantity(-self.value, self.dims)

    def __pos__(self) -> Quantity:
        return self

    def __lt__(self, other: Any) -> bool:
        return self.value < self._same(other, "compare").value

    def __le__(self, other: Any) -> bool:
        return self.value <= self._same(other, "compare").value

    def __gt__(self, other: Any) -> bool:
        return self.value > self._same(other, "compare").value

    def __ge__(self, other: Any) -> bool:
        return self.value >= self._same(other, "compare").value

    def __eq__(self, other: object) -> bool:
        try:
            o = self._same(other, "compare")
        except CalcError:
            return False
        return math.isclose(self.value, o.value, rel_tol=1e-9, abs_tol=1e-12)

    def __hash__(self) -> int:
        return hash((round(self.value, 9), self.dims))


_L, _M, _T = _d(m=1), _d(kg=1), _d(s=1)
_ENERGY, _POWER = _d(m=2, kg=1, s=-2), _d(m=2, kg=1, s=-3)
_PRESSURE, _FORCE = _d(m=-1, kg=1, s=-2), _d(m=1, kg=1, s=-2)

# name -> (factor to SI, dims). NOTE: plurals and spellings are aliases of one entry.
UNITS: dict[str, tuple[float, Dims]] = {}


def _add(names: str, factor: float, dims: Dims) -> None:
    for n in names.split():
        UNITS[n] = (factor, dims)


_add("m meter meters metre metres", 1.0, _L)
_add("km kilometer kilometers kilometre kilometres", 1e3, _L)
_add("cm centimeter centimeters", 1e-2, _L)
_add("mm millimeter millimeters", 1e-3, _L)
_add("um µm micrometer micrometers", 1e-6, _L)
_add("nm nanometer nanometers", 1e-9, _L)
_add("mi mile miles", 1609.344, _L)
_add("ft foot feet", 0.3048, _L)
_add("in inch inches", 0.0254, _L)
_add("yd yard yards", 0.9144, _L)
_add("kg kilogram kilograms", 1.0, _M)
_add("g gram grams", 1e-3, _M)
_add("mg milligram milligrams", 1e-6, _M)
_add("t tonne tonnes", 1e3, _M)
_add("lb lbs pound pounds", 0.45359237, _M)
_add("oz ounce ounces", 0.028349523125, _M)
_add("s sec secs second seconds", 1.0, _T)
_add("ms millisecond milliseconds", 1e-3, _T)
_add("min mins minute minutes", 60.0, _T)
_add("h hr hrs hour hours", 3600.0, _T)
_add("d day days", 86400.0, _T)
_add("wk week weeks", 604800.0, _T)
# NOTE: a Julian year (365.25 days), the astronomers' convention.
_add("yr year years", 31557600.0, _T)
_add("L l liter liters litre litres", 1e-3, _d(m=3))
_add("mL ml milliliter milliliters millilitre millilitres", 1e-6, _d(m=3))
_add("gal gallon gallons", 3.785411784e-3, _d(m=3))
_add("ha hectare hectares", 1e4, _d(m=2))
_add("N newton newtons", 1.0, _FORCE)
_add("kN", 1e3, _FORCE)
_add("J joule joules", 1.0, _ENERGY)
_add("kJ", 1e3, _ENERGY)
_add("MJ", 1e6, _ENERGY)
_add("cal", 4.184, _ENERGY)
_add("kcal", 4184.0, _ENERGY)
_add("Wh", 3600.0, _ENERGY)
_add("kWh", 3.6e6, _ENERGY)
_add("W watt watts", 1.0, _POWER)
_add("kW", 1e3, _POWER)
_add("MW", 1e6, _POWER)
_add("Pa pascal", 1.0, _PRESSURE)
_add("kPa", 1e3, _PRESSURE)
_add("MPa", 1e6, _PRESSURE)
_add("bar", 1e5, _PRESSURE)
_add("Hz hertz", 1.0, _d(s=-1))
_add("A amp amps ampere amperes", 1.0, _d(a=1))
_add("mA", 1e-3, _d(a=1))
_add("V volt volts", 1.0, _d(m=2, kg=1, s=-3, a=-1))
_add("ohm ohms Ω", 1.0, _d(m=2, kg=1, s=-3, a=-2))
_add("C coulomb coulombs", 1.0, _d(s=1, a=1))
_add("K kelvin", 1.0, _d(k=1))
_add("mol mole moles", 1.0, _d(mol=1))
_add("mph", 1609.344 / 3600.0, _d(m=1, s=-1))
_add("kph kmh", 1e3 / 3600.0, _d(m=1, s=-1))
_add("percent", 0.01, _ZERO)

_IDENT = r"[A-Za-zµΩ][A-Za-z0-9µΩ_]*"
_UNIT_TERM = rf"{_IDENT}(?:(?:\^|\*\*)-?\d+)?(?:[*/·]{_IDENT}(?:(?:\^|\*\*)-?\d+)?)*"
# A number followed by a compact unit term is one quantity: "1.5 h" -> "(1.5*h)".
_QUANTITY_LITERAL = re.compile(rf"(?<![\w.])(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*({_UNIT_TERM})")
_IDENT_RE = re.compile(rf"(?<![\w.]){_IDENT}")


def _prepare(text: str, reserved: frozenset[str] = frozenset()) -> tuple[str, dict[str, Quantity]]:
    """Group quantity literals and replace unit names by safe variable names.

    Inside a quantity literal (``1.5 h``) a name is always a unit; elsewhere a name in
    ``reserved`` (a problem variable such as ``t`` or ``h``) wins over the unit of that name.
    """
    s = text.strip().replace("²", "^2").replace("³", "^3")
    env: dict[str, Quantity] = {}

    def unit(m: re.Match[str], skip: frozenset[str]) -> str:
        name = m.group(0)
        if name not in UNITS or name in skip:
            return name
        var = f"_u{len(env)}"
        env[var] = Quantity(*UNITS[name])
        return var

    def literal(m: re.Match[str]) -> str:
        return f"({m.group(1)}*{_IDENT_RE.sub(lambda u: unit(u, frozenset()), m.group(2))})"

    s = _QUANTITY_LITERAL.sub(literal, s)
    # NOTE: the lookbehind in _IDENT_RE keeps "_u0" (already replaced) from being rescanned.
    return _IDENT_RE.sub(lambda u: unit(u, reserved), s), env


def parse_quantity(text: str, variables: dict[str, Any] | None = None) -> Quantity:
    """Evaluate a quantity expression such as ``"120 km / 1.5 h"`` or ``"3 kg * 9.81 m/s^2"``.

    Names in ``variables`` shadow unit names (a quantity called ``t`` is not a tonne).

    Raises:
        CalcError: On unknown units or names, syntax errors, or adding unlike dimensions
            (:class:`DimensionError`).
    """
    expr, env = _prepare(text, frozenset(variables or ()))
    for name, value in (variables or {}).items():
        env[name] = Quantity.of(value)
    result = evaluate(expr, env)
    if isinstance(result, bool):
        raise CalcError(f"{text!r} is a comparison, not a quantity")
    return Quantity.of(result)


def parse_unit(text: str) -> Quantity:
    """A unit expression (``"km/h"``, ``"m/s^2"``) as the quantity of one such unit."""
    if not text.strip():
        raise CalcError("unit is empty")
    return parse_quantity(f"1 {text.strip()}" if _IDENT_RE.match(text.strip()) else text)


def to_unit(q: Quantity, unit: str) -> float:
    """Magnitude of ``q`` expressed in ``unit``; raises DimensionError on unlike dimensions."""
    u = parse_unit(unit)
    if u.dims != q.dims:
        raise DimensionError(f"{format_dims(q.dims)} cannot be expressed in {unit} ({format_dims(u.dims)})")
    return q.value / u.value
