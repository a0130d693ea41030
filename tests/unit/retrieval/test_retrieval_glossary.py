"""The English gloss of a Chinese query (CC-CEDICT, memory_shards.retrieval.glossary)."""

from __future__ import annotations

import pytest

from recallserve.memory_shards.retrieval import glossary
from recallserve.memory_shards.retrieval.glossary import MAX_GLOSS_CHARS, gloss, has_han


def test_a_chinese_fault_is_glossed_with_its_english_words() -> None:
    words = gloss("咖啡机漏水，屏幕闪烁").split()
    assert {"coffee", "leak", "screen", "flickering"} <= set(words)


def test_the_longest_headword_wins_and_references_are_not_meanings() -> None:
    # 咖啡机 is one headword (coffee machine), not 咖啡 (coffee) + 机 (machine, opportunity ...)
    assert gloss("咖啡机") == "coffee machine coffee maker"
    # 的's senses are a particle's notes ("~'s", "also pr. [di4]"): none is kept
    assert "~" not in gloss("我的水壶") and "[" not in gloss("我的水壶")


@pytest.mark.parametrize("text", ["", "printer error E-31", "order 104318 status?", "12345"])
def test_text_without_han_characters_has_no_gloss(text: str) -> None:
    assert not has_han(text)
    assert gloss(text) == ""


def test_a_gloss_is_bounded() -> None:
    assert len(gloss("咖啡机漏水屏幕闪烁水壶" * 500)) <= MAX_GLOSS_CHARS


def test_a_dictionary_file_other_than_the_pinned_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(glossary, "_words", None)
    monkeypatch.setattr(glossary, "CEDICT_SHA256", "0" * 64)
    with pytest.raises(RuntimeError, match="sha256"):
        gloss("漏水")
