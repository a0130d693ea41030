"""The shipped question sets of the demo world (``recallserve eval agent``, load tests).

``tuned`` (``questions.json``): 40 questions the prompts, descriptions and routing hints were
developed against, 30 expecting a tool call, 10 none; ``holdout`` (``questions_holdout.json``):
40 more written without seeing the rules or the tuned set, 28 with a tool, 12 without; ``all``: both.
Chinese (issue 39): ``zh-tuned`` (``questions_zh.json``, 14: the Chinese routing words were written
against it) and ``zh-holdout`` (``questions_zh_holdout.json``, 16, written at the same time and not
looked at while the rules were changed); their facts accept Chinese wordings (已发货 for shipped).
``compound`` (``questions_compound.json``, 10) and ``compound_holdout`` (``questions_compound_holdout.json``,
10, never tuned on): questions with several parts (history plus live data, two ids, a status filter,
a true absence next to a look-up), written for issue 40; their ``must_not`` holds claims of absence
where the world has the history.
``compound_holdout2`` (``questions_compound_holdout2.json``, 12) and ``zh-holdout2``
(``questions_zh_holdout2.json``, 16): the same kinds as ``compound`` and ``zh-tuned``, written in session 3
by someone who had not seen the rules or any eval result; never tuned on.
``compound_holdout3`` (``questions_compound_holdout3.json``, 12) and ``zh-holdout3``
(``questions_zh_holdout3.json``, 16): the same kinds again, written in session 3 (third set) by someone who had
not seen the rules or any eval result; never tuned on.
The sets below were each run once, clean, and then read: rules were changed after reading their misses,
so their later figures are no held-out measure (``loadtests/results/eval-agent-compound.md``,
``docs/languages.md`` say which runs are clean).
``compound_holdout4`` (``questions_compound_holdout4.json``, 16) and ``zh-holdout4``
(``questions_zh_holdout4.json``, 20): the same kinds again, written in session 4 (fourth set) by someone who had
not seen the rules or any eval result.
``compound_holdout5`` (``questions_compound_holdout5.json``, 16) and ``zh-holdout5``
(``questions_zh_holdout5.json``, 20): the same kinds again, written in session 4 (fifth set) by someone who had
not seen the rules or any eval result.
``compound_holdout6`` (``questions_compound_holdout6.json``, 16): the same kinds as ``compound``, written in session 4
(sixth set) by someone who had not seen the rules or any eval result.
``zh-holdout6`` (``questions_zh_holdout6.json``, 20): the same kinds as ``zh-tuned``, written in session 4
(sixth Chinese set) by someone who had not seen the rules or any eval result.
``zh-holdout7`` (``questions_zh_holdout7.json``, 20): the same kinds as ``zh-tuned``, written in session 5
(seventh Chinese set) by someone who had not seen the rules or any eval result.
``zh-holdout8`` (``questions_zh_holdout8.json``, 20): the same kinds as ``zh-tuned``, written in session 5
(eighth Chinese set) by someone who had not seen the rules or any eval result (its misses not yet
read; its questions were seen once in the session's last review).
``compound_holdout7`` (``questions_compound_holdout7.json``, 16): the same kinds as ``compound``, written in session 5
(seventh set) by someone who had not seen the rules or any eval result (its misses read in session 6, after its
clean run).
``zh-holdout9`` (``questions_zh_holdout9.json``, 20): the same kinds as ``zh-tuned``, written in session 6
(ninth Chinese set) by someone who had not seen the rules or any eval result; two of its history questions
were put in the sets' form (the search tool, an absence's wording) before its first run.
``compound_holdout8`` (``questions_compound_holdout8.json``, 16): the same kinds as ``compound``, written in session 6
(eighth set) by someone who had not seen the rules or any eval result (its misses read in session 6, after its
clean run).
``compound_holdout9`` (``questions_compound_holdout9.json``, 16) and ``zh-holdout10``
(``questions_zh_holdout10.json``, 20): the same kinds again, written in session 7 by someone who had not
seen the rules, the code or any eval result (given only the world data, the tools' descriptions and one
earlier set's format); their writers' one-line summaries were read before the first run.
``compound_holdout10`` (``questions_compound_holdout10.json``, 16) and ``zh-holdout11``
(``questions_zh_holdout11.json``, 20): the same again, written later in session 7 the same way; nothing of
them was read before their first run (their writers reported only the counts of each kind); their misses
were read after it. ``compound_holdout11`` (``questions_compound_holdout11.json``, 16) and ``zh-holdout12``
(``questions_zh_holdout12.json``, 20): a third pair written the same way in session 7, run once on the
session's final rules. ``compound_holdout12`` (``questions_compound_holdout12.json``, 16) and ``zh-holdout13``
(``questions_zh_holdout13.json``, 20): a fourth pair, run once on the session's final code and once on the
session's starting code (a97f70b), to measure the session's rules held out.

Each question is one :class:`Question` (validated on load): the text, the expected tool call
(``tool``/``args``/``args_contain``/``result``) and the key facts its answer must state
(``facts``) and must not state (``must_not``), scored by :func:`recallserve.serve.agent.demo.facts.score_answer`.
The facts of the look-up questions come from the world data (``scripts/question_facts.py``).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from pydantic import Field, TypeAdapter, field_validator

from recallserve.kernels import StrictModel

__all__ = ["QUESTION_SETS", "Question", "load_questions"]

QUESTION_SETS = {"tuned": ("questions.json",), "holdout": ("questions_holdout.json",),
                 "all": ("questions.json", "questions_holdout.json"),
                 "zh-tuned": ("questions_zh.json",), "zh-holdout": ("questions_zh_holdout.json",),
                 "compound": ("questions_compound.json",), "compound_holdout": ("questions_compound_holdout.json",),
                 "compound_all": ("questions_compound.json", "questions_compound_holdout.json"),
                 "compound_holdout2": ("questions_compound_holdout2.json",),
                 "zh-holdout2": ("questions_zh_holdout2.json",),
                 "compound_holdout3": ("questions_compound_holdout3.json",),
                 "zh-holdout3": ("questions_zh_holdout3.json",),
                 "compound_holdout4": ("questions_compound_holdout4.json",),
                 "zh-holdout4": ("questions_zh_holdout4.json",),
                 "compound_holdout5": ("questions_compound_holdout5.json",),
                 "zh-holdout5": ("questions_zh_holdout5.json",),
                 "compound_holdout6": ("questions_compound_holdout6.json",),
                 "zh-holdout6": ("questions_zh_holdout6.json",),
                 "zh-holdout7": ("questions_zh_holdout7.json",),
                 "zh-holdout8": ("questions_zh_holdout8.json",),
                 "compound_holdout7": ("questions_compound_holdout7.json",),
                 "compound_holdout8": ("questions_compound_holdout8.json",),
                 "zh-holdout9": ("questions_zh_holdout9.json",),
                 "compound_holdout9": ("questions_compound_holdout9.json",),
                 "zh-holdout10": ("questions_zh_holdout10.json",),
                 "compound_holdout10": ("questions_compound_holdout10.json",),
                 "zh-holdout11": ("questions_zh_holdout11.json",),
                 "compound_holdout11": ("questions_compound_holdout11.json",),
                 "zh-holdout12": ("questions_zh_holdout12.json",),
                 "compound_holdout12": ("questions_compound_holdout12.json",),
                 "zh-holdout13": ("questions_zh_holdout13.json",),
                 "compound_holdout13": ("questions_compound_holdout13.json",),
                 "zh-holdout14": ("questions_zh_holdout14.json",),
                 "compound_holdout14": ("questions_compound_holdout14.json",),
                 "zh-holdout15": ("questions_zh_holdout15.json",),
                 "compound_holdout15": ("questions_compound_holdout15.json",),
                 "zh-holdout16": ("questions_zh_holdout16.json",),
                 "compound_holdout16": ("questions_compound_holdout16.json",),
                 "zh-holdout17": ("questions_zh_holdout17.json",)}


class Question(StrictModel):
    """One evaluation question and what a right answer to it looks like."""

    q: str = Field(min_length=1, max_length=2000, description="The user's question.")
    tool: str | None = Field(description="The tool the agent must call (null: none).")
    args: dict[str, Any] | None = Field(default=None, description="Arguments the call must have (compared as strings).")
    args_contain: dict[str, str] | None = Field(
        default=None, description="Argument -> a substring its value must contain (case-insensitive)."
    )
    result: float | None = Field(default=None, description="calculator: the result within 0.01.")
    note: str | None = Field(default=None, max_length=500, description="Why the expectation is what it is.")
    facts: list[str | list[str]] = Field(
        min_length=1, max_length=16,
        description="Key facts the answer must state; an item is a string or acceptable alternatives "
        "(see serve.agent.demo.facts).",
    )
    must_not: list[str] = Field(default_factory=list, max_length=16, description="Strings the answer must not contain.")

    @field_validator("facts")
    @classmethod
    def _facts_nonempty(cls, v: list[str | list[str]]) -> list[str | list[str]]:
        for i, f in enumerate(v):
            alts = [f] if isinstance(f, str) else f
            if not alts or not all(a.strip() for a in alts):
                raise ValueError(f"facts[{i}]: empty fact or alternative")
        return v


_QUESTIONS = TypeAdapter(list[Question])


def load_questions(which: str = "tuned") -> list[dict[str, Any]]:
    """A shipped question set, each question validated by :class:`Question`, as dicts (the keys
    the file sets).

    ``tuned``: the 40 questions the prompts, descriptions and routing hints were developed
    against; ``holdout``: 40 questions written afterwards by someone who saw neither (an honest
    measure of generalisation); ``all``: both.

    Example:
        >>> len(load_questions("all"))
        80
    """
    if which not in QUESTION_SETS:
        raise ValueError(f"questions: expected one of {sorted(QUESTION_SETS)}, got {which!r}")
    out: list[dict[str, Any]] = []
    for name in QUESTION_SETS[which]:
        text = resources.files("recallserve.serve.agent.demo").joinpath(name).read_text(encoding="utf-8")
        out.extend(q.model_dump(exclude_unset=True) for q in _QUESTIONS.validate_json(text))
    return out
