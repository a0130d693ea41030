"""Text analysis for the lexical (BM25) side of retrieval: tokens, stop words, stems.

``analyse(text)`` lower-cases, splits on Unicode word characters (apostrophes dropped, so
"Caroline's" -> "caroline", "s"), removes English stop words and one-character tokens, and
reduces each token to its Snowball (Porter 2) stem ("adoption agencies" -> "adopt", "agenc").
Numbers are kept as tokens ("2023", "7"), because dates and amounts are strong lexical evidence.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache

__all__ = ["analyse", "STOP_WORDS"]

_WORD = re.compile(r"[^\W_]+", re.UNICODE)

# NOTE: a compact English stop list (function words, auxiliaries, pronoun forms, question
# words). Question words matter: "what/when/who/how" occur in every query and in many turns,
# and would otherwise only add noise to the BM25 ranking.
STOP_WORDS: frozenset[str] = frozenset(
    """
    a about above after again against all also am an and any are aren as at be because been before
    being below between both but by can cannot could couldn did didn do does doesn doing don down
    during each few for from further get got had hadn has hasn have haven having he her here hers
    herself him himself his how i if in into is isn it its itself just let ll me more most mustn my
    myself no nor not now of off on once only or other ought our ours ourselves out over own re
    same shan she should shouldn so some such than that the their theirs them themselves then there
    these they this those through to too under until up us very was wasn we were weren what when
    where which while who whom whose why will with won would wouldn ve you your yours yourself
    yourselves yeah oh hey hi wow really thanks thank
    """.split()
)

_stemmer_lock = threading.Lock()
_stemmer = None


def _stem_fn():
    global _stemmer
    with _stemmer_lock:
        if _stemmer is None:
            try:
                import Stemmer
            except ImportError as exc:  # pragma: no cover - base dependency
                raise ImportError("lexical retrieval needs PyStemmer (pip install PyStemmer==3.1.0)") from exc
            _stemmer = Stemmer.Stemmer("english")
        return _stemmer


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    return _stem_fn().stemWord(word)


def analyse(text: str) -> list[str]:
    """Index terms of ``text`` in order (duplicates kept: BM25 counts them).

    Example:
        >>> analyse("When did Caroline go to the LGBTQ support groups?")
        ['carolin', 'go', 'lgbtq', 'support', 'group']
    """
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if word in STOP_WORDS or (len(word) < 2 and not word.isdigit()):
            continue
        out.append(_stem(word))
    return out
