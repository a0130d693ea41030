"""The retention evaluation: data, scoring, and the CLI end to end (extractive summary)."""

from __future__ import annotations

import json

import pytest

from recallserve.deployments.cli import main
from recallserve.serve.context import RuleCategoriser
from recallserve.serve.context._eval_data import (
    PLANT_TURNS,
    PlantedItem,
    build_conversation,
    normalise,
)
from recallserve.serve.context._eval_data_zh import DEV_SEEDS, HELD_OUT_SEEDS, build_conversation_zh
from recallserve.serve.context._retention import item_present, percentile


def test_conversations_are_deterministic_and_well_formed() -> None:
    a, b = build_conversation(3), build_conversation(3)
    assert [t.user for t in a.turns] == [t.user for t in b.turns] and a.customer == b.customer
    assert len(a.turns) == 59 and len(a.items) == 20
    assert {i.turn for i in a.items} == set(PLANT_TURNS)
    assert sum(i.kind == "constraint" for i in a.items) == 8
    assert build_conversation(4).customer != a.customer or build_conversation(4).items != a.items


@pytest.mark.parametrize("seed", range(6))
def test_keys_occur_only_in_their_item(seed: int) -> None:
    conv = build_conversation(seed)
    texts = [t for turn in conv.turns for t in [*turn.user, turn.reply, *(turn.tool or ())]]
    for item in conv.items:
        assert item_present(item, item.text)
        others = normalise("\n".join(t for t in texts if t != item.text))
        assert not any(normalise(key[0]) in others for key in item.keys), item


def test_rules_categorise_every_planted_item() -> None:
    rules = RuleCategoriser()
    for seed in range(6):
        for item in build_conversation(seed).items:
            assert rules.categorise("user", item.text) == item.kind, item.text


def test_item_present_and_percentile() -> None:
    item = PlantedItem("fact", "I paid $12.50 with card ending 4242", (("$12.50",), ("ending 4242", "****4242")), "?")
    assert item_present(item, "paid $12.50 ... card ****4242")
    assert item_present(item, "paid $12.50, Ending 4242")
    assert not item_present(item, "paid 12.50 dollars, ****4242")  # the currency sign is part of the key
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([], 95) == 0.0


