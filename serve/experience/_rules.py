"""The registered rule table that ``regulatory_check`` verification items are checked against.

A rule is a named calculator expression over named inputs. A *formula* rule computes a number
(``overtime_pay = 40*rate + 1.5*rate*max(0, hours-40)``); a *condition* rule is a comparison
that must hold (``speed <= 50``). Rules come from configuration, never from model output: a
trace may only *cite* a rule id, and the code evaluates the registered expression.

Example:
    >>> table = RuleTable([Rule(id="OT-1", description="overtime", expression="40*rate + 1.5*rate*max(0, hours-40)",
    ...                         variables=["rate", "hours"])])
    >>> table.evaluate("OT-1", {"rate": 20, "hours": 45})
    950.0
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import Field, field_validator

from recallserve.kernels import StrictModel
from recallserve.serve.experience._calculator import CalcError, evaluate, extract_number

__all__ = ["Rule", "RuleTable", "RuleError", "constraint_rules"]

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class RuleError(KeyError):
    """An unknown rule id or missing rule input."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


class Rule(StrictModel):
    """One registered rule."""

    id: str = Field(min_length=1, max_length=64, description="Rule id cited by traces, e.g. 'OT-1'.")
    description: str = Field(min_length=1, max_length=500, description="The rule in words (shown to the model).")
    expression: str = Field(min_length=1, max_length=500, description="Calculator expression over `variables`.")
    variables: list[str] = Field(default_factory=list, max_length=16, description="Input names the expression uses.")
    domain: str = Field(default="general", max_length=64, description="Task domain the rule belongs to.")

    @field_validator("id")
    @classmethod
    def _check_id(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError(f"rule id {v!r} must be letters, digits and _.:- (at most 64)")
        return v

    @field_validator("variables")
    @classmethod
    def _check_vars(cls, v: list[str]) -> list[str]:
        for name in v:
            if not _VAR.match(name):
                raise ValueError(f"rule variable {name!r} is not an identifier")
        return v


def _canon(rule_id: str) -> str:
    return re.sub(r"[\s_]+", "-", rule_id.strip()).upper()


class RuleTable:
    """Rules by id (ids compared case-insensitively, ``_`` and spaces read as ``-``)."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self._rules: dict[str, Rule] = {}
        for rule in rules:
            self.register(rule)

    def register(self, rule: Rule) -> None:
        """Add a rule; its expression must parse (checked by evaluating with all inputs = 1)."""
        try:
            evaluate(rule.expression, dict.fromkeys(rule.variables, 1.0))
        except CalcError as exc:
            raise ValueError(f"rule {rule.id!r}: expression: {exc}") from None
        key = _canon(rule.id)
        if key in self._rules:
            raise ValueError(f"rule {rule.id!r} is already registered")
        self._rules[key] = rule

    def get(self, rule_id: str) -> Rule:
        """The rule with ``rule_id``; raises RuleError naming the id when absent."""
        rule = self._rules.get(_canon(rule_id))
        if rule is None:
            raise RuleError(f"rule {rule_id!r} is not registered")
        return rule

    def find_in(self, text: str) -> Rule | None:
        """The first registered rule whose id appears in ``text`` (for loosely written items)."""
        canon = _canon(text)
        for key, rule in self._rules.items():
            if re.search(rf"(?<![A-Z0-9]){re.escape(key)}(?![A-Z0-9])", canon):
                return rule
        return None

    def extended(self, rules: Iterable[Rule]) -> RuleTable:
        """This table plus ``rules`` whose ids it does not hold (a registered rule always wins)."""
        out = RuleTable(self._rules.values())
        for rule in rules:
            if rule.id not in out:
                out.register(rule)
        return out

    def __contains__(self, rule_id: object) -> bool:
        return isinstance(rule_id, str) and _canon(rule_id) in self._rules

    def __len__(self) -> int:
        return len(self._rules)

    def rules(self, domain: str | None = None) -> list[Rule]:
        """All rules, or those of one domain."""
        return [r for r in self._rules.values() if domain is None or r.domain == domain]

    def evaluate(self, rule_id: str, inputs: Mapping[str, Any]) -> float | bool:
        """Evaluate a rule on ``inputs`` (numbers, or strings holding a number).

        Raises:
            RuleError: unknown rule or a missing input (named).
            CalcError: the expression fails on these inputs.
        """
        rule = self.get(rule_id)
        values: dict[str, float] = {}
        for name in rule.variables:
            raw = _lookup(inputs, name)
            num = extract_number(raw) if raw is not None else None
            if num is None:
                raise RuleError(f"rule {rule.id!r} needs input {name!r} (a number)")
            values[name] = num
        result = evaluate(rule.expression, values)
        return result if isinstance(result, bool) else float(result)


def _lookup(inputs: Mapping[str, Any], name: str) -> Any:
    """Input by exact name, else case-insensitively."""
    if name in inputs:
        return inputs[name]
    lowered = {str(k).lower(): v for k, v in inputs.items()}
    return lowered.get(name.lower())


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def constraint_rules(constraints: Iterable[Any], quantities: Iterable[str]) -> list[Rule]:
    """Condition rules of a record's structured constraints that code can evaluate.

    A constraint ``{"regulation": R, "threshold": t, "quantity": Q, "operator": op}`` (the design's
    ``context.structured.constraints``, with ``quantity`` naming what the limit bounds) becomes the
    rule ``R: Q op t``, where ``Q`` is a stated quantity or an expression of stated quantities
    (``non_standard / total_fund``). A constraint without a regulation, a threshold or a quantity
    whose every name is stated gives none: its checks stay unverified, as the author wrote them.
    """
    names = set(quantities)
    out: list[Rule] = []
    seen: set[str] = set()
    for c in constraints:
        reg, thr, q = getattr(c, "regulation", None), getattr(c, "threshold", None), getattr(c, "quantity", None)
        if not reg or thr is None or not q or not _ID.match(reg) or _canon(reg) in seen:
            continue
        used = sorted(set(_NAME.findall(q)))
        if not used or not set(used) <= names:
            continue
        rule = Rule(id=reg, description=c.render()[:500], expression=f"({q}) {c.operator} {thr!r}"[:500],
                    variables=used[:16])
        try:
            RuleTable([rule])
        except ValueError:
            continue
        seen.add(_canon(reg))
        out.append(rule)
    return out
