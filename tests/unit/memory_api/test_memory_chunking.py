"""Long texts through the memory API: chunked into rows of one record, found by their middle, returned whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from recallserve.memory_shards.chunking import chunk_spans, count_tokens

from .conftest import auth, close_service, make_app, make_service

A = auth("sk-acme")

_TOPICS = [
    ("toner", "Replace the toner cartridge when the amber light blinks twice; shake it gently before inserting."),
    ("duplex", "Duplex printing needs the rear tray closed; an open tray prints single-sided pages only."),
    ("firmware", "Firmware updates install overnight from the admin console and reboot the device once."),
    ("badge", "Badge release holds print jobs until the owner taps their badge on the reader."),
    ("fuser", "A fuser error E52 means the heating unit failed its warm-up check; call facilities."),
    ("scanner", "Scanned documents are mailed as PDF to the address of the logged-in badge holder."),
    ("stapler", "The finisher staples up to fifty sheets; larger jobs are stacked without staples."),
    ("quota", "Colour quota resets on the first day of each month for every department."),
]


def _manual() -> tuple[str, list[str]]:
    """A ~1,500-token manual: eight sections, each a fact and the floors and rooms it applies to."""
    sections = [f"Section {i + 1}, {name}. {fact} This applies to the devices on floor {i + 2}, rooms {i}01 to "
                f"{i}09, serviced every {i + 3} weeks by the equipment team, who log each visit in the asset "
                f"register under chapter {i + 11}. " for i, (name, fact) in enumerate(_TOPICS)]
    sections = [s * 3 for s in sections]
    return "".join(sections).strip(), sections


def _search(client: TestClient, **body) -> list[dict]:
    r = client.post("/v1/memories/search", json=body, headers=A)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_chunk_spans_cover_the_text_in_bounded_overlapping_chunks() -> None:
    text, _ = _manual()
    spans = chunk_spans(text, max_tokens=128, overlap_tokens=24)
    assert len(spans) >= 10
    assert spans[0][0] == 0 and text[spans[-1][1]:].strip() == ""
    assert all(count_tokens(text[a:b]) <= 128 for a, b in spans)
    # every gap between chunks is whitespace (no token lost), and neighbours overlap
    assert all(text[spans[i][1]:spans[i + 1][0]].strip() == "" or spans[i + 1][0] < spans[i][1]
               for i in range(len(spans) - 1))
    assert sum(1 for i in range(len(spans) - 1) if spans[i + 1][0] < spans[i][1]) >= len(spans) // 2
    assert chunk_spans("a short note") == []
    with pytest.raises(ValueError, match="overlap_tokens"):
        chunk_spans(text, max_tokens=64, overlap_tokens=40)


def test_long_document_is_found_by_its_middle_and_comes_back_whole(client: TestClient) -> None:
    text, sections = _manual()
    doc_id = client.post("/v1/memories", json={"memories": [
        {"text": text, "source_id": "manual-printers", "topic": "it/printers"},
        {"text": "The canteen opens at eight and serves breakfast until ten.", "source_id": "canteen"},
    ]}, headers=A).json()["ids"][0]
    middle = "fuser error E52 heating unit failed warm-up check"
    for query, fact in ((middle, "E52"), ("toner cartridge amber light blinks", "amber light"),
                        ("colour quota resets first day month", "quota resets")):
        hits = _search(client, query=query, k=3, hybrid=False, threshold=-1)  # dense only: vectors see every chunk
        assert hits and hits[0]["id"] == doc_id, query
        assert hits[0]["text"] == text  # the whole unit, not the chunk
        assert hits[0]["similarity"] >= 0.2 and hits[1]["similarity"] < 0.1
        a, b = hits[0]["text_chunks"][hits[0]["part_index"]]  # the best chunk is the one holding the fact
        assert fact in text[a:b]
    assert _search(client, query=middle, k=3)[0]["id"] == doc_id  # hybrid too
    got = client.get(f"/v1/memories/{doc_id}", headers=A).json()
    assert got["text"] == text and got["text_chunks"] and len(got["text_chunks"]) >= 5
    a, b = got["text_chunks"][len(got["text_chunks"]) // 2]
    assert text[a:b] in text and 0 < a < b < len(text)
    assert sections[4].split(".")[1].strip() in text  # the fuser fact sits in the middle of the manual


def test_without_chunking_the_middle_is_diluted(tmp_path: Path) -> None:
    """The same document as one row: its middle matches far worse (what chunking fixes)."""
    text, _ = _manual()
    sims = {}
    for name, chunk_tokens in (("chunked", 224), ("whole", None)):
        svc = make_service(tmp_path / name)
        svc.chunk_tokens = chunk_tokens
        try:
            with TestClient(make_app(svc)) as c:
                c.post("/v1/memories", json={"memories": [{"text": text, "source_id": "m"}]}, headers=A)
                r = c.post("/v1/memories/search", json={"query": "fuser error E52 heating unit failed warm-up check",
                                                        "k": 1, "hybrid": False, "threshold": -1}, headers=A)
                sims[name] = r.json()["data"][0]["similarity"]
        finally:
            close_service(svc)
    assert sims["chunked"] > 2 * sims["whole"], sims


def test_chunks_survive_a_restart(tmp_path: Path) -> None:
    text, _ = _manual()
    body = {"query": "badge release holds print jobs", "k": 1, "hybrid": False, "threshold": -1}
    svc = make_service(tmp_path / "m")
    with TestClient(make_app(svc)) as c:
        doc_id = c.post("/v1/memories", json={"memories": [{"text": text, "source_id": "m"}]}, headers=A).json()["ids"][0]
        before = c.post("/v1/memories/search", json=body, headers=A).json()["data"][0]
    close_service(svc)
    svc = make_service(tmp_path / "m")  # replays the WAL: the chunk rows come back from the stored spans
    try:
        with TestClient(make_app(svc)) as c:
            after = c.post("/v1/memories/search", json=body, headers=A).json()["data"][0]
            assert after["id"] == doc_id and after["text"] == text
            assert after["part_index"] == before["part_index"] > 0
            assert abs(after["similarity"] - before["similarity"]) < 1e-5 and after["similarity"] >= 0.15
    finally:
        close_service(svc)
