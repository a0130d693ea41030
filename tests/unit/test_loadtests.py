"""Load-test tooling without a cluster: the host guard, the locust CSV report, the autoscaling
timeline summary and chart."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests._guard import HostRefused, check_host
from loadtests.autoscale_check import Sample, Timeline, render_chart, summarise
from loadtests.run_headless import build_report, parse_stats_csv, to_markdown

CSV = """Type,Name,Request Count,Failure Count,Median Response Time,Average Response Time,Min Response Time,Max Response Time,Average Content Size,Requests/s,Failures/s,50%,66%,75%,80%,90%,95%,98%,99%,99.9%,99.99%,100%
POST,/v1/chat/completions,200,1,900,950.5,300,4000,420,3.3,0.01,900,1000,1100,1200,1500,2100,2600,3100,4000,4000,4000
POST,/v1/memories/search,100,0,40,45.0,10,300,300,1.6,0.0,40,45,50,55,70,90,120,150,300,300,300
,Aggregated,300,1,700,650.1,10,4000,380,4.9,0.01,700,900,1000,1100,1400,2000,2500,3000,4000,4000,4000
"""


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:9000/", "http://[::1]:8000"])
def test_local_hosts_pass(url: str) -> None:
    assert check_host(url) == url.rstrip("/")


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "https://api.example.com", "127.0.0.1:8000", "ftp://127.0.0.1", ""])
def test_other_hosts_are_refused(url: str) -> None:
    with pytest.raises(HostRefused, match="host"):
        check_host(url)


def test_stats_csv_report(tmp_path: Path) -> None:
    path = tmp_path / "u4_stats.csv"
    path.write_text(CSV)
    rows = parse_stats_csv(path)
    assert [r.name for r in rows][-1] == "Aggregated"
    chat = rows[0]
    assert chat.requests == 200 and chat.failures == 1 and chat.error_rate == pytest.approx(0.005)
    assert (chat.p50_ms, chat.p95_ms, chat.p99_ms) == (900, 2100, 3100)
    from loadtests.run_headless import _level

    ok = _level(4, rows, 0)
    bad = {**_level(8, rows, 1), "aggregated": {**ok["aggregated"], "error_rate": 0.2, "rps": 9.0}}
    report = build_report([ok, bad], {"started_utc": "t", "host": "h", "kinds": ["chat"], "run_time_s": 60,
                                      "spawn_rate": 1, "max_tokens": 16}, max_error_rate=0.01)
    assert report["best_users"] == 4  # 8 users is faster but over the 1% error budget
    md = to_markdown(report)
    assert "| POST /v1/chat/completions | 200 | 3.30 | 0.5% | 900 | 2100 | 3100 | 4000 |" in md
    assert "Highest throughput with < 1% errors: 4 users." in md


def test_stats_csv_missing_columns_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad_stats.csv"
    path.write_text("Type,Name\nPOST,/x\n")
    with pytest.raises(ValueError, match="lacks columns"):
        parse_stats_csv(path)


def _timeline(counts: list[tuple[str, int]]) -> Timeline:
    tl = Timeline(meta={})
    for t, (phase, n) in enumerate(counts):
        tl.samples.append(Sample(float(t), phase, {"ingress": n, "reasoner": 1}, done=t, errors=0))
    return tl


def test_autoscale_summary_sees_up_and_down() -> None:
    tl = _timeline([("idle", 1), ("load", 1), ("load", 2), ("load", 3), ("cooldown", 3), ("cooldown", 2), ("cooldown", 1)])
    s = summarise(tl, "ingress", 1)
    assert s["peak_replicas"] == 3 and s["scaled_up"] and s["scaled_down"]
    assert s["seconds_to_peak_after_load_start"] == 2.0
    assert s["seconds_to_min_after_load_end"] == 2.0
    chart = render_chart(tl, "ingress", every_s=1)
    assert "###    3" in chart and "reasoner=1" in chart


def test_autoscale_summary_flags_no_scaling() -> None:
    s = summarise(_timeline([("idle", 1), ("load", 1), ("load", 1), ("cooldown", 1)]), "ingress", 1)
    assert not s["scaled_up"] and not s["scaled_down"]
    stuck = summarise(_timeline([("load", 3), ("cooldown", 3)]), "ingress", 1)
    assert stuck["scaled_up"] and not stuck["scaled_down"]


def test_payloads_are_valid_api_bodies() -> None:
    """Every body the load users send passes the server's own request schemas (no 400s by design)."""
    import random

    from loadtests._payloads import agent_chat_body, agent_prompts, chat_body, memory_search_body, memory_write_body
    from recallserve.serve.api.chat_protocol import ChatCompletionRequest
    from recallserve.serve.memory_api.schemas import AddMemoriesRequest, SearchRequest

    rng = random.Random(0)
    prompts = agent_prompts()
    assert len(prompts) == 80
    for _ in range(20):
        ChatCompletionRequest.model_validate(chat_body(rng, "recallserve", 16))
        turn = ChatCompletionRequest.model_validate(chat_body(rng, "recallserve", 16, session=("u1", "u1-s0")))
        assert turn.user == "u1" and turn.metadata == {"session_id": "u1-s0"}
        agent = ChatCompletionRequest.model_validate(agent_chat_body(rng, "recallserve", 64, prompts))
        assert agent.metadata == {"agent": "auto"}
        AddMemoriesRequest.model_validate(memory_write_body(rng))
        SearchRequest.model_validate(memory_search_body(rng))


