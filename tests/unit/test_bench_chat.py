"""``recallserve bench chat`` and ``bench search``: refusals and report maths (the timed runs need a cluster)."""

from __future__ import annotations

import pytest

from deployments.cli import main
from deployments.cli._bench_chat import TurnRow, render, summarise


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
