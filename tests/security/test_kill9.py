"""No acknowledged write is lost when the process holding the shards is killed with SIGKILL
while 8 clients write through HTTP.

The server is a real process (``tests/security/_server.py``: the ingress app with two hybrid
shards and their WALs); 8 threads post single-memory writes as fast as it answers and record an id
only when its ``200`` arrives. After at least ``MIN_ACKED`` acknowledgements the process gets
``kill -9`` mid-traffic (writes are in flight: some are never answered, which is allowed); a
second process starts on the same folder, replays the WALs, and every acknowledged id must read
back through ``GET /v1/memories/{id}`` with the text that was sent, for the tenant that wrote it,
and stay invisible to the other tenant.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.unit.edge.conftest import headers

ROOT = Path(__file__).resolve().parents[2]
WRITERS = 8
MIN_ACKED = 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.security._server", str(data), str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("server did not answer /healthz within 90 s")


def test_kill_9_under_8_http_writers_loses_no_acknowledged_write(tmp_path: Path) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = _start(tmp_path, port)
    acked: dict[str, str] = {}
    lock, stop = threading.Lock(), threading.Event()
    errors: list[str] = []

    def writer(w: int) -> None:
        with httpx.Client(base_url=base, headers=headers("acme"), timeout=10.0) as http:
            n = 0
            while not stop.is_set() and n < 5000:
                n += 1
                text = f"writer {w} note {n}: valve {n % 13} reads {n % 97} bar"
                try:
                    r = http.post("/v1/memories", json={"memories": [{"text": text}]})
                except httpx.HTTPError:
                    continue  # in flight at the kill, or refused after it: never acknowledged
                if r.status_code == 200:
                    with lock:
                        acked[r.json()["ids"][0]] = text
                else:
                    errors.append(f"{r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(WRITERS)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 240
        while len(acked) < MIN_ACKED and time.monotonic() < deadline and not errors:
            time.sleep(0.05)
        assert not errors, errors[:3]
        assert len(acked) >= MIN_ACKED, f"only {len(acked)} writes acknowledged in 240 s"
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == -signal.SIGKILL

    with lock:
        snapshot = dict(acked)
    again = _start(tmp_path, port)
    try:
        with httpx.Client(base_url=base, timeout=10.0) as http:
            lost = []
            for rid, text in snapshot.items():
                r = http.get(f"/v1/memories/{rid}", headers=headers("acme"))
                if r.status_code != 200 or r.json()["text"] != text:
                    lost.append((rid, r.status_code))
            assert not lost, f"{len(lost)} of {len(snapshot)} acknowledged writes lost: {lost[:5]}"
            # the other tenant sees none of them, and reads as for an unknown id
            for rid in list(snapshot)[:20]:
                assert http.get(f"/v1/memories/{rid}", headers=headers("globex")).status_code == 404
    finally:
        again.send_signal(signal.SIGTERM)
        try:
            again.wait(timeout=30)
        except subprocess.TimeoutExpired:
            again.kill()
            again.wait()