def test_reembed_check_summary_counts_errors_and_percentiles() -> None:
    from loadtests.reembed_check import render_markdown
    from loadtests.reembed_check import summarise as summarise_reembed

    records = [(0.0, "start", "add", 200, s / 10) for s in range(1, 21)] + [(0.0, "v2 only", "search", 503, 2.0)]
    rows = summarise_reembed(records)
    add, search = rows
    assert (add["requests"], add["errors"], add["p50_s"], add["p95_s"], add["max_s"]) == (20, 0, 1.05, 1.9, 2.0)
    assert (search["step"], search["errors"]) == ("v2 only", 1)
    report = {"meta": {"started_utc": "t", "from": "a", "to": "b", "seed": 1, "clients": 1, "model": "m"},
              "steps": [{"name": "start", "seconds": 1.0}], "rows": rows, "ok": False,
              "checks": {"acked": 1, "missing": 0, "deleted": 0, "resurrected": 0, "records_v2": 1, "wrong_model": 0, "errors": 1}}
    text = render_markdown(report)
    assert "| v2 only | search | 1 | 1 |" in text and "**FAIL**" in text


def test_chaos_run_arguments_are_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    from loadtests.chaos_run import parse_args

    assert parse_args([]).kills == 20
    for bad in (["--kills", "0"], ["--kills", "201"], ["--every", "0.5"], ["--clients", "33"], ["--clients", "1"], ["--port", "80"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    assert "--kills must be within [1, 200], got 0" in capsys.readouterr().err


def test_chaos_run_report_maths() -> None:
    from loadtests.chaos_run import kill_windows, lost_turns, render_markdown

    kills = [{"t": 10.0, "target": "shard", "deployment": "memory_shard_0", "pid": 1, "recovery_s": 1.5},
             {"t": 20.0, "target": "state", "deployment": "state", "pid": 2, "recovery_s": None}]
    records = [(5.0, "write", -1), (11.0, "write", 503), (12.0, "read", 200), (19.9, "turn", -1),
               (20.0, "search", 500), (30.0, "write", 503)]
    assert kill_windows(kills, records, end=30.0) == [2, 1]  # NOTE: before the first kill and at `end` are outside
    # NOTE: 3 turns acked, 5 messages stored -> 2 whole turns: 1 lost; a session never stored loses all
    assert lost_turns({"a": 3, "b": 2, "c": 1}, {"a": 5, "b": 4}) == 2
    for k, f in zip(kills, [2, 1]):
        k["failed"] = f
    md = render_markdown({"meta": {"started_utc": "t", "profile": "cpu-local", "model": "m", "clients": 3, "every": 5},
                          "kills": kills, "ok": True,
                          "checks": {"requests": 6, "failed": 5, "acked_writes": 4, "writes_lost": 0, "acked_turns": 6,
                                     "sessions": 3, "turns_lost": 0}})
    assert "| 2 | state | state | 2 | 1 | not recovered |" in md and "median 1.50 s" in md and "**PASS**" in md


def test_read_back_counts_a_404_as_lost_and_a_reopening_replica_as_not_yet_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write is lost only when the API says it is not there (404); a replica still reopening after a
    kill answers 503 for a while, and the read-back waits for it (bounded) instead of counting a loss."""
    from loadtests import chaos_run, node_chaos
    from recallserve.client import RecallServeError

    monkeypatch.setattr(chaos_run.time, "sleep", lambda s: None)
    answers = iter([503, 503, 200])

    def reopening(item_id: str) -> None:
        status = next(answers)
        if status != 200:
            raise RecallServeError(status, "memory shards unavailable")

    def gone(item_id: str) -> None:
        raise RecallServeError(404, "memory not found")

    def down(item_id: str) -> None:
        raise RecallServeError(503, "memory shards unavailable")

    assert chaos_run.read_back(reopening, "m1", within_s=60) == "stored"
    assert chaos_run.read_back(gone, "m1", within_s=60) == "missing"
    assert chaos_run.read_back(down, "m1", within_s=0) == "unanswered"
    assert chaos_run.unread_sessions({"a": 4, "b": None}) == 1
    assert chaos_run.lost_turns({"a": 2, "b": 3}, {"a": 4, "b": None}) == 0  # NOTE: "b" is unread, not lost
    ok = {"writes_lost": 0, "writes_unverified": 0, "experiences_lost": 0, "experiences_unverified": 0,
          "turns_lost": 0, "sessions_unread": 0}
    assert node_chaos.nothing_lost(ok)
    assert not node_chaos.nothing_lost({**ok, "writes_unverified": 1})
    assert not node_chaos.nothing_lost({**ok, "sessions_unread": 1})


def test_chat_concurrency_and_node_chaos_count_the_real_apps_answers(tmp_path: Path) -> None:
    """The two load tests read answers through ``recallserve.client`` (retries off): a 200 row, and a
    refusal with its status, envelope and kind; node_chaos acknowledges what was answered 200 only."""
    import asyncio
    import random

    import httpx

    from loadtests import chat_concurrency, node_chaos
    from recallserve.client import AsyncRecallServe, RetryPolicy
    from tests.unit.edge.conftest import build_app

    app, memory = build_app(tmp_path)
    off = RetryPolicy(max_retries=0)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with AsyncRecallServe("http://rs", "sk-acme", transport=transport, retry=off) as rs, \
                    AsyncRecallServe("http://rs", "sk-nope", transport=transport, retry=off) as stranger:
                ok = await chat_concurrency._one(rs, "direct", 0, "t")
                assert ok["status"] == "200" and "refusal" not in ok
                denied = await chat_concurrency._one(stranger, "direct", 1, "t")
                assert (denied["status"], denied["json_envelope"], denied["refusal"], denied["retry_after"]) == \
                    ("401", True, "other", None)
                load = node_chaos.Load("http://rs", "recallserve", {"acme": "sk-acme", "nobody": "sk-nope"})
                rng = random.Random(0)
                for n in (1, 2, 3):  # writes, reads or searches; n = 4 is an experience
                    await load._one(rs, rng, "acme", "memory", n)
                await load._one(rs, rng, "acme", "memory", 4)
                await load._one(rs, rng, "acme", "chat", 5)
                await load._one(stranger, rng, "nobody", "memory", 1)
        assert [r["ok"] for r in load.records] == [True] * 5 + [False]
        assert load.records[-1]["fail"] == "other_401" and load.samples[0]["status"] == 401
        assert load.acked_ids["acme"] and len(load.acked_exps["acme"]) == 1 and load.turns == {"node-chaos-acme": 1}

    try:
        asyncio.run(main())
    finally:
        for shard_client in memory.coordinator.shards:
            shard_client.shard.close()
