"""``recallserve bench verify`` in process: its requests go through ``recallserve.client`` to the real
ingress app, and every run's app answers them (a 5xx or a failed ordinary request fails the bench).

Only the in-thread and on-the-loop runs here (no worker process to spawn); the figures are the
bench's (``loadtests/results/verify-bench*.md``), not this test's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from recallserve.serve.bench import _verify_app, _verify_measure
from tests.unit.agent.conftest import ScriptedEngine


@pytest.mark.parametrize("mode", ["thread", "loop"])
def test_each_run_answers_its_probes_and_hostile_posts(tmp_path: Path, mode: str) -> None:
    app, service = _verify_app(tmp_path, mode, ScriptedEngine([]))
    try:
        out = asyncio.run(_verify_measure(app, probes=20, posters=1))
    finally:
        service.close()
    assert out["posters"] == 1 and out["hostile_posts"] >= 1 and out["hostile_post_p50_ms"] > 0
    assert 0 < out["p50_ms"] <= out["p95_ms"]
