"""Query rewriting without an LLM: drop the scaffolding of a question from the lexical query.

A question such as "What kind of books does Caroline like to read?" carries words ("kind",
"like", "think", "likely") that occur in a large share of chat turns and only add noise to the
BM25 ranking; the dense side keeps the full question (MiniLM was trained on question/answer
pairs and reads the question form well). Plug any other rewriter (an LLM, a spelling fixer)
through :class:`~recallserve.memory_shards.retrieval.hybrid.QueryRewriter`.
"""

from __future__ import annotations

import re

from .hybrid import RewrittenQuery

__all__ = ["KeywordRewriter", "QUESTION_SCAFFOLD"]

# NOTE: words frequent in questions about a person's life and common in chat turns.
QUESTION_SCAFFOLD: frozenset[str] = frozenset(
    "kind type sort like likely think thinks feel feels would might describe mention mentioned "
    "ever something anything many much often".split()
)

_WORD = re.compile(r"\S+")


class KeywordRewriter:
    """``RewrittenQuery(dense=query, lexical=query without scaffold words)``.

    Example:
        >>> KeywordRewriter()("What kind of books does Caroline like?").lexical
        'What of books does Caroline'
    """

    def __init__(self, scaffold: frozenset[str] = QUESTION_SCAFFOLD) -> None:
        self.scaffold = scaffold

    def __call__(self, query: str) -> RewrittenQuery:
        kept = [w for w in _WORD.findall(query) if re.sub(r"\W", "", w.lower()) not in self.scaffold]
        lexical = " ".join(kept).rstrip("?").rstrip() or query
        return RewrittenQuery(dense=query, lexical=lexical)
