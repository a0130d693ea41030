"""Entity extraction and masking."""

from __future__ import annotations

import re

import pytest

from recallserve.serve.context import extract_entities, mask_personal
from recallserve.serve.context import _entities
from recallserve.serve.context._entities import format_entity


def _pairs(text: str) -> list[tuple[str, str]]:
    return [(e.kind, e.value) for e in extract_entities(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Refund $249.99 for ORD-48213 by March 3.", [("amount", "$249.99"), ("id", "ORD-48213"), ("date", "March 3")]),
        ("placed on 2026-03-14 and again on 14th of March 2026", [("date", "2026-03-14"), ("date", "14th of March 2026")]),
        ("It costs 300 dollars, or 12/03/2026 at the latest", [("amount", "300 dollars"), ("date", "12/03/2026")]),
        ("ticket #58210, tracking 1Z999AA10123456784", [("id", "#58210"), ("id", "1Z999AA10123456784")]),
        ("My order 104208 arrived cracked; invoice no. 5531.", [("id", "104208"), ("id", "5531")]),
        ("the model EL-8735X and serial SN10153386", [("id", "EL-8735X"), ("id", "SN10153386")]),
        ("not before 10:45am or after 6 pm, ideally 14:30", [("time", "10:45am"), ("time", "6 pm"), ("time", "14:30")]),
    ],
)
def test_verbatim_entities(text: str, expected: list[tuple[str, str]]) -> None:
    assert _pairs(text) == expected


def test_names_keep_full_titles() -> None:
    assert _pairs("I spoke to Dr. Maria José Alvarez-Lopez yesterday") == [("name", "Dr. Maria José Alvarez-Lopez")]
    assert _pairs("Please contact Prof. Hans van der Berg Jr. about it.") == [("name", "Prof. Hans van der Berg Jr.")]
    assert _pairs("My name is John Smith.") == [("name", "John Smith")]


@pytest.mark.parametrize(
    ("text", "masked", "raw"),
    [
        ("call me at +44 7970 800 2208", "****2208", "7970 800"),
        ("card 4242 4242 4242 4242 please", "****4242", "4242 4242 4242"),
        ("My account number is 57485068.", "****5068", "57485068"),
        ("IBAN DE89 3704 0044 0532 0130 00", "****3000", "3704 0044"),
    ],
)
def test_personal_numbers_are_masked(text: str, masked: str, raw: str) -> None:
    ents = extract_entities(text)
    assert [e.value for e in ents] == [masked]
    # neither the value nor its snippet leaks the full number
    assert raw not in ents[0].snippet and raw not in ents[0].value
    assert raw not in mask_personal(text) and masked in mask_personal(text)


def test_email_masked_keeps_domain() -> None:
    (ent,) = extract_entities("My email is maria.alvarez@example.com.")
    assert (ent.kind, ent.value) == ("email", "m***@example.com")
    assert "maria.alvarez" not in ent.snippet


def test_snippet_is_the_sentence_and_format() -> None:
    text = "Hello there. Dr. Ana Ruiz paid $12.50 for it. Bye."
    ents = extract_entities(text)
    assert [e.snippet for e in ents] == ["Dr. Ana Ruiz paid $12.50 for it."] * 2
    assert format_entity(ents[1]) == '- amount: $12.50 ("Dr. Ana Ruiz paid $12.50 for it.")'


def test_no_entities_in_plain_text_and_dedup() -> None:
    assert extract_entities("How long does standard shipping usually take?") == []
    assert _pairs("ORD-1234 and again ORD-1234") == [("id", "ORD-1234")]


def test_a_dump_is_read_up_to_the_span_cap_but_masked_whole() -> None:
    from recallserve.serve.context._entities import MAX_ENTITY_SPANS

    dump = " ".join(f"user{i}@ex{i}.com" for i in range(MAX_ENTITY_SPANS * 4))
    found = extract_entities(dump)
    assert len(found) == MAX_ENTITY_SPANS
    assert all(e.kind == "email" and e.value.startswith("u***@") for e in found)
    # NOTE: masking is never capped: every address of the dump is masked, the last one too.
    masked = mask_personal(dump)
    assert masked.count("u***@") == MAX_ENTITY_SPANS * 4 and "user" not in masked


def test_an_entity_in_an_endless_sentence_keeps_its_value_but_no_snippet() -> None:
    from recallserve.serve.context._entities import _MAX_SENTENCE_CHARS

    long = "Refund ORD-48213 " + "and more words " * (_MAX_SENTENCE_CHARS // 10)
    (entity,) = [e for e in extract_entities(long) if e.kind == "id"]
    assert entity.value == "ORD-48213" and entity.snippet == ""
    assert format_entity(entity) == "- id: ORD-48213"
    # A normal sentence still gets its (masked) snippet.
    (short,) = [e for e in extract_entities("Refund ORD-48213 to jane.doe@example.com today.") if e.kind == "id"]
    assert short.snippet.startswith("Refund ORD-48213 to j***@example.com")


def test_matches_that_give_no_span_count_toward_the_cap() -> None:
    from recallserve.serve.context._entities import _EXAMINED_PER_SPAN, MAX_ENTITY_SPANS, _scan

    # Each unit matches the phone pattern but holds 19 digits (a phone has 7-15): no span, all examined.
    noise = "+123 (1234) 1234-1234-1234 " * (MAX_ENTITY_SPANS * _EXAMINED_PER_SPAN * 2)
    assert _scan(noise + " call ORD-48213", MAX_ENTITY_SPANS) == []
    assert [s[2] for s in _scan(noise + " call ORD-48213")] == ["id"]  # uncapped (masking): read to the end


def _corpus() -> list[str]:
    """Prose with and without digits: the lines of the README and the docs/ pages, and the texts of these tests."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    readme = [line for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
              for line in page.read_text(encoding="utf-8").splitlines()]
    own = [
        "Refund $249.99 for ORD-48213 by March 3.", "call me at +44 7970 800 2208", "My name is John Smith.",
        "mail a.b@example.com or c@d.io", "I spoke to Dr. Maria José Alvarez-Lopez yesterday", "no digits here at all",
        "ticket #58210, tracking 1Z999AA10123456784", "IBAN DE89 3704 0044 0532 0130 00", "at 10:45am or 6 pm",
    ]
    return readme + own + [re.sub(r"\d", "", t) for t in own] + [t.replace("@", " ") for t in own]


def test_the_character_prefilter_changes_no_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_scan`` skips a pattern whose matches need a digit (or an "@") in a text without one; with the
    prefilter off (every pattern run on every text) the entities and the masking are the same."""
    texts = _corpus()
    fast = [(_pairs(t), mask_personal(t)) for t in texts]
    monkeypatch.setattr(_entities, "_ANY_DIGIT", re.compile(r""))  # NOTE: every text "has a digit"
    monkeypatch.setattr(_entities, "_NEEDS", {"email": "", "name": ""})
    assert [(_pairs(t), mask_personal(t)) for t in texts] == fast


def test_a_skipped_pattern_cannot_match_without_its_character() -> None:
    for text in _corpus():
        for number, (kind, pattern) in enumerate(_entities._PATTERNS):
            needs = _entities._NEEDS.get(kind)
            if number in _entities._HAN_PATTERNS:
                # the digit-free Chinese forms are skipped for a text without a Han character
                assert pattern.search(_entities._HAN.sub("", text)) is None, (kind, text)
            elif needs is None:
                assert pattern.search(re.sub(r"\d", "", text)) is None, (kind, text)
            elif needs:
                assert pattern.search(text.replace(needs, "")) is None, (kind, text)
