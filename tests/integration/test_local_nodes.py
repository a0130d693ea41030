"""Issue 37 part B on this machine: 3 raylets (head + 2 workers), a whole worker node SIGKILLed twice under
2 tenants' load, and the head's GCS down for 30 s with its tables in Debian's redis-server.

One module-scoped cluster (cpu-local, the chat roles on the tiny smollm2 model) serves all three tests;
the load and the checks are those of ``loadtests/node_chaos.py`` (the 10-kill run), with fewer kills.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from loadtests import node_chaos as nc
from loadtests._cluster import scratch_config
from recallserve.deployments import runner
from recallserve.deployments.config import STATE_DSN_ENV
from tests._postgres import fresh_schema_dsn

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs Debian's redis-server (scripts/system_deps.sh)")]


@pytest.fixture(scope="module")
def cluster(work_dir: Path, port: int, postgres_dsn: str) -> Iterator[tuple[Any, Any]]:
    redis = nc.RedisServer(work_dir / "redis")
    # NOTE: the cluster profile's state: sessions, experiences and traces in PostgreSQL, every ingress
    # replica with its own pool (as `recallserve up --nodes 3 --state-dsn DSN`).
    os.environ[STATE_DSN_ENV] = fresh_schema_dsn(postgres_dsn)
    config = scratch_config("cpu-local", port, work_dir, "smollm2-135m-instruct-q4_1",
                            ray={"temp_dir": str(work_dir / "ray"), "nodes": 3, "ingress": "proxy",
                                 "redis_address": redis.address},
                            state_db={"dsn_env": STATE_DSN_ENV})
    assert config.state_db.enabled
    saved = os.environ.get("RECALLSERVE_API_KEYS")
    os.environ["RECALLSERVE_API_KEYS"] = nc.tenant_keys_env(config.memory.num_shards)
    runner.prepare_models(config, progress=False)
    redis.start()
    try:
        runner.start_ray(config)
        runner.deploy(config, timeout_s=900)
        nodes = runner.local_nodes()
        assert nodes is not None
        yield config, nodes
    finally:
        runner.shutdown()
        redis.stop()
        os.environ.pop(STATE_DSN_ENV, None)
        if saved is None:
            os.environ.pop("RECALLSERVE_API_KEYS", None)
        else:
            os.environ["RECALLSERVE_API_KEYS"] = saved


def _status(nodes: Any) -> dict[str, Any]:
    """``recallserve status --json`` in a process of its own, as a user runs it."""
    proc = subprocess.run([sys.executable, "-m", "recallserve.deployments.cli", "status", "--json",
                           "--ray-address", nodes.gcs_address], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_status_shows_every_node_and_replica_with_shards_on_two_workers(cluster: tuple[Any, Any]) -> None:
    config, nodes = cluster
    status = _status(nodes)
    alive = [n for n in status["nodes"] if n["alive"]]
    assert sorted(n["role"] for n in alive) == ["head", "worker", "worker"]
    for n in alive:
        assert psutil.Process(n["raylet_pid"]).name() == "raylet"
    assert {n["raylet_pid"] for n in alive} == {nodes.raylet_pid(x) for x in [nodes.head, *nodes.workers]}
    mine = [r for r in status["replicas"] if r["app"] == config.name]
    roles = {n["node_id"]: n["role"] for n in alive}
    shard_nodes = {r["node_id"] for r in mine if r["deployment"].startswith("memory_shard_")}
    assert len(shard_nodes) == 2 and all(roles[n] == "worker" for n in shard_nodes)
    assert len([r for r in mine if r["deployment"] == "ingress"]) >= 2
    for r in mine:
        assert r["state"] == "ALIVE" and psutil.pid_exists(r["pid"]) and r["node_id"] in roles


def test_two_whole_node_kills_lose_no_acknowledged_write_turn_or_experience(cluster: tuple[Any, Any]) -> None:
    config, nodes = cluster
    load, tenants, homes, thread = nc.start_load(config, config.server.port)
    try:
        kills = nc.kill_nodes(config, nodes, load, tenants, homes, kills=2, every=8, recovery_timeout=90)
        time.sleep(5)
    finally:
        load.stop.set()
        thread.join(timeout=120)
    lost = nc.verify(load, tenants)
    report = nc.summarise(load, kills, lost)
    print(json.dumps({k: v for k, v in report.items() if k != "failure_samples"}, indent=1))
    assert [k["recovery_s"] is not None for k in kills] == [True, True]
    assert all(len(k["pids"]) >= 2 for k in kills)  # the raylet and at least one process under it
    assert lost["acked_writes"] > 0 and lost["acked_turns"] > 0 and lost["acked_experiences"] > 0
    assert nc.nothing_lost(lost), {k: v for k, v in lost.items() if k != "message_counts"}
    assert sorted(n["role"] for n in _status(nodes)["nodes"] if n["alive"]) == ["head", "worker", "worker"]


def test_gcs_down_30_s_keeps_chat_and_memory_answered_and_the_cluster_whole(cluster: tuple[Any, Any]) -> None:
    config, nodes = cluster
    before = _status(nodes)
    load, tenants, _homes, thread = nc.start_load(config, config.server.port)
    try:
        time.sleep(3)
        outage = nc.gcs_outage(nodes, 30)
        time.sleep(10)
    finally:
        load.stop.set()
        thread.join(timeout=120)
    # NOTE: counted once the load stopped: a turn started in the outage may be answered after it.
    outage.update(nc.outage_requests(load.records, outage["t0"], outage["t1"]))
    print(json.dumps(outage, indent=1))
    assert outage["down_s"] >= 30
    kinds = outage["by_kind"]
    assert kinds["turn"]["ok"] >= 1 and kinds.get("write", {}).get("ok", 0) + kinds.get("search", {}).get("ok", 0) >= 1
    assert outage["ok"] == outage["requests"], outage
    after = _status(nodes)
    assert [n["node_id"] for n in after["nodes"] if n["alive"]] == [n["node_id"] for n in before["nodes"] if n["alive"]]
    assert {r["pid"] for r in after["replicas"] if r["app"] == config.name} == \
        {r["pid"] for r in before["replicas"] if r["app"] == config.name}
    lost = nc.verify(load, tenants)
    assert nc.nothing_lost(lost), {k: v for k, v in lost.items() if k != "message_counts"}
