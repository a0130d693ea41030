"""``recallserve bench ingest --url`` and ``loadtests.ingest_cluster``: texts, the /metrics split, the table, settings."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from recallserve.deployments.cli._bench_ingest_cluster import locomo_texts, render, split_ms
from loadtests.ingest_cluster import parse_setting


def _locomo(tmp_path: Path, turns: list[str]) -> str:
    conv = {"sample_id": "c1", "conversation": {"speaker_a": "A", "speaker_b": "B", "session_1_date_time": "1:56 pm on 8 May, 2023",
                                                "session_1": [{"speaker": "A", "dia_id": f"D1:{i}", "text": t}
                                                              for i, t in enumerate(turns, 1)]},
            "qa": [{"question": "What did A say?", "answer": "hi", "evidence": ["D1:1"], "category": 1}]}
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([conv]))
    return str(path)


def test_locomo_texts_never_repeat_a_text(tmp_path: Path) -> None:
    path = _locomo(tmp_path, ["hello there", "hello there", "how are you?", "  "])
    got = list(itertools.islice(locomo_texts(path), 5))
    # duplicates and blank turns dropped; past the end every text is marked with its cycle
    assert got == ["hello there", "how are you?", "hello there [cycle 1]", "how are you? [cycle 1]",
                   "hello there [cycle 2]"]
    assert len(set(itertools.islice(locomo_texts(path), 100))) == 100


def test_split_ms_is_the_mean_of_the_interval() -> None:
    before = {"ingress": (1.0, 10.0), "embed_call": (0.5, 10.0)}
    after = {"ingress": (3.0, 20.0), "embed_call": (0.5, 10.0), "embed_bulk_forward": (0.9, 3.0)}
    out = split_ms(before, after)
    assert out["ingress_ms"] == pytest.approx(200.0) and out["ingress_n"] == 10
    assert out["embed_call_ms"] is None  # nothing observed in the interval
    assert out["embed_bulk_forward_ms"] == pytest.approx(300.0) and out["embed_forward_ms"] is None


def test_render_puts_each_setting_on_a_row() -> None:
    def report(rate: float) -> dict:
        phase = {"memories_per_s": rate, "median_batch_s": 50 / rate, "cpu_ms_per_memory_total": 21.5,
                 "cpu_ms_per_memory": {"ray::ServeReplica:recallserve:embedder": 20.1, "bench client": 0.4},
                 "split": {"ingress_ms": 480.0, "embed_call_ms": 450.0, "embed_bulk_forward_ms": 440.0,
                           "shard_call_ms": 12.0}}
        return {"alone": {"search": {"p50_ms": 30.0, "p95_ms": 41.0}, "chat": [{"wall_s": 6.2}]},
                "ingest": phase, "ingest_with_probes": {**phase, "search": {"p50_ms": 35.0, "p95_ms": 60.0},
                                                        "chat": [{"wall_s": 7.0}]}}

    table = render([("before", report(48.0)), ("bulk", report(92.0))])
    rows = [line for line in table.splitlines() if line.startswith("| before") or line.startswith("| bulk")]
    assert len(rows) == 4  # the main table and the CPU-by-process table
    assert "| bulk | 92.0 |" in table and "| 30 / 35 | 41 / 60 | 6.2 | 7.0 |" in table
    assert "ServeReplica:recallserve:embedder 20.1" in table


def test_parse_setting() -> None:
    assert parse_setting('before={"bulk_min_texts": 100000}') == ("before", {"bulk_min_texts": 100000})
    assert parse_setting("bulk=") == ("bulk", {})
    for bad, why in [("nolabel", "LABEL=JSON"), ("=x", "LABEL=JSON"), ("a={", "not JSON"), ("a=[1]", "JSON object")]:
        with pytest.raises(ValueError, match=why):
            parse_setting(bad)