def test_cli_end_to_end_extractive(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "retention", "--no-llm-summary", "--embedder", "none", "--conversations", "1",
                 "--budget", "2048", "--modes", "sliding,summary,hybrid", "--path", "plain", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary_source"] == "extractive (no model)" and doc["embedder"] is None
    assert doc["scored"] == "engine prompt (plain path)"
    rows = {r["mode"]: r for r in doc["rows"]}
    # NOTE: 003's levels: the planted constraints are the user's (retention 2), none is a system one (3).
    assert rows["hybrid"]["present_share"] >= 0.95 and rows["hybrid"]["constraints_share"] == 1.0
    assert rows["hybrid"]["retention3_items"] == 0 and rows["hybrid"]["items"] == 20
    assert rows["sliding"]["present_share"] < rows["hybrid"]["present_share"]
    assert doc["latency_ms"]["all"]["p95"] >= doc["latency_ms"]["all"]["p50"] > 0
    assert doc["summaries"][0]["summariser"] == "extractive" and doc["summaries"][0]["covers_until"] > 0


def test_cli_scores_the_agent_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    """On the agent path the tool prompt's reserve (agent_overhead_tokens) leaves a 2k window ~500
    history tokens; at 4k the prompt the reasoner receives keeps the items."""
    code = main(["eval", "retention", "--no-llm-summary", "--embedder", "none", "--conversations", "1",
                 "--budget", "2048", "--budget", "4096", "--modes", "hybrid", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scored"] == "engine prompt (agent path)"
    rows = {r["budget"]: r for r in doc["rows"]}
    assert rows[4096]["present_share"] >= 0.95 and rows[4096]["constraints_share"] == 1.0
    assert rows[2048]["present_share"] < rows[4096]["present_share"] and rows[2048]["constraints_share"] == 1.0


def test_cli_measures_003s_2000_token_reserve_above_the_default_max_tokens_limit(capsys: pytest.CaptureFixture[str]) -> None:
    """003 reserves 2,000 tokens for the answer: the eval asks with max_tokens 2,000 (above the server's
    default limit of 1,024, raised for the run) and the reserve shrinks what history fits."""
    argv = ["eval", "retention", "--no-llm-summary", "--embedder", "none", "--conversations", "1",
            "--budget", "8192", "--modes", "sliding", "--path", "plain", "--json"]
    shares = {}
    for reserve in ("256", "2000"):
        assert main([*argv, "--reserved-output", reserve]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["reserved_output"] == int(reserve)
        shares[reserve] = doc["rows"][0]["present_share"]
    assert shares["2000"] < shares["256"]


def test_cli_summary_cap_reaches_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["eval", "retention", "--no-llm-summary", "--embedder", "none", "--conversations", "1",
            "--budget", "8192", "--modes", "summary", "--path", "plain", "--json"]
    tokens = {}
    for cap in ("600", "64"):
        assert main([*argv, "--summary-max-tokens", cap]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["summary_max_tokens"] == int(cap)
        tokens[cap] = doc["summaries"][0]["tokens"]
    assert tokens["64"] <= 64 < tokens["600"]


def test_cli_ablation_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "retention", "--no-llm-summary", "--embedder", "none", "--conversations", "1",
                 "--budget", "2048", "--modes", "hybrid", "--no-categories"])
    assert code == 0
    out = capsys.readouterr().out
    assert "categories OFF" in out and "hybrid" in out and "p95" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--budget", "100"], "--budget"),
        (["--modes", "fancy"], "--modes"),
        (["--embedder", "none", "--modes", "retrieval"], "needs an embedder"),
        (["--conversations", "0"], "--conversations"),
        (["--reserved-output", "4096", "--budget", "2048"], "--reserved-output"),
        (["--summary-max-tokens", "5"], "--summary-max-tokens"),
    ],
)
def test_cli_user_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "retention", "--no-llm-summary", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_llm_summariser_wiring(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The default path builds the llama.cpp engine; here a stub engine stands in for it."""
    from recallserve.deployments import engines as deployment_engines

    from .conftest import StubEngine

    built: list[object] = []

    def fake_build(cfg: object) -> StubEngine:
        built.append(cfg)
        return StubEngine(["- the customer wants a replacement"] * 50)

    monkeypatch.setattr(deployment_engines, "build_engine", fake_build)
    code = main(["eval", "retention", "--embedder", "none", "--conversations", "1", "--budget", "2048",
                 "--modes", "summary", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary_source"] == "LLM stub-model" and doc["summaries"][0]["summariser"] == "stub-model"
    assert built and built[0].n_ctx == 6144  # room for a 4000-token batch plus the answer


@pytest.mark.parametrize("seed", [*DEV_SEEDS, *HELD_OUT_SEEDS])
def test_chinese_conversations_have_unique_keys_and_the_rules_read_every_item(seed: int) -> None:
    conv = build_conversation_zh(seed)
    assert len(conv.turns) == 59 and len(conv.items) == 20 and conv.turns[0].user[0].startswith("你好，我是")
    texts = [t for turn in conv.turns for t in [*turn.user, turn.reply, *(turn.tool or ())]]
    rules = RuleCategoriser()
    for item in conv.items:
        assert item_present(item, item.text) and all(normalise(k[0]) for k in item.keys)
        others = normalise("\n".join(t for t in texts if t != item.text))
        assert not any(normalise(key[0]) in others for key in item.keys), item
        assert rules.categorise("user", item.text) == item.kind, item.text


def test_cli_chinese_conversations(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "retention", "--language", "zh", "--no-llm-summary", "--embedder", "none", "--conversations", "1",
                 "--seed", "100", "--budget", "4096", "--modes", "summary,hybrid", "--path", "plain", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["language"] == "zh" and doc["first_seed"] == 100
    assert all(r["constraints_share"] == 1.0 for r in doc["rows"])
