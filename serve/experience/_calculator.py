"""A safe arithmetic calculator over Python's AST (no ``eval``), used by verification items.

Only a whitelist of nodes is evaluated: numbers, ``+ - * / // % **``, unary signs, chained
comparisons, ``and/or/not``, ``a if c else b``, names bound in ``variables`` and calls to a
few math functions. Anything else (attributes, subscripts, lambdas, strings, comprehensions)
raises :class:`CalcError` naming the construct. Values may be plain numbers or objects that
implement the arithmetic dunders (the unit checker passes :class:`~._units.Quantity` values).

Bounds (a hostile record must cost milliseconds, see issue 14): every operation is capped on its
own (expression length, syntax nodes, exponents, the size of integers and results, ``round``'s
digits), so one step costs microseconds; a :class:`WorkBudget` caps the number of steps and the
time of everything evaluated for one record. Exceeding a cap raises :class:`CalcError` naming it
(:class:`BudgetExceeded` for the budget), which a verification check reports as its failure.

The current budget travels in a context variable (:func:`budget_scope`), so the unit parser and
the rule table, which call :func:`evaluate` themselves, draw on the record's budget without
passing it along; a call outside any scope gets a fresh budget of the defaults.

Example:
    >>> evaluate("2 * (3 + 4) ** 2 - 15%")
    97.85
"""

from __future__ import annotations

import ast
import math
import operator
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["CalcError", "NotAnExpression", "LimitExceeded", "BudgetExceeded", "WorkBudget", "budget_scope", "evaluate",
           "normalise_expression",
           "extract_number", "MAX_EXPR_CHARS"]


class CalcError(ValueError):
    """An expression is malformed, unsafe or cannot be evaluated."""


class NotAnExpression(CalcError):
    """The text is no calculator expression (prose, an unknown name, a construct outside the whitelist).

    Apart from :class:`CalcError` so a verifier can tell a check that cannot be executed (says
    nothing of the answer: ``not_run``) from one that was executed and failed (division by zero,
    a dimension error, a cap).
    """


class LimitExceeded(CalcError):
    """An expression or value passes a size cap: the check fails on it, with no fallback reading."""


class BudgetExceeded(LimitExceeded):
    """The record's verification budget (steps or time) is spent."""


# NOTE: bounds against denial of service: 2 ** 10**9 or round(5, -10**7) would hang the worker.
MAX_EXPR_CHARS = 500
_MAX_NODES = 200
# NOTE: deep nesting is refused before Python's parser sees it: its C recursion differs by thread
# and version (in a worker thread 240 parentheses raised SystemError, not SyntaxError).
_MAX_NESTING = 32
_SIGN_RUN = re.compile(r"(?:[-+~]\s*){%d,}" % _MAX_NESTING)
_MAX_EXPONENT = 1000.0
# NOTE: 1e300 keeps every value a finite float; an int up to it is ~1000 bits, so + - * // % on
# two of them take microseconds. Results past it are refused, and a power is refused before it is
# computed when its size (exponent * log10|base|) would pass it.
_MAX_MAGNITUDE = 1e300
_MAX_LOG10 = 300.0
# NOTE: round(5, -n) on an int computes 10**n; 100 digits covers every real use of round.
_MAX_NDIGITS = 100
# NOTE: parsing costs about as much as evaluating this many nodes; charged to the budget.
_PARSE_STEPS = 20
# NOTE: an honest check takes 50-100 steps (the eval seeds: at most 97 per check), so 6000 covers
# a full 32-check record with room to spare, and costs 10-40 ms of CPU at 2-6 us per step; 0.1 s
# of the verifying thread's CPU time is the backstop for steps that cost more than they count.
# It is CPU time, not wall clock: measured at load 10-12, a wall-clock budget ran out while the
# thread waited for a core, so the same record's verdict changed with the machine's load (the
# worker pool's verify_timeout_ms is the wall-clock bound of the whole verification).
DEFAULT_MAX_STEPS = 6_000
DEFAULT_SECONDS = 0.1
_CLOCK_EVERY = 64  # NOTE: steps between clock reads (a read ~50 ns, a step ~1 us)


class WorkBudget:
    """Steps and a deadline shared by everything evaluated for one record.

    Args:
        max_steps: evaluation steps in total (a syntax node is one, a parse :data:`_PARSE_STEPS`).
        seconds: CPU time of the constructing thread (``time.thread_time``) from construction;
            the budget is drawn on by that thread only (the verifier's).
    """

    def __init__(self, max_steps: int = DEFAULT_MAX_STEPS, seconds: float = DEFAULT_SECONDS) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps: must be >= 1, got {max_steps}")
        if not seconds > 0:
            raise ValueError(f"seconds: must be > 0, got {seconds}")
        self.max_steps, self.seconds = max_steps, seconds
        self.used, self.spent = 0, False
        self._deadline = time.thread_time() + seconds
        self._next_clock = _CLOCK_EVERY

    def take(self, steps: int = 1) -> None:
        """Use ``steps``; raises :class:`BudgetExceeded` (and stays spent) past either limit."""
        self.used += steps
        if not self.spent and self.used > self.max_steps:
            self.spent = True
        elif not self.spent and self.used >= self._next_clock:
            self._next_clock = self.used + _CLOCK_EVERY
            self.spent = time.thread_time() > self._deadline
        if self.spent:
            raise BudgetExceeded(self.reason())

    def reason(self) -> str:
        """Names both limits, so the record's author sees what to shrink."""
        return (f"the record's verification budget is spent ({self.max_steps} evaluation steps or "
                f"{self.seconds * 1e3:.0f} ms per record)")


