"""``ray.throughput_optimized``: Serve's throughput switches are set only while the embedded Ray starts."""

from __future__ import annotations

import os

import pytest

from recallserve.deployments.config import RayConfig
from recallserve.deployments.runner import THROUGHPUT_ENV, _throughput_mode


def test_the_switches_are_on_while_ray_starts_and_taken_back_after(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THROUGHPUT_ENV:
        monkeypatch.delenv(name, raising=False)
    assert RayConfig().throughput_optimized  # the default of every profile
    with _throughput_mode(True):
        assert {n: os.environ.get(n) for n in THROUGHPUT_ENV} == THROUGHPUT_ENV
    # NOTE: direct ingress stays off: the proxy must serve server.port.
    assert THROUGHPUT_ENV["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "0"
    assert all(os.environ.get(n) is None for n in THROUGHPUT_ENV)


def test_off_sets_nothing_and_a_value_the_user_exported_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    names = list(THROUGHPUT_ENV)
    monkeypatch.delenv(names[0], raising=False)
    monkeypatch.setenv(names[1], "1")
    with _throughput_mode(False):
        assert os.environ.get(names[0]) is None
    with _throughput_mode(True):
        assert os.environ.get(names[0]) == "1"
        assert os.environ.get(names[1]) == "1"
    assert os.environ.get(names[0]) is None and os.environ.get(names[1]) == "1"


def test_the_ingress_puts_the_drivers_handles_on_the_grpc_data_plane() -> None:
    """Handles made by the driver keep actor calls unless the replica that calls them moves them."""
    from ray.serve.handle import DeploymentHandle

    from recallserve.deployments.handles import on_data_plane

    class Handle(DeploymentHandle):  # NOTE: a real handle's options() needs a running Serve controller
        def __init__(self) -> None:
            self.asked: dict | None = None

        def options(self, **kw):  # type: ignore[override]
            self.asked = kw
            return self

    hs = [Handle() for _ in range(3)]
    nested = on_data_plane({"embedder": hs[0], "generations": [{"shards": [hs[1], hs[2]]}], "n": 3}, True)
    assert nested["n"] == 3 and nested["generations"][0]["shards"] == [hs[1], hs[2]]
    assert all(h.asked == {"_by_reference": False} for h in hs)
    assert on_data_plane(hs[0], False).asked == {"_by_reference": True}


def test_the_chart_sets_the_same_variables_as_the_embedded_ray() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "helm/recallserve/templates/_helpers.tpl").read_text()
    block = text.split("{{- if .Values.serveThroughputOptimized }}", 1)[1].split("{{- end }}", 1)[0]
    chart = dict(re.findall(r'- name: (\w+)\n\s+value: "(\w+)"', block))
    assert chart == THROUGHPUT_ENV
