"""``recallserve bench chat`` and ``bench search``: refusals and report maths (the timed runs need a cluster)."""

from __future__ import annotations

import pytest

from recallserve.deployments.cli import main
from recallserve.deployments.cli._bench_chat import TurnRow, render, summarise


def test_refuses_other_hosts_and_a_missing_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "chat", "--url", "http://example.com:8000"]) == 2
    assert "this machine only" in capsys.readouterr().err
    assert main(["bench", "chat", "--url", "http://127.0.0.1:9", "--repeats", "1"]) == 2
    assert "no cluster answering" in capsys.readouterr().err
    assert main(["bench", "chat", "--repeats", "0"]) == 2


def test_summary_takes_medians_of_successful_turns() -> None:
    rows = [TurnRow("cluster", "direct", i, 200, wall, 0.5, engine_calls=1, prompt_tokens=100, cached_tokens=60,
                    evaluated_tokens=40, completion_tokens=9, engine_s=engine, overhead=(wall - engine) / engine)
            for i, (wall, engine) in enumerate([(2.0, 1.0), (3.0, 2.0), (4.0, 2.0)])]
    rows.append(TurnRow("cluster", "direct", 3, 503, 0.1, None))
    (s,) = summarise(rows)
    assert (s["turns"], s["failed"], s["wall_s"], s["engine_s"]) == (4, 1, 3.0, 2.0)
    assert s["overhead"] == pytest.approx(1.0)  # (1.0, 0.5, 1.0) and s["evaluated_tokens"] == 40
    table = render([s])
    assert "| cluster | direct | 4 (1) | 3.00 s | 0.50 s | 2.00 s | 100% | 1 | 100 | 60 | 40 | 9 |" in table


def test_bench_search_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "search", "--url", "http://10.0.0.1:8000"]) == 2
    assert "this machine only" in capsys.readouterr().err
    assert main(["bench", "search", "--clients", "1,x"]) == 2
    assert main(["bench", "search", "--clients", "0"]) == 2
    assert main(["bench", "search", "--memories", "10"]) == 2
    assert main(["bench", "search", "--url", "http://127.0.0.1:9", "--seconds", "1"]) == 2
    assert "no cluster answering" in capsys.readouterr().err


def test_bench_search_split_reads_histogram_changes_from_metrics_text() -> None:
    from recallserve.deployments.cli._bench_search import _sums, split_means

    def page(search_sum: float, search_n: int, calls: int, forwards: int) -> str:
        return (
            "# TYPE recallserve_memory_search_seconds histogram\n"
            f'recallserve_memory_search_seconds_sum{{caller="api"}} {search_sum}\n'
            f'recallserve_memory_search_seconds_count{{caller="api"}} {search_n}\n'
            f'recallserve_memory_search_seconds_sum{{caller="chat"}} 99\n'
            f'recallserve_memory_search_seconds_count{{caller="chat"}} 99\n'
            "# TYPE recallserve_memory_hop_seconds histogram\n"
            f'recallserve_memory_hop_seconds_sum{{hop="embed_call"}} {0.01 * calls}\n'
            f'recallserve_memory_hop_seconds_count{{hop="embed_call"}} {calls}\n'
            f'recallserve_memory_hop_seconds_sum{{hop="embed_forward"}} {0.02 * forwards}\n'
            f'recallserve_memory_hop_seconds_count{{hop="embed_forward"}} {forwards}\n'
        )

    out = split_means(_sums(page(1.0, 10, 10, 10)), _sums(page(1.5, 20, 30, 15)))
    assert out["search_ms"] == pytest.approx(50.0)  # 0.5 s over 10 searches; the chat caller is not counted
    assert out["embed_call_ms"] == pytest.approx(10.0) and out["embed_forward_ms"] == pytest.approx(20.0)
    assert out["embed_batch"] == pytest.approx(4.0)  # 20 calls in 5 forward passes
    assert out["ingress_ms"] is None and out["shard_call_ms"] is None


