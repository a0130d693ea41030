"""The routing hint a tool declares: when a question calls for it, from the question's own words.

A :class:`RoutingHint` holds case-insensitive regexes; it scores a question for its tool, binds
argument values found in it and spots malformed ids. The rules that compare the hints of a
tenant's tools and decide the route are in :mod:`recallserve.serve.agent.routing`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from pydantic import Field, field_validator, model_validator

from recallserve.kernels import StrictModel

__all__ = ["RoutingHint", "ci_pattern", "NOT_AFTER_WORD", "NOT_BEFORE_WORD"]

# NOTE: ``\w`` includes Han characters, so "订单104208" has a word character before the id and
# ``(?<![\w-])`` rejects it. Chinese is written without spaces (issue 39): an id or a place name
# next to Han characters is still its own token; only a Latin letter, a digit or "_" (or "-")
# beside it makes it part of a longer one. English text matches exactly as with ``\w``.
_HAN = "\u3400-\u4dbf\u4e00-\u9fff"
#: Lookbehind: the previous character is no Latin/digit word character nor "-" (a Han one is fine).
NOT_AFTER_WORD = rf"(?<![^\W{_HAN}]|-)"
#: Lookahead: the next character is no Latin/digit word character nor "-" (a Han one is fine).
NOT_BEFORE_WORD = rf"(?![^\W{_HAN}]|-)"

#: Chinese verbs of "it happened / it was reported" that take 过 for an earlier case (出现过, 投诉过):
#: one list for the history questions below and the answer checks' claims of presence and absence.
ZH_HAPPENED = "出现|发生|遇到|碰到|报修|反映|投诉|反馈"
#: A question in Chinese about earlier cases or how something was fixed: 以前发生过吗, 之前的工单,
#: 出现过 / 遇到过 / 报过, 开过工单, 怎么修好的, 类似的案例. Shared by the routing of the memory search
#: (such a question searches past cases) and the answer checks (it asks for history).
ZH_HISTORY = (r"(?:之前|以前|此前|过去|曾经)\S{0,8}?(?:过|的(?:工单|记录|案例|问题|维修))"
              r"|(?:怎么|如何|怎样)(?:修|解决|处理|维修|弄好|搞定)|类似的?(?:案例|情况|问题|工单|故障)"
              rf"|(?:{ZH_HAPPENED}|报|提)过|开过\S{{0,4}}?(?:工单|单)")


@lru_cache(maxsize=512)
def ci_pattern(regex: str) -> re.Pattern[str]:
    """``regex`` compiled case-insensitively (cached: hints are matched against every question)."""
    return re.compile(regex, re.IGNORECASE)


def _check_patterns(values: Sequence[str], field: str) -> None:
    for i, p in enumerate(values):
        try:
            re.compile(p)
        except re.error as exc:
            raise ValueError(f"{field}[{i}]: invalid regex {p!r}: {exc}") from None


class RoutingHint(StrictModel):
    """When a question calls for a tool (all patterns are case-insensitive Python regexes)."""

    requires: list[str] = Field(
        default_factory=list, max_length=4,
        description="Entity patterns that must all match for the tool to be a candidate (each adds 2 to its score).",
    )
    keywords: list[str] = Field(
        default_factory=list, max_length=32,
        description="If not empty, at least one must match too (adds 1 to the score).",
    )
    prefer: list[str] = Field(
        default_factory=list, max_length=32,
        description="Each pattern that matches adds 1: ranks tools that take the same entity.",
    )
    bind: dict[str, str] = Field(
        default_factory=dict, max_length=8,
        description="Argument -> pattern; the values found become the argument's enum in the grammar "
        "(group 1 if the pattern has a group, else the whole match).",
    )
    aliases: dict[str, dict[str, str]] = Field(
        default_factory=dict, max_length=8,
        description="Argument -> {found text, lower case -> value}: a bound value written another way "
        "(a city for its time zone).",
    )
    alias_patterns: dict[str, dict[str, str]] = Field(
        default_factory=dict, max_length=8,
        description="Argument -> {value: pattern}: a bound text that the pattern matches (searched, in this order) "
        "becomes that value; for phrasings too many to list as aliases (\"haven't reached the customer yet\" -> "
        "not_delivered).",
    )
    near_miss: list[str] = Field(
        default_factory=list, max_length=8,
        description="Patterns of a malformed version of the entity (e.g. a 5-digit order id): answer directly and ask.",
    )
    spellings: dict[str, str] = Field(
        default_factory=dict, max_length=8,
        description="Pattern -> replacement (re.sub template): another way people write the entity, rewritten to its "
        "canonical form before any rule reads the question (\"B2301\", \"2301批次\" -> \"B-2301\"). Unambiguous forms only: "
        "a malformed id belongs in near_miss (the user is asked).",
    )

    @field_validator("requires", "keywords", "prefer", "near_miss")
    @classmethod
    def _compile(cls, v: list[str], info: Any) -> list[str]:
        _check_patterns(v, info.field_name)
        return v

    @field_validator("bind")
    @classmethod
    def _compile_bind(cls, v: dict[str, str]) -> dict[str, str]:
        for arg, p in v.items():
            _check_patterns([p], f"bind.{arg}")
        return v

    @field_validator("spellings")
    @classmethod
    def _compile_spellings(cls, v: dict[str, str]) -> dict[str, str]:
        _check_patterns(list(v), "spellings")
        for p, replacement in v.items():
            groups = re.compile(p).groups
            for ref in re.findall(r"\\(\d+)|\\g<(\d+)>", replacement):
                if int(ref[0] or ref[1]) > groups:
                    raise ValueError(f"spellings[{p!r}]: the replacement {replacement!r} refers to group "
                                     f"{ref[0] or ref[1]}, the pattern has {groups}")
        return v

    def respell(self, text: str) -> str:
        """``text`` with the entity's other spellings (:attr:`spellings`) in canonical form."""
        for pattern, replacement in self.spellings.items():
            text = ci_pattern(pattern).sub(replacement, text)
        return text

    @field_validator("alias_patterns")
    @classmethod
    def _compile_alias_patterns(cls, v: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for arg, table in v.items():
            _check_patterns(list(table.values()), f"alias_patterns.{arg}")
        return v

    @field_validator("aliases")
    @classmethod
    def _lower_aliases(cls, v: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        return {arg: {k.lower(): value for k, value in table.items()} for arg, table in v.items()}

    @model_validator(mode="after")
    def _aliases_bound(self) -> RoutingHint:
        for field, table in (("aliases", self.aliases), ("alias_patterns", self.alias_patterns)):
            for arg in table:
                if arg not in self.bind:
                    raise ValueError(f"{field}.{arg}: the argument has no bind pattern")
        return self

    def score(self, text: str) -> int | None:
        """The tool's score for ``text``, or None when it is not a candidate."""
        if not all(ci_pattern(p).search(text) for p in self.requires):
            return None
        keyword = any(ci_pattern(p).search(text) for p in self.keywords)
        if self.keywords and not keyword:
            return None
        return 2 * len(self.requires) + int(keyword) + sum(1 for p in self.prefer if ci_pattern(p).search(text))

    def bindings(self, text: str) -> dict[str, list[str]]:
        """Argument -> distinct values found in ``text`` (in order of appearance); absent args are omitted."""
        out: dict[str, list[str]] = {}
        for arg, p in self.bind.items():
            rx = ci_pattern(p)
            found = [m.group(1) if rx.groups else m.group(0) for m in rx.finditer(text)]
            alias = self.aliases.get(arg, {})
            values = list(dict.fromkeys(self._alias(arg, alias.get(v.lower(), v)) for v in found if v))
            if values:
                out[arg] = values
        return out

    def _alias(self, arg: str, value: str) -> str:
        """``value`` mapped through the argument's :attr:`alias_patterns` (the first that matches), else itself."""
        for target, pattern in self.alias_patterns.get(arg, {}).items():
            if ci_pattern(pattern).search(value):
                return target
        return value

    def near_missed(self, text: str) -> bool:
        """Whether a malformed version of the tool's entity is in ``text``."""
        return self.near_miss_text(text) is not None

    def near_miss_text(self, text: str) -> str | None:
        """The first malformed version of the tool's entity in ``text`` (e.g. ``order 10423``), or None."""
        for p in self.near_miss:
            m = ci_pattern(p).search(text)
            if m:
                return m.group(0).strip()
        return None
