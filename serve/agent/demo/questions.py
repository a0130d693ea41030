"""The shipped tool-choice question sets of the demo world (``recallserve eval agent``, load tests).

``tuned`` (``questions.json``): 40 questions the prompts, descriptions and routing hints were
developed against, 30 expecting a tool call, 10 none; ``holdout`` (``questions_holdout.json``):
40 more written without seeing the rules or the tuned set, 28 with a tool, 12 without; ``all``: both.
Each question is ``{"q": text, "tool": name or null, "args"/"args_contain"/"result": expected}``.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

__all__ = ["QUESTION_SETS", "load_questions"]

QUESTION_SETS = {"tuned": ("questions.json",), "holdout": ("questions_holdout.json",),
                 "all": ("questions.json", "questions_holdout.json")}


def load_questions(which: str = "tuned") -> list[dict[str, Any]]:
    """A shipped tool-choice question set.

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
        text = resources.files("serve.agent.demo").joinpath(name).read_text(encoding="utf-8")
        out.extend(json.loads(text))
    return out
