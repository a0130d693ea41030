"""Chinese on the BM25 side: Han runs as character bigrams, Latin text as before (issue 39)."""

from __future__ import annotations

from recallserve.memory_shards.bench._bilingual_set import BILINGUAL_SET
from recallserve.memory_shards.bench.languages import _rank_bm25, _scores, _whole
from recallserve.memory_shards.retrieval._text import analyse, cjk_bigrams
from recallserve.memory_shards.retrieval.lexical import LexicalIndex


def test_han_runs_become_bigrams_and_ids_are_cut_out() -> None:
    assert analyse("打印机报E-31是怎么回事？") == ["打印", "印机", "机报", "31", "是怎", "怎么", "么回", "回事"]
    assert analyse("型号KF-2208X") == ["型号", "kf", "2208x"]
    assert analyse("好") == ["好"]
    # English keeps its stems and stop words
    assert analyse("The printers were jammed") == ["printer", "jam"]


def test_a_paraphrased_chinese_question_finds_its_record() -> None:
    idx = LexicalIndex()
    idx.add_many([("t", "a", "冰箱冷藏室不制冷，更换了温控器之后恢复正常。"), ("t", "b", "空调遥控器没有反应，换了两节七号电池就好了。")])
    assert idx.search("t", "冰箱冷藏那层不凉了，后来怎么修好的？", 2)[0][0] == "a"
    assert idx.search("t", "空调遥控按了没反应咋办？", 2)[0][0] == "b"


def test_bigrams_beat_whole_runs_on_the_bilingual_set() -> None:
    records = [p[0] for p in BILINGUAL_SET]
    questions = [p[1] for p in BILINGUAL_SET]
    whole = _scores(_rank_bm25(lambda t: analyse(t, cjk=_whole), records, questions))
    bigram = _scores(_rank_bm25(lambda t: analyse(t, cjk=cjk_bigrams), records, questions))
    # the figures of `recallserve bench languages` (BM25 alone): 0.062 -> 0.906
    assert (whole["r3_all"], bigram["r3_all"]) == (0.0625, 0.9062)
