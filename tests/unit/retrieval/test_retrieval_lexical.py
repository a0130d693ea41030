"""BM25 index: the formula, per-tenant statistics, replace/delete/compaction, filtering."""

from __future__ import annotations

import math

import pytest

from recallserve.memory_shards.retrieval import LexicalIndex
from recallserve.memory_shards.retrieval._text import analyse


def _bm25(query: list[str], doc: list[str], docs: list[list[str]], k1: float = 1.2, b: float = 0.75) -> float:
    n, avgdl = len(docs), sum(len(d) for d in docs) / len(docs)
    score = 0.0
    for term in dict.fromkeys(query):
        df = sum(term in d for d in docs)
        tf = doc.count(term)
        if not df or not tf:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(doc) / avgdl))
    return score


TEXTS = {
    "a": "The printer on floor three jams on tray two",
    "b": "Paper jams happen when the paper is damp",
    "c": "Refunds take five business days",
    "d": "The printer driver was updated; printer works",
}


def test_scores_match_the_formula() -> None:
    idx = LexicalIndex()
    for rid, text in TEXTS.items():
        idx.add("acme", rid, text)
    docs = {rid: analyse(t) for rid, t in TEXTS.items()}
    got = dict(idx.search("acme", "printer paper jams", 10))
    assert set(got) == {"a", "b", "d"}
    for rid, score in got.items():
        assert score == pytest.approx(_bm25(analyse("printer paper jams"), docs[rid], list(docs.values())), rel=1e-5)


def test_tenants_have_separate_statistics_and_results() -> None:
    idx = LexicalIndex()
    idx.add("acme", "a1", "printer jams")
    idx.add("acme", "a2", "refund policy")
    before = idx.search("acme", "printer", 5)
    for i in range(50):
        idx.add("globex", f"g{i}", "printer printer printer")
    assert idx.search("acme", "printer", 5) == before  # other tenant's df never changes acme's idf
    assert all(rid.startswith("g") for rid, _ in idx.search("globex", "printer", 100))
    assert idx.search("initech", "printer", 5) == []


def test_replace_delete_and_compaction_keep_results_exact() -> None:
    idx = LexicalIndex(compact_dead_ratio=0.3)
    for i in range(300):
        idx.add("t", f"r{i}", f"note {i} about llamas" if i % 3 else f"note {i} about alpacas")
    idx.add("t", "r1", "now about vicunas")  # re-index replaces
    assert [r for r, _ in idx.search("t", "vicunas", 5)] == ["r1"]
    assert "r1" not in [r for r, _ in idx.search("t", "llamas", 300)]
    for i in range(2, 250):
        assert idx.remove(f"r{i}")
    assert not idx.remove("r2")
    fresh = LexicalIndex()
    for i in [0, 1, *range(250, 300)]:
        fresh.add("t", f"r{i}", "now about vicunas" if i == 1 else (f"note {i} about llamas" if i % 3 else f"note {i} about alpacas"))
    for q in ("llamas", "alpacas note", "vicunas", "note 260"):
        got, want = idx.search("t", q, 100), fresh.search("t", q, 100)
        assert [r for r, _ in got] == [r for r, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-5)
    assert len(idx) == 52


def test_accept_filters_before_the_cut_and_ties_keep_insertion_order() -> None:
    idx = LexicalIndex()
    for i in range(500):
        idx.add("t", f"r{i}", "same words here")
    got = idx.search("t", "same words", 10, accept=lambda rid: int(rid[1:]) % 100 == 7)
    assert [r for r, _ in got] == ["r7", "r107", "r207", "r307", "r407"]
    assert [r for r, _ in idx.search("t", "words", 3)] == ["r0", "r1", "r2"]


def test_stop_words_and_empty_queries() -> None:
    idx = LexicalIndex()
    idx.add("t", "r", "what did they do")
    assert idx.search("t", "what did", 5) == []  # only stop words
    with pytest.raises(ValueError, match="n: must be >= 1"):
        idx.search("t", "x", 0)
