"""GPU profiles scheduled on a Ray with logical GPUs (no CUDA needed).

The engines are swapped for the tiny llama.cpp model in this test only, so every replica can
start on this CPU; what is checked is that Ray places each deployment with exactly the CPUs
and GPUs the profile asks for, and that all of them reach RUNNING.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recallserve.deployments import runner
from recallserve.deployments.config import ROLES, load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TINY_ENGINE = {"kind": "llama_cpp", "model": "smollm2-135m-instruct-q4_1", "n_ctx": 512, "n_threads": 1}


def _replica_state(app_name: str, name: str) -> tuple[int, dict[str, float]]:
    """(running replicas, resources one replica holds) of a deployment."""
    from ray import serve

    status = serve.status().applications[app_name].deployments[name]
    running = int(status.replica_states.get("RUNNING", 0))
    handle = serve.get_deployment_handle(name, app_name=app_name)
    return running, handle.assigned_resources.remote().result(timeout_s=60)


@pytest.mark.parametrize("profile, gpus", [("gpu-single", 1), ("gpu-cluster", 8)])
def test_gpu_profile_placement(profile: str, gpus: int, work_dir: Path, port: int) -> None:
    base = load_config(profile)
    overrides: dict[str, object] = {
        "server": {"host": "127.0.0.1", "port": port},
        "ray": {"address": None, "temp_dir": str(work_dir / "ray"), "num_cpus": 64, "num_gpus": gpus},
        "auth": {"keys": {"sk-test": "test"}},
        "embedder": {**base.embedder.model_dump(mode="json"), "device": "cpu"},
        # NOTE: shards keep their GPU share (what is checked) but run their scan on the CPU (no CUDA here).
        "memory": {**base.memory.model_dump(mode="json"), "data_dir": str(work_dir / f"mem-{profile}"),
                   "placement": {**base.memory.placement.model_dump(mode="json"), "device": "cpu"}},
        "state_dir": str(work_dir / f"state-{profile}"),
    }
    for role in ROLES:
        overrides[role] = {"engine": TINY_ENGINE, "deployment": getattr(base, role).deployment.model_dump(mode="json")}
    config = load_config(profile, overrides=overrides)
    runner.start_ray(config)
    try:
        runner.deploy(config, timeout_s=900)
        gpu_total = 0.0
        for name, opts in config.deployment_options().items():
            running, res = _replica_state(config.name, name)
            expected = opts.autoscaling.min_replicas if opts.autoscaling else opts.num_replicas
            assert running >= max(1, expected), f"{profile}: {name} has {running} running replicas, expected {expected}"
            assert res.get("GPU", 0.0) == pytest.approx(opts.num_gpus), f"{profile}: {name} holds {res}"
            assert res.get("CPU", 0.0) == pytest.approx(opts.num_cpus), f"{profile}: {name} holds {res}"
            gpu_total += running * res.get("GPU", 0.0)
        print(f"{profile}: {len(config.deployment_options())} deployments placed, {gpu_total:g} of {gpus} GPUs used")
        assert 0 < gpu_total <= gpus
    finally:
        runner.shutdown()
