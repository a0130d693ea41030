"""``resummarise --live``: long sessions are summarised through the app's ``state`` deployment
(the one writer of the session store) while it serves, resumably, with a dry run first.

Starts its own small Ray with an app of just the state deployment, and shuts it down.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import small_memory_ray

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RAY_DIR = ROOT / ".recallserve" / "ray-test-resum"
APP = "resumtest"


def _turns(store: Any, session_id: str, n: int) -> None:
    from recallserve.serve.context import ContextManager, MessageIn

    async def fill() -> None:
        manager = ContextManager(store)  # categorises and counts, as the ingress does
        session = await manager.open_session("acme", "u1", session_id)
        for i in range(n):
            text = f"Order {104200 + i} ships on day {i}." if i % 2 == 0 else f"Noted, turn {i}."
            await manager.append(session, [MessageIn(role="user" if i % 2 == 0 else "assistant", content=text)])

    asyncio.run(fill())


def test_resummarise_live_through_the_state_deployment(tmp_path: Path) -> None:
    from ray import serve

    from recallserve.deployments.jobs import JobError
    from recallserve.deployments.jobs import resummarise as job
    from recallserve.deployments.state import RemoteStore, StateStore

    with small_memory_ray(tmp_path / "memory", RAY_DIR) as config:
        dep = serve.deployment(StateStore, name="state").options(**config.state_store.to_ray_options())
        handle = serve.run(dep.bind(str(tmp_path / "state")), name=APP, route_prefix=None)
        store = RemoteStore(handle, "sessions")
        _turns(store, "s-long", 60)
        _turns(store, "s-short", 6)

        p = argparse.ArgumentParser()
        job.add_arguments(p)
        ckpt = tmp_path / "ckpt.json"
        argv = ["--live", "--app", APP, "--min-unsummarised", "40", "--checkpoint", str(ckpt), "--no-progress"]
        dry = job.run(p.parse_args([*argv, "--dry-run"]))
        assert dry.dry_run and dry.stats == {"sessions": 1, "would_fold_messages_at_most": 60}
        report = job.run(p.parse_args(argv))
        assert report.stats["resummarised"] == 1 and report.stats["messages_folded"] > 0 and ckpt.is_file()

        long_session = asyncio.run(store.get("acme", "u1", "s-long"))
        assert long_session.summary.until_seq >= 40 and "Order 104250 ships on day 50" in long_session.summary.text
        assert asyncio.run(store.get("acme", "u1", "s-short")).summary.until_seq == -1
        assert job.run(p.parse_args(argv)).stats == report.stats  # resumed from the finished checkpoint: no new work

        with pytest.raises(ValueError, match="--store: not used with --live"):
            job.run(p.parse_args([*argv, "--store", str(tmp_path / "x.sqlite3")]))
        # An app deployed before the state deployment existed: a clear error, not a hang.
        serve.run(serve.deployment(StateStore, name="other").options(**config.state_store.to_ray_options())
                  .bind(str(tmp_path / "other")), name="nostate", route_prefix=None)
        with pytest.raises(JobError, match="no deployment 'state'"):
            job.run(p.parse_args(["--live", "--app", "nostate", "--checkpoint", str(tmp_path / "c2.json")]))
