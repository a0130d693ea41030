"""Text analysis for the lexical (BM25) side of retrieval: tokens, stop words, stems; Chinese as bigrams.

``analyse(text)`` lower-cases, splits on Unicode word characters (apostrophes dropped, so
"Caroline's" -> "caroline", "s"), removes English stop words and one-character tokens, and
reduces each token to its Snowball (Porter 2) stem ("adoption agencies" -> "adopt", "agenc").
Numbers are kept as tokens ("2023", "7"), because dates and amounts are strong lexical evidence.

Chinese is written without spaces, so a run of Han characters would otherwise be one "word" as
long as the clause (issue 39: 5 of 8 right in Chinese vs 8 of 8 in English). Each Han run is cut
out of its word (``"e31是什么"`` -> ``"e31"`` + ``"是什么"``) and indexed as its overlapping character
bigrams (``"打印机"`` -> ``"打印", "印机"``; a one-character run stays one term), the CJK analysis
of Lucene's ``CJKBigramFilter``. Stemming applies to the Latin parts only. Bigrams were chosen over
jieba word segmentation by ``recallserve bench languages`` (docs/languages.md): on the bilingual set
bigrams ranked as well or better on both folds, with no dictionary to load (jieba: 0.6 s on first use).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from functools import lru_cache

__all__ = ["analyse", "cjk_bigrams", "STOP_WORDS", "CJK_RUN"]

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
#: A run of Han characters (CJK Unified Ideographs, extension A, compatibility ideographs).
CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")

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


def cjk_bigrams(run: str) -> list[str]:
    """Overlapping character bigrams of one Han run; a one-character run is its own term.

    Example:
        >>> cjk_bigrams("打印机")
        ['打印', '印机']
    """
    if len(run) < 2:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def _latin(word: str, out: list[str]) -> None:
    if word in STOP_WORDS or (len(word) < 2 and not word.isdigit()):
        return
    out.append(_stem(word))


def analyse(text: str, cjk: Callable[[str], list[str]] = cjk_bigrams) -> list[str]:
    """Index terms of ``text`` in order (duplicates kept: BM25 counts them).

    Args:
        cjk: terms of one Han run (:func:`cjk_bigrams`; ``bench languages`` passes its alternatives).

    Example:
        >>> analyse("When did Caroline go to the LGBTQ support groups?")
        ['carolin', 'go', 'lgbtq', 'support', 'group']
        >>> analyse("打印机报E-31")
        ['打印', '印机', '机报', '31']
    """
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if CJK_RUN.search(word) is None:
            _latin(word, out)
            continue
        pos = 0
        for m in CJK_RUN.finditer(word):
            if m.start() > pos:
                _latin(word[pos : m.start()], out)
            out.extend(cjk(m.group()))
            pos = m.end()
        if pos < len(word):
            _latin(word[pos:], out)
    return out
