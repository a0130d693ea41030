"""A safe arithmetic calculator over Python's AST (no ``eval``), used by verification items.

Only a whitelist of nodes is evaluated: numbers, ``+ - * / // % **``, unary signs, chained
comparisons, ``and/or/not``, ``a if c else b``, names bound in ``variables`` and calls to a
few math functions. Anything else (attributes, subscripts, lambdas, strings, comprehensions)
raises :class:`CalcError` naming the construct. Values may be plain numbers or objects that
implement the arithmetic dunders (the unit checker passes :class:`~._units.Quantity` values).

Example:
    >>> evaluate("2 * (3 + 4) ** 2 - 15%")
    97.85
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["CalcError", "evaluate", "normalise_expression", "extract_number"]


class CalcError(ValueError):
    """An expression is malformed, unsafe or cannot be evaluated."""


# NOTE: bounds against denial of service: 2 ** 10**9 would hang the worker.
_MAX_EXPR_CHARS = 500
_MAX_NODES = 200
_MAX_EXPONENT = 1000.0
_MAX_MAGNITUDE = 1e300

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: lambda a, b: _close(a, b),
    ast.NotEq: lambda a, b: not _close(a, b),
}
_FUNCS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "min": min,
    "max": max,
    "round": round,
    "sqrt": math.sqrt,
    "log": math.log,
    "log10": math.log10,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "floor": math.floor,
    "ceil": math.ceil,
}
_CONSTS: dict[str, float] = {"pi": math.pi, "e": math.e}

# "15%" meaning fifteen percent (a number followed by % and not by an operand) -> "(15/100)".
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%(?!\s*[\d(.a-zA-Z_])")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


def _close(a: Any, b: Any) -> bool:
    """Equality with a relative tolerance for floats (1e-9), exact otherwise."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def normalise_expression(text: str) -> str:
    """Rewrite the usual written notations into Python syntax.

    ``×``/``·`` -> ``*``, ``÷`` -> ``/``, ``^`` -> ``**``, ``−`` -> ``-``, ``15%`` -> ``(15/100)``,
    thousands separators ``1,250`` -> ``1250`` and a trailing ``=`` or ``= ?`` removed.
    """
    s = text.strip()
    s = s.replace("×", "*").replace("·", "*").replace("÷", "/").replace("^", "**").replace("−", "-")
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)
    s = re.sub(r"%\s+of\s+", "% * ", s)
    s = _PERCENT.sub(r"(\1/100)", s)
    s = re.sub(r"=\s*\??\s*$", "", s).strip()
    return s


def _count_nodes(tree: ast.AST) -> int:
    return sum(1 for _ in ast.walk(tree))


def evaluate(expression: str, variables: Mapping[str, Any] | None = None) -> Any:
    """Evaluate ``expression`` safely.

    Args:
        expression: Arithmetic in Python-like syntax (see :func:`normalise_expression`).
        variables: Values for the names used in the expression (numbers or Quantity objects).

    Returns:
        The value (float, int, bool or whatever the variables' types produce).

    Raises:
        CalcError: On a syntax error, a forbidden construct, an unknown name, division by zero
            or an oversized exponent.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise CalcError("expression is empty")
    if len(expression) > _MAX_EXPR_CHARS:
        raise CalcError(f"expression longer than {_MAX_EXPR_CHARS} characters")
    text = normalise_expression(expression)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalcError(f"cannot parse expression {expression!r}: {exc.msg}") from None
    if _count_nodes(tree) > _MAX_NODES:
        raise CalcError(f"expression has more than {_MAX_NODES} syntax nodes")
    env = dict(_CONSTS)
    env.update(variables or {})
    try:
        return _Evaluator(env).visit(tree.body)
    except ZeroDivisionError:
        raise CalcError(f"division by zero in {expression!r}") from None
    except (OverflowError, ValueError, TypeError, ArithmeticError) as exc:
        if isinstance(exc, CalcError):
            raise
        raise CalcError(f"cannot evaluate {expression!r}: {exc}") from None


class _Evaluator:
    """Recursive evaluator over the whitelisted node types."""

    def __init__(self, env: Mapping[str, Any]) -> None:
        self.env = env

    def visit(self, node: ast.AST) -> Any:
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise CalcError(f"{type(node).__name__} is not allowed in a calculator expression")
        return method(node)

    def _Constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalcError(f"constant {node.value!r} is not a number")
        return node.value

    def _Name(self, node: ast.Name) -> Any:
        if node.id not in self.env:
            raise CalcError(f"unknown name {node.id!r}")
        return self.env[node.id]

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if isinstance(node.op, ast.USub):
            return -value
        if isinstance(node.op, ast.UAdd):
            return +value
        if isinstance(node.op, ast.Not):
            return not value
        raise CalcError(f"operator {type(node.op).__name__} is not allowed")

    def _BinOp(self, node: ast.BinOp) -> Any:
        fn = _BINOPS.get(type(node.op))
        if fn is None:
            raise CalcError(f"operator {type(node.op).__name__} is not allowed")
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(right, (int, float)) and abs(right) > _MAX_EXPONENT:
            raise CalcError(f"exponent {right} exceeds {_MAX_EXPONENT}")
        result = fn(left, right)
        if isinstance(result, complex):
            raise CalcError("result is a complex number")
        if isinstance(result, (int, float)) and abs(result) > _MAX_MAGNITUDE:
            raise CalcError("result is too large")
        return result

    def _BoolOp(self, node: ast.BoolOp) -> Any:
        values = [self.visit(v) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)

    def _Compare(self, node: ast.Compare) -> bool:
        left = self.visit(node.left)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            fn = _CMPOPS.get(type(op))
            if fn is None:
                raise CalcError(f"comparison {type(op).__name__} is not allowed")
            right = self.visit(comp)
            if not fn(left, right):
                return False
            left = right
        return True

    def _IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)

    def _Call(self, node: ast.Call) -> Any:
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
            name = node.func.id if isinstance(node.func, ast.Name) else type(node.func).__name__
            raise CalcError(f"function {name!r} is not allowed (allowed: {', '.join(sorted(_FUNCS))})")
        if node.keywords:
            raise CalcError("keyword arguments are not allowed")
        return _FUNCS[node.func.id](*[self.visit(a) for a in node.args])

    def _Tuple(self, node: ast.Tuple) -> Any:
        raise CalcError("tuples are not allowed; write one expression")


def extract_number(text: Any) -> float | None:
    """The first number written in ``text`` (``"$1,250.50 per week"`` -> 1250.5), else None.

    Numbers and bools pass through (bools are not numbers here: returns None).
    """
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text)
    if not isinstance(text, str):
        return None
    m = _NUMBER.search(text.replace("−", "-"))
    if m is None:
        return None
    return float(m.group(0).replace(",", ""))
