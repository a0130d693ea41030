"""Helpers for tests that start a real Ray cluster on this machine."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recallserve.serve.ports import free_port

ROOT = Path(__file__).resolve().parents[2]




@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short folder for Ray's files (unix socket paths must stay under ~100 characters)."""
    return tmp_path_factory.mktemp("rs")


@pytest.fixture(scope="module")
def port() -> int:
    """A free port for one module's cluster."""
    return free_port()


@contextlib.contextmanager
def small_memory_ray(data_dir: Path, ray_dir: Path) -> Iterator[Any]:
    """A local Ray (2 CPUs, no dashboard, files in ``ray_dir``) for the memory deployments, and
    the cpu-local config with 2 small shards under ``data_dir``; Serve and Ray shut down on exit."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # NOTE: replicas import the test modules and the project packages by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    import ray
    from ray import serve

    from recallserve.deployments._ray_paths import ray_temp_dir
    from recallserve.deployments.config import load_config

    config = load_config("cpu-local", overrides={
        "memory": {"num_shards": 2, "data_dir": str(data_dir), "deployment": {"num_cpus": 0.2}},
        "embedder": {"max_batch_size": 8, "batch_wait_timeout_s": 0.02, "deployment": {"num_cpus": 0.3, "max_surge_percent": 100}},
    })
    shutil.rmtree(ray_dir, ignore_errors=True)
    ray_dir.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=str(ray_temp_dir(ray_dir)), log_to_driver=False)
    try:
        yield config
    finally:
        serve.shutdown()
        ray.shutdown()
