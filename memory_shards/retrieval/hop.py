"""Second hop: a lexical query per first hit, made of the question and that hit's new words.

Why: a multi-hop question names one thing and its answer is told where another thing is named;
the question's first hits hold the bridging word, and a second BM25 query with it finds the memory
that holds the answer. Each first hit gets its own query, so each hop follows one direction (pooled
pseudo-relevance feedback over the first hits, measured worse by leave-one-conversation-out on the
LoCoMo dev file, pulls in more memories of the first hits' single topic and was removed;
``loadtests/results/locomo-dev-feedback-loo.md``).

For each of the first ``hop_hits`` fused hits ``h``::

    hop_query(h) = question + " " + up to hop_terms words of h's main text whose stem is not in the question
                   (capitalised words inside a sentence first: names, places; then the longest words)

Numbers and calendar words are skipped: a date in a hit points back to its own day, not to a new
thing. The hop queries run concurrently on the lexical side only (no embedding), and their lists
join the fusion with weight ``hop_weight`` (see ``HybridRetriever``).
"""

from __future__ import annotations

import re

from ._text import analyse

__all__ = ["hop_query"]

_TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)
_SENTENCE_END = re.compile(r"[.!?:]\s*$")

# NOTE: months and weekdays name when something was said, not what it was about.
_CALENDAR = frozenset(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec "
    "monday tuesday wednesday thursday friday saturday sunday today yesterday tomorrow".split()
)


def hop_query(query: str, text: str, n_terms: int) -> str | None:
    """``query`` plus up to ``n_terms`` new words of ``text``; None when ``text`` adds none.

    Example:
        >>> hop_query("What country is Alice's grandma from?",
        ...           "Alice said on 3 May 2023: This necklace from Lena was my grandma's.", 2)
        "What country is Alice's grandma from? Lena necklace"
    """
    if n_terms <= 0:
        return None
    have = set(analyse(query))
    names: list[str] = []
    words: list[str] = []
    seen: set[str] = set()
    start = 0
    for m in _TOKEN.finditer(text):
        word = m.group(0)
        first = start == 0 or bool(_SENTENCE_END.search(text[:m.start()]))
        start += 1
        if word.isdigit() or word.lower() in _CALENDAR:
            continue
        stems = analyse(word)
        if not stems or stems[0] in have or stems[0] in seen:
            continue
        seen.add(stems[0])
        (names if word[0].isupper() and not first else words).append(word)
    # NOTE: longer words first among the common ones (a cheap proxy for rarer, more specific words);
    # ties keep text order (sorted is stable).
    chosen = (names + sorted(words, key=lambda w: -len(w)))[:n_terms]
    return f"{query} {' '.join(chosen)}" if chosen else None
