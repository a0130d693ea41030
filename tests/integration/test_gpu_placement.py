"""GPU profiles scheduled on a Ray with logical GPUs (no CUDA needed).

The engines are swapped for the tiny llama.cpp model in this test only, so every replica can
start on this CPU; what is checked is that Ray places each deployment with exactly the CPUs
and GPUs the profile asks for, and that all of them reach RUNNING.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deployments import runner
from deployments.config import ROLES, load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TINY_ENGINE = {"kind": "llama_cpp", "model": "smollm2-135m-instruct-q4_1", "n_ctx": 512, "n_threads": 1}


def _replica_resources(app_name: str) -> dict[str, list[dict[str, float]]]:
    from ray.util.state import list_actors

    found: dict[str, list[dict[str, float]]] = {}
    for actor in list_actors(filters=[("state", "=", "ALIVE")], detail=True, limit=1000):
        # NOTE: Serve names replica actor classes "ServeReplica:<app>:<deployment>".
        parts = (actor.class_name or "").split(":")
        if len(parts) == 3 and parts[0] == "ServeReplica" and parts[1] == app_name:
            found.setdefault(parts[2], []).append(dict(actor.required_resources or {}))
    return found


@pytest.mark.parametrize("profile, gpus", [("gpu-single", 1), ("gpu-cluster", 8)])
def test_gpu_profile_placement(profile: str, gpus: int, work_dir: Path, port: int) -> None:
    base = load_config(profile)
    overrides: dict[str, object] = {
        "server": {"host": "127.0.0.1", "port": port},
        "ray": {"address": None, "temp_dir": str(work_dir / "ray"), "num_cpus": 64, "num_gpus": gpus},
        "embedder": {**base.embedder.model_dump(mode="json"), "device": "cpu"},
        "memory": {**base.memory.model_dump(mode="json"), "data_dir": str(work_dir / f"mem-{profile}")},
    }
    for role in ROLES:
        overrides[role] = {"engine": TINY_ENGINE, "deployment": getattr(base, role).deployment.model_dump(mode="json")}
    config = load_config(profile, overrides=overrides)
    runner.start_ray(config)
    try:
        runner.deploy(config, timeout_s=900)
        placed = _replica_resources(config.name)
        for name, opts in config.deployment_options().items():
            assert name in placed, f"{profile}: deployment {name} has no running replica ({sorted(placed)})"
            expected_replicas = opts.autoscaling.min_replicas if opts.autoscaling else opts.num_replicas
            assert len(placed[name]) >= max(1, expected_replicas), f"{profile}: {name} replicas {placed[name]}"
            for res in placed[name]:
                assert res.get("GPU", 0.0) == pytest.approx(opts.num_gpus), f"{profile}: {name} GPU {res}"
                assert res.get("CPU", 0.0) == pytest.approx(opts.num_cpus), f"{profile}: {name} CPU {res}"
        gpu_total = sum(r.get("GPU", 0.0) for rs in placed.values() for r in rs)
        assert 0 < gpu_total <= gpus
    finally:
        runner.shutdown()
