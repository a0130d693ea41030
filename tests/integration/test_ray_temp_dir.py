"""A real Ray started by the runner in a folder too deep for its sockets, and found again by jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from recallserve.deployments import runner
from recallserve.deployments._ray_paths import MAX_TEMP_DIR_BYTES, ray_temp_dir_names
from recallserve.deployments.config import load_config
from recallserve.deployments.jobs._live import find_local_cluster

pytestmark = pytest.mark.integration


def test_ray_starts_in_a_deep_temp_dir_and_jobs_find_it(tmp_path: Path) -> None:
    import ray

    deep = tmp_path / ("a-checkout-deeper-than-usual-" * 2) / ".recallserve" / "ray"
    assert len(str(deep)) > MAX_TEMP_DIR_BYTES  # as given, ray.init would fail on the socket length
    config = load_config("cpu-local", overrides={"ray": {"temp_dir": str(deep), "num_cpus": 1}})
    runner.start_ray(config)
    try:
        gcs = ray.get_runtime_context().gcs_address
        assert ray.get(ray.put(41)) + 1 == 42  # the object store's socket works
        assert (deep / "session_latest").exists()  # Ray's files are in the configured folder
        assert find_local_cluster(deep) == gcs  # `recallserve job --live` finds this cluster
    finally:
        ray.shutdown()
        ray_temp_dir_names(deep)[1].unlink(missing_ok=True)  # the alias would dangle once tmp_path goes
