"""Per-tenant retention limits (``auth.retention``), enforced by the expiry job: memories on the
shards, sessions and traces in the state folder; other tenants and newer data are kept."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from recallserve.deployments.config import RetentionLimits
from recallserve.deployments.jobs.expiry_sweep import expire_state, sweep
from recallserve.serve.context import SessionStore
from recallserve.serve.traces import TraceStore
from recallserve.serve.traces._models import TurnTrace

from .test_jobs import DAY, NOW, _opts, _read, _rec, _write


def test_memory_retention_deletes_only_that_tenants_older_memories(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    _write(root, 0, [_rec("t1-old", "t1", "zqold note", age_days=40), _rec("t1-new", "t1", "fresh note", age_days=5),
                     _rec("t2-old", "t2", "other tenant note", age_days=400)])
    report = sweep(_opts(root, num_shards=1), now=NOW, archive_below=0, memory_retention_days={"t1": 30})
    assert report.stats["retention_deleted"] == 1
    assert set(_read(root, 0)) == {"t1-new", "t2-old"}


def test_sessions_and_traces_retention_on_the_state_folder(tmp_path: Path) -> None:
    now = time.time()

    async def fill() -> None:
        sessions = SessionStore(tmp_path / "sessions.sqlite3")
        traces = TraceStore(tmp_path / "turns.sqlite3")
        for tenant in ("t1", "t2"):
            await sessions.open(tenant, "u", "s-old")
            await traces.put(tenant, TurnTrace(id="turn-old", created_at=now - 3 * DAY, user="u", question="q",
                                               answer="a", path="plain", finish_reason="stop"))
            await traces.put(tenant, TurnTrace(id="turn-new", created_at=now, user="u", question="q", answer="a",
                                               path="plain", finish_reason="stop"))
        sessions.close()
        traces.close()

    asyncio.run(fill())
    # NOTE: the sessions were just opened: a limit of 1e-6 days (0.09 s) makes them old after a short wait.
    time.sleep(0.2)
    counts = expire_state(tmp_path, {"t1": RetentionLimits(sessions_days=1e-6, traces_days=1)}, time.time())
    assert counts["sessions"] == 1 and counts["turns"] == 1

    async def left() -> tuple[int, int, int]:
        traces = TraceStore(tmp_path / "turns.sqlite3")
        sessions = SessionStore(tmp_path / "sessions.sqlite3")
        try:
            t1 = len((await traces.export_user("t1", None))["turns"])
            t2 = len((await traces.export_user("t2", None))["turns"])
            s2 = len((await sessions.export_user("t2", None))["sessions"])
            return t1, t2, s2
        finally:
            traces.close()
            sessions.close()

    assert asyncio.run(left()) == (1, 2, 1)


def test_operator_erase_job_erases_a_whole_tenant_from_the_folders(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from recallserve.deployments.config import PROFILES_DIR
    from recallserve.deployments.jobs.erase import main

    from .test_jobs import EMB

    root = tmp_path / "memory"
    _write(root, 0, [_rec("t1-a", "t1", "zqtenant note one"), _rec("t2-a", "t2", "other tenant note")])
    _write(root, 1, [_rec("t1-b", "t1", "zqtenant note two")])
    config = tmp_path / "profile.yaml"
    profile = yaml.safe_load((PROFILES_DIR / "cpu-local.yaml").read_text())
    config.write_text(yaml.safe_dump({**profile, "state_dir": str(tmp_path / "state")}))

    async def plant() -> None:
        traces = TraceStore(tmp_path / "state" / "turns.sqlite3")
        await traces.put("t1", TurnTrace(id="turn-1", created_at=time.time(), user="u", question="zqtenant question",
                                         answer="a", path="plain", finish_reason="stop"))
        traces.close()

    asyncio.run(plant())
    args = ["--config", str(config), "--data-dir", str(root), "--model-id", EMB.model_id, "--dim", str(EMB.dim),
            "--tenant", "t1", "--json"]
    assert main(args) == 0
    assert '"memories": 2' in capsys.readouterr().out
    held = [p for p in tmp_path.rglob("*") if p.is_file() and b"zqtenant" in p.read_bytes()]
    assert held == []
    assert set(_read(root, 0)) == {"t2-a"}
    assert main([*args[:-3], "--tenant", "shared"]) == 2