def test_bench_search_cpu_per_answer_sums_processes_of_one_title() -> None:
    from recallserve.deployments.cli._bench_search import cpu_per_answer

    pids = {1: "ray::ServeReplica:app:embedder", 2: "ray::ProxyActor", 3: "ray::ProxyActor", 4: "gone"}
    got = cpu_per_answer(pids, {1: 1.0, 2: 0.0, 3: 5.0, 4: 1.0}, {1: 1.4, 2: 0.1, 3: 5.1}, 100)
    assert got == {"ray::ServeReplica:app:embedder": 4.0, "ray::ProxyActor": 2.0}
    assert cpu_per_answer(pids, {}, {}, 0) == {}


def test_bench_search_tells_a_proxy_refusal_from_the_ingress_admission() -> None:
    from ray.serve.exceptions import BackPressureError

    from recallserve.deployments.cli._bench_search import refusal_kind

    proxy = BackPressureError(num_queued_requests=8, max_queued_requests=8).message
    assert refusal_kind(proxy) == "proxy"
    assert refusal_kind('{"error": {"code": "memory_overloaded", "message": "too many searches"}}') == "memory_overloaded"
    assert refusal_kind("shard down") == "other"
    assert refusal_kind('{"error": {"code": "too_many_requests_in_flight"}}') == "per_key"
    assert refusal_kind('{"error": {"code": "ingress_unavailable"}}') == "haproxy_queue"


def test_the_demo_photo_prompt_sends_the_demo_question_with_its_photo() -> None:
    from recallserve.deployments.cli._bench_chat import PHOTO_PROMPT, PROMPTS, _user_content
    from recallserve.serve.agent.demo import DEMO_QUESTION

    assert PHOTO_PROMPT in [name for name, _q, _m in PROMPTS]
    text, image = _user_content(PHOTO_PROMPT, "")
    assert text == {"type": "text", "text": DEMO_QUESTION}
    assert image["type"] == "image_url" and image["image_url"]["url"].startswith("data:image/png;base64,")
    assert _user_content("one-tool", "What is the status of order 104333?") == "What is the status of order 104333?"


def test_bench_search_flood_runs_beside_the_level_and_reports_apart(capsys: pytest.CaptureFixture[str]) -> None:
    """``--flood-key``: another tenant's closed-loop clients run during the level; their statuses are
    reported apart from the measured clients' (here a stand-in server refuses the flooding key)."""
    import asyncio
    import random

    import httpx

    from recallserve.client import AsyncRecallServe, RetryPolicy
    from recallserve.deployments.cli._bench_search import _level, render

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text="")
        if request.headers["authorization"] == "Bearer flood":
            return httpx.Response(429, headers={"Retry-After": "1"},
                                  json={"error": {"code": "too_many_requests_in_flight"}})
        return httpx.Response(200, json={"object": "list", "data": []})

    def client(key: str) -> AsyncRecallServe:
        return AsyncRecallServe("http://rs", key, retry=RetryPolicy(max_retries=0), transport=httpx.MockTransport(answer))

    async def go() -> dict:
        async with client("me") as http:
            return await _level(http, 1, 1.2, random.Random(0), lambda: client("me"), (lambda: client("flood"), 3))

    row = asyncio.run(go())
    assert set(row["statuses"]) == {"200"} and row["flood"]["clients"] == 3
    assert set(row["flood"]["statuses"]) == {"429"} and row["flood"]["statuses"]["429"] >= 3
    table = render({"memories": 50, "levels": [row]})
    assert "| 1 | 3 | 429:" in table
    assert main(["bench", "search", "--flood-key", "sk-local"]) == 2  # the flood must be another tenant
    assert "--flood-key" in capsys.readouterr().err
    assert main(["bench", "search", "--flood-key", "x", "--flood-clients", "0"]) == 2