_BUDGET: ContextVar[WorkBudget | None] = ContextVar("recallserve_verify_budget", default=None)


@contextmanager
def budget_scope(budget: WorkBudget) -> Iterator[WorkBudget]:
    """Make ``budget`` the one every :func:`evaluate` inside the ``with`` block draws on.

    Example:
        >>> with budget_scope(WorkBudget(max_steps=10)) as b:
        ...     evaluate("1 + 1")
        2
        >>> b.used > 0
        True
    """
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def _round(number: Any, ndigits: Any = None) -> Any:
    if ndigits is None:
        return round(number)
    if isinstance(ndigits, bool) or not isinstance(ndigits, int) or abs(ndigits) > _MAX_NDIGITS:
        raise LimitExceeded(f"round: ndigits must be an integer in [-{_MAX_NDIGITS}, {_MAX_NDIGITS}], got {ndigits!r}")
    return round(number, ndigits)


def _check_size(value: Any, what: str) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > _MAX_MAGNITUDE:
        raise LimitExceeded(f"{what} is too large (more than {_MAX_MAGNITUDE:g} in magnitude)")
    return value


def _check_power(base: Any, exponent: Any) -> None:
    """Refuse a power whose exponent or result would be too large, before computing it."""
    if hasattr(exponent, "dims"):  # NOTE: a Quantity; Quantity.__pow__ refuses a dimensioned one
        exponent = exponent.value
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        return
    if abs(exponent) > _MAX_EXPONENT:
        raise LimitExceeded(f"exponent {exponent:g} exceeds {_MAX_EXPONENT:g}")
    if isinstance(base, (int, float)) and not isinstance(base, bool) and abs(base) > 1 and exponent > 0:
        if exponent * math.log10(abs(base)) > _MAX_LOG10:
            raise LimitExceeded(f"power {base:g} ** {exponent:g} is too large (more than 1e{_MAX_LOG10:.0f})")

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
    "round": _round,
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


def _nesting(text: str) -> int:
    """Deepest bracket nesting of ``text``."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


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
    if len(expression) > MAX_EXPR_CHARS:
        raise LimitExceeded(f"expression longer than {MAX_EXPR_CHARS} characters")
    budget = _BUDGET.get() or WorkBudget()
    budget.take(_PARSE_STEPS)
    text = normalise_expression(expression)
    if _nesting(text) > _MAX_NESTING or _SIGN_RUN.search(text):
        raise LimitExceeded(f"expression is nested more than {_MAX_NESTING} levels deep")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise NotAnExpression(f"cannot parse expression {expression!r}: {getattr(exc, 'msg', exc)}") from None
    except (MemoryError, RecursionError, SystemError):  # NOTE: the parser's own stack, as above
        raise LimitExceeded(f"expression is nested more than {_MAX_NESTING} levels deep") from None
    nodes = _count_nodes(tree)
    if nodes > _MAX_NODES:
        raise LimitExceeded(f"expression has more than {_MAX_NODES} syntax nodes")
    budget.take(nodes)  # NOTE: parsing and counting cost about one step per node
    env = dict(_CONSTS)
    env.update(variables or {})
    try:
        return _Evaluator(env, budget).visit(tree.body)
    except ZeroDivisionError:
        raise CalcError(f"division by zero in {expression!r}") from None
    except (OverflowError, ValueError, TypeError, ArithmeticError, RecursionError) as exc:
        if isinstance(exc, CalcError):
            raise
        raise CalcError(f"cannot evaluate {expression!r}: {exc}") from None


class _Evaluator:
    """Recursive evaluator over the whitelisted node types."""

    def __init__(self, env: Mapping[str, Any], budget: WorkBudget) -> None:
        self.env = env
        self.budget = budget

    def visit(self, node: ast.AST) -> Any:
        self.budget.take()
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise NotAnExpression(f"{type(node).__name__} is not allowed in a calculator expression")
        return method(node)

    def _Constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise NotAnExpression(f"constant {node.value!r} is not a number")
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise LimitExceeded(f"constant {node.value!r} is not finite")
        return _check_size(node.value, "constant")

    def _Name(self, node: ast.Name) -> Any:
        if node.id not in self.env:
            raise NotAnExpression(f"unknown name {node.id!r}")
        return _check_size(self.env[node.id], f"value of {node.id!r}")

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
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        result = fn(left, right)
        if isinstance(result, complex):
            raise CalcError("result is a complex number")
        return _check_size(result, "result")

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
            raise NotAnExpression(f"function {name!r} is not allowed (allowed: {', '.join(sorted(_FUNCS))})")
        if node.keywords:
            raise NotAnExpression("keyword arguments are not allowed")
        return _check_size(_FUNCS[node.func.id](*[self.visit(a) for a in node.args]), f"result of {node.func.id}")

    def _Tuple(self, node: ast.Tuple) -> Any:
        raise NotAnExpression("tuples are not allowed; write one expression")


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
