"""Metrics summed over processes (several ingress replicas on one machine or pod), and the exporter."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from recallserve.serve.api.metrics import MULTIPROC_ENV, render_metrics

# A replica: records 'n' requests and marks generation 'gen' as serving, then waits for stdin to close.
_REPLICA = """
import sys
from prometheus_client import Counter
from recallserve.serve.api.metrics import MEMORY_ROUTING, REQUESTS
Counter("ray_internal_thing", "a metric of another component sharing the folder").inc()
REQUESTS.labels("/v1/chat/completions", "POST", "200").inc(int(sys.argv[1]))
MEMORY_ROUTING.labels(sys.argv[2], "serving", "true", "true").set(1)
print("ready", flush=True)
sys.stdin.read()
"""


def _replica(folder: Path, n: int, gen: str) -> subprocess.Popen[str]:
    env = {**os.environ, MULTIPROC_ENV: str(folder)}
    proc = subprocess.Popen([sys.executable, "-c", _REPLICA, str(n), gen], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)


def _sample(text: str, prefix: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.slow
def test_counters_add_up_over_replicas_and_exited_ones_keep_their_counts(tmp_path: Path) -> None:
    requests = 'recallserve_http_requests_total{method="POST",route="/v1/chat/completions",status="200"}'
    old, live = _replica(tmp_path, 3, "old"), _replica(tmp_path, 4, "new")
    try:
        text = render_metrics(tmp_path).decode()
        assert _sample(text, requests) == 7.0  # one series, the sum of both processes
        assert "ray_internal_thing" not in text  # only recallserve's own families
        _stop(old)  # a replica replaced by a roll-out
        text = render_metrics(tmp_path).decode()
        assert _sample(text, requests) == 7.0  # totals never go backwards
        # Its gauge no longer holds: only the live replica's generation is reported.
        assert 'generation="new"' in text and 'generation="old"' not in text
    finally:
        for proc in (old, live):
            if proc.poll() is None:
                _stop(proc)


def test_without_the_folder_this_process_registry_is_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    assert b"# HELP recallserve_http_requests_total" in render_metrics()


@pytest.mark.slow
def test_exporter_serves_the_sum_on_its_port(tmp_path: Path) -> None:
    from recallserve.serve.api.metrics_exporter import build_server

    replica = _replica(tmp_path, 5, "g")
    server = build_server(tmp_path, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        r = httpx.get(f"{base}/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert 'recallserve_http_requests_total{method="POST",route="/v1/chat/completions",status="200"} 5.0' in r.text
        assert httpx.get(f"{base}/healthz").text == "ok\n"
        assert httpx.get(f"{base}/other").status_code == 404
    finally:
        server.shutdown()
        server.server_close()
        _stop(replica)


def test_exporter_needs_a_folder(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from recallserve.serve.api.metrics_exporter import main

    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    with pytest.raises(SystemExit):
        main([])
    assert f"--dir: no metrics folder given and ${MULTIPROC_ENV} is unset" in capsys.readouterr().err


def test_the_runner_sets_the_folder_only_while_ray_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recallserve.deployments.runner import _metrics_folder

    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "counter_1.db").write_bytes(b"stale")  # from an earlier cluster
    with _metrics_folder(folder):
        assert os.environ[MULTIPROC_ENV] == str(folder)
        assert list(folder.iterdir()) == []
    assert MULTIPROC_ENV not in os.environ  # the driver and later tests keep their own registry
    monkeypatch.setenv(MULTIPROC_ENV, "/elsewhere")
    with _metrics_folder(folder):
        assert os.environ[MULTIPROC_ENV] == "/elsewhere"  # the user's choice stands


def test_a_client_that_goes_away_is_499_not_a_server_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request cancelled under the server (the client closed the connection) is counted as 499."""
    import asyncio

    from fastapi import APIRouter

    from recallserve.serve.api.app import create_app
    from recallserve.serve.api.auth import Authenticator
    from recallserve.serve.pipeline import ChatPipeline, PipelineSettings

    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    router = APIRouter()

    @router.get("/v1/slow-test-route")
    async def slow() -> dict[str, str]:
        await asyncio.sleep(30)
        return {}

    app = create_app(ChatPipeline(object(), PipelineSettings(model_name="m", max_request_tokens=8)),  # type: ignore[arg-type]
                     Authenticator({"sk": "t"}), routers=[router])
    series = 'recallserve_http_requests_total{method="GET",route="/v1/slow-test-route",status="%s"}'

    async def call() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            request = asyncio.create_task(client.get("/v1/slow-test-route"))
            await asyncio.sleep(0.2)
            request.cancel()  # what Serve does to a request whose client disconnected
            with pytest.raises(asyncio.CancelledError):
                await request

    asyncio.run(call())
    text = render_metrics().decode()
    assert _sample(text, series % "499") == 1.0 and _sample(text, series % "500") is None


_TENANT_REPLICA = """
import sys
from recallserve.serve.api.metrics import TENANT_REQUESTS
TENANT_REQUESTS.labels(sys.argv[1], "200").inc(int(sys.argv[2]))
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_per_tenant_counts_add_up_over_replicas_and_stay_off_metrics(tmp_path: Path) -> None:
    from recallserve.serve.api.metrics import render_tenant_metrics

    env = {**os.environ, MULTIPROC_ENV: str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", _TENANT_REPLICA, "acme", str(n)], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE) for n in (2, 5)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        tenant_text = render_tenant_metrics(tmp_path).decode()
        assert _sample(tenant_text, 'recallserve_tenant_http_requests_total{status="200",tenant="acme"}') == 7.0
        # NOTE: /metrics answers without a key: no tenant name or per-tenant family there.
        assert "acme" not in render_metrics(tmp_path).decode()
    finally:
        for proc in procs:
            _stop(proc)
