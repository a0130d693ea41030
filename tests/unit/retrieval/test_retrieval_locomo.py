"""LoCoMo loading, evidence normalisation, turn records, recall maths, and the CLI on a fixture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recallserve.memory_shards.retrieval.locomo import (
    IndexOptions,
    load_locomo,
    normalise_evidence,
    parse_session_time,
    question_recall,
    summarise_recall,
    turn_records,
)
from recallserve.deployments.cli import main

TINY = Path(__file__).parent / "data" / "locomo_tiny.json"


def test_malformed_evidence_ids_are_repaired() -> None:
    assert normalise_evidence(["D8:6; D9:17", "D:11:26", "D30:05"]) == ["D8:6", "D9:17", "D11:26", "D30:5"]
    assert normalise_evidence(["D1:2", "D1:2", "D2:1,D2:3", "bogus"]) == ["D1:2", "D2:1", "D2:3"]


def test_session_time_parses_and_rejects() -> None:
    assert parse_session_time("1:56 pm on 8 May, 2023") == 1683554160.0
    assert parse_session_time("10:15 am on 20 June, 2023") == 1687256100.0
    with pytest.raises(ValueError, match="cannot parse"):
        parse_session_time("sometime in May")


def test_load_and_turn_records() -> None:
    convs = load_locomo(TINY)
    assert [c.sample_id for c in convs] == ["tiny-1", "tiny-2"]
    first = convs[0]
    assert [t.dia_id for t in first.turns][:5] == ["D1:1", "D1:2", "D1:3", "D1:4", "D2:1"]
    assert first.questions[2].evidence == ["D1:2", "D2:4"] and first.questions[3].evidence == ["D1:4"]
    recs = turn_records(first, "tiny-1", IndexOptions(context_window=1))
    bowl = recs[3]
    assert bowl.source_id == "D1:4" and bowl.tenant == "tiny-1"
    assert "Bruno said on 8 May 2023" in bowl.text and "blue ceramic bowl" in bowl.text
    assert bowl.created_at == parse_session_time("1:56 pm on 8 May, 2023")
    # context stays inside the session: D1:4's window is D1:3 and D1:4 only (D2:1 is another day)
    ctx = bowl.parts[0].text
    assert "pottery" in ctx and "marathon" not in ctx
    bare = turn_records(first, "t", IndexOptions(speaker=False, date=False, caption=False, context_window=0))
    assert bare[1].text == first.turns[1].text and bare[1].parts == []


def test_load_errors_name_the_place(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"conversation": {"session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "x"}]}}]))
    with pytest.raises(ValueError, match=r"session_1_date_time: missing"):
        load_locomo(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        load_locomo(bad)


def test_recall_maths() -> None:
    r = question_recall(["D1:1", "D1:2", "D3:3"], ["D1:2", "D9:9"], [1, 2, 3])
    assert r == {1: 0.0, 2: 0.5, 3: 0.5}
    summary = summarise_recall([(1, {1: 1.0}), (4, {1: 0.0}), (4, {1: 0.5})], [1])
    assert summary["overall"] == {"n": 3.0, "recall@1": 0.5}
    assert summary["single-hop"]["recall@1"] == 0.25 and summary["multi-hop"]["n"] == 1.0


@pytest.mark.slow
def test_eval_cli_on_fixture(capsys: pytest.CaptureFixture[str]) -> None:
    """The real command: MiniLM + hybrid shards + the memory service, JSON output."""
    assert main(["eval", "locomo", str(TINY), "--k", "1,3,10", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    res = doc["results"]
    assert doc["k"] == [1, 3, 10] and doc["turns"] == 11
    assert res["overall"]["n"] == 6  # category 5 skipped
    assert set(res) == {"overall", "multi-hop", "temporal", "open-domain", "single-hop"}
    # 11 turns in two tenants: every evidence id is within the top 10 of its own conversation
    assert res["overall"]["recall@10"] == 1.0
    assert res["single-hop"]["recall@1"] == 1.0  # "Pixel"/"bakery" questions are unambiguous
    for row in res.values():
        assert row["recall@1"] <= row["recall@3"] <= row["recall@10"]


def test_eval_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "locomo", str(TINY), "--k", "0,5"]) == 2
    assert "--k" in capsys.readouterr().err
    assert main(["eval", "locomo", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["eval", "locomo", str(TINY), "--mode", "keyword-rerank", "--k", "1,50"]) == 2
    assert "--k: keyword-rerank" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_cli_keyword_rerank_orders_bm25s_first_20_by_cosine(capsys: pytest.CaptureFixture[str]) -> None:
    """002's hybrid (keyword recall, vector re-rank) on the fixture: a full ranking within BM25's 20."""
    assert main(["eval", "locomo", str(TINY), "--k", "1,3,10", "--mode", "keyword-rerank", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "keyword-rerank" and doc["results"]["overall"]["n"] == 6
    assert doc["results"]["single-hop"]["recall@1"] == 1.0


def test_leave_one_out_never_picks_on_the_held_out_conversation() -> None:
    from recallserve.deployments.cli._eval_locomo import leave_one_out

    def res(r10: float) -> dict:
        return {"overall": {"n": 1.0, "recall@10": r10}, "multi-hop": {"n": 1.0, "recall@10": r10 / 2}}

    # setting "b" is best on conversation x only; "a" on y and z
    per_conv = {"x": {"a": res(0.5), "b": res(0.9)}, "y": {"a": res(0.92), "b": res(0.5)}, "z": {"a": res(0.95), "b": res(0.5)}}
    loo = leave_one_out(per_conv)
    chosen = {f["held_out"]: f["chosen"] for f in loo["folds"]}
    assert chosen == {"x": "a", "y": "a", "z": "a"}  # x's own best ("b") is never chosen for x
    spread = {"mean": round((0.5 + 0.92 + 0.95) / 3, 4), "min": 0.5, "max": 0.95}
    assert loo["held_out"]["overall"] == {**spread, "recall@10": spread}


@pytest.mark.slow
def test_eval_cli_fusion_comparison_and_write_filter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "locomo", str(TINY), "--k", "1,10", "--fusion", "20/1/1.5,60/1/1", "--write-filter", "facts"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"].startswith("recallserve ") and doc["write_filter"] == "facts"
    assert 0 < doc["stored_memories"] <= 11
    assert len(doc["per_conversation"]) == 2 and len(doc["leave_one_out"]["folds"]) == 2
    for setting in doc["settings"].values():
        assert 0 < setting["search_p50_ms"] <= setting["search_p95_ms"]
    assert main(["eval", "locomo", str(TINY), "--fusion", "20/1"]) == 2
    assert "--fusion" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_cli_set_crosses_knobs_and_picks_leave_one_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "locomo", str(TINY), "--k", "1,10", "--set", "date_weight=0,1", "--set", "date_slack_days=7"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = list(doc["settings"])
    assert names == ["c=20,dense=1,lexical=1.5,date_weight=0,date_slack_days=7",
                     "c=20,dense=1,lexical=1.5,date_weight=1,date_slack_days=7"]
    assert doc["settings"][names[1]]["retrieval"]["date_weight"] == 1.0
    loo = doc["leave_one_out"]
    assert loo["metric"] == "recall@10" and set(loo["held_out"]["overall"]) >= {"mean", "recall@1", "recall@10"}
    assert all(f["chosen"] in names for f in loo["folds"])
    for bad in (["--set", "no_such_knob=1"], ["--set", "date_weight=-1"], ["--set", "date_weight"]):
        assert main(["eval", "locomo", str(TINY), *bad]) == 2
        assert "--set" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_cli_decompose_reads_the_cache_and_weight_zero_is_the_plain_run(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``--decompose`` searches every question with its sub-queries; a filled cache runs no model."""
    from recallserve.deployments.cli._decompose import Decomposition, DecompositionCache
    from recallserve.deployments.models import DEFAULT_MODEL

    cache = DecompositionCache(tmp_path / "d.json")
    for conv in load_locomo(TINY):
        for q in conv.questions:
            cache.put(DEFAULT_MODEL, q.question, Decomposition(["my kitten", "my hobby"], 500.0, 6))
    assert main(["eval", "locomo", str(TINY), "--k", "1,10", "--fusion", "20/1/1.5"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["decompose"] is None
    argv = ["eval", "locomo", str(TINY), "--k", "1,10", "--decompose", "--decompose-cache", str(tmp_path / "d.json")]
    assert main([*argv, "--decompose-weights", "0,1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["decompose"] == {"model": DEFAULT_MODEL, "questions": 6, "cache": str(tmp_path / "d.json"),
                                "model_ms_p50": 500.0, "model_ms_p95": 500.0, "model_ms_mean": 500.0,
                                "sub_queries_mean": 2.0, "without_sub_queries": 0, "model_calls_this_run": 0}
    (name,) = plain["settings"]
    assert list(doc["settings"]) == [f"{name},sub_query_weight=0", f"{name},sub_query_weight=1"]
    assert all(f["chosen"] in doc["settings"] for f in doc["leave_one_out"]["folds"])
    for conv, rows in doc["per_conversation"].items():
        # weight 0 ignores the sub-queries: the plain run's figures, to the digit
        assert rows[f"{name},sub_query_weight=0"] == plain["per_conversation"][conv][name]
    for bad in (["--decompose-categories", "1,7"], ["--decompose-weights", "-1"], ["--decompose-weights", "a"]):
        assert main([*argv, *bad]) == 2
        assert bad[0] in capsys.readouterr().err


@pytest.mark.slow
def test_eval_cli_enrich_reads_the_cache_and_asks_only_covered_questions(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``--enrich`` stores the wholly enriched sessions with their facts (one arm) and without (the other)."""
    from recallserve.deployments.cli._enrich_locomo import session_windows
    from recallserve.deployments.models import DEFAULT_MODEL
    from recallserve.serve.enrich import EnrichConfig, Enrichment, EnrichmentCache, parse_facts

    cache = EnrichmentCache(tmp_path / "e.json")
    answers = {"tiny-1": "2: Bruno adopted a grey kitten called Pixel.\n4: Bruno glazed a bowl.",
               "tiny-2": "1: Chen lost his job at the bank yesterday.\n2: Dana is opening a bakery downtown next month."}
    for conv in load_locomo(TINY):
        # NOTE: session 1 only: tiny-1's session 2 stays unenriched, so its questions are not asked.
        (window,) = session_windows(conv, 4)[1]
        text = answers[conv.sample_id]
        cache.put(DEFAULT_MODEL, window, Enrichment(parse_facts(text, window), 4000.0, 300, 30, text), EnrichConfig())
    argv = ["eval", "locomo", str(TINY), "--k", "1,10", "--enrich", "--enrich-cache", str(tmp_path / "e.json")]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    cov = doc["enrich"]["per_conversation"]
    assert cov["tiny-1"] == {"sessions": [1], "turns": 4, "turns_with_facts": 2, "facts": 2, "questions": 2}
    assert cov["tiny-2"]["facts"] == 2 and cov["tiny-2"]["questions"] == 2
    assert doc["stored_memories"] == 7
    names = list(doc["settings"])
    assert [n.rsplit(",", 1)[1] for n in names] == ["enrich=0", "enrich=1"]
    assert all(f["chosen"] in names for f in doc["leave_one_out"]["folds"])
    for rows in doc["per_conversation"].values():
        assert all(r["overall"]["n"] == 2 for r in rows.values())
    assert main([*argv, "--enrich-window", "9"]) == 2
    assert "--enrich-window" in capsys.readouterr().err
    assert main(["eval", "locomo", str(TINY), "--enrich", "--enrich-cache", str(tmp_path / "none.json")]) == 2
    assert "--enrich" in capsys.readouterr().err
