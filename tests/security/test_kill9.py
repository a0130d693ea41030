"""No acknowledged write is lost when the process holding the shards is killed with SIGKILL
while 8 clients write through HTTP.

The server is a real process (``tests/security/_server.py``: the ingress app with two hybrid
shards and their WALs); 8 threads post single-memory writes as fast as it answers and record an id
only when its ``200`` arrives. After at least ``MIN_ACKED`` acknowledgements the process gets
``kill -9`` mid-traffic (writes are in flight: some are never answered, which is allowed); a
second process starts on the same folder, replays the WALs, and every acknowledged id must read
back through ``GET /v1/memories/{id}`` with the text that was sent, for the tenant that wrote it,
and stay invisible to the other tenant.

Both servers are forked from one ``forkserver`` that imported the app's modules once (torch,
FastAPI, the services): each is still a fresh process that builds the app on the folder (the second
replays the WALs), but the suite pays the imports once instead of once per start.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import threading
import time
from collections.abc import Iterator
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path

import httpx
import pytest

from tests.security import _server
from tests.unit.edge.conftest import headers
from recallserve.serve.ports import free_port

# NOTE: slow: it starts the server as a process (twice) and kills it with SIGKILL.
pytestmark = pytest.mark.slow

WRITERS = 8
MIN_ACKED = 200


@pytest.fixture
def servers() -> Iterator[ForkServerContext]:
    """A ``forkserver`` context whose server has imported :mod:`tests.security._server`; stopped after the test."""
    ctx = multiprocessing.get_context("forkserver")
    assert isinstance(ctx, ForkServerContext)
    ctx.set_forkserver_preload([_server.__name__])
    try:
        yield ctx
    finally:
        ctx.set_forkserver_preload([])
        # NOTE: private, but the only way to end the forkserver (it holds torch's memory) before
        # the session ends; without it the server simply lives until pytest exits.
        stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
        if stop is not None:
            stop()


def _start(ctx: ForkServerContext, data: Path, port: int) -> BaseProcess:
    proc = ctx.Process(target=_server.main, args=([str(data), str(port)],))
    proc.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if not proc.is_alive():
            raise AssertionError(f"server exited {proc.exitcode} (its traceback is in the captured stderr)")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("server did not answer /healthz within 90 s")


def test_kill_9_under_8_http_writers_loses_no_acknowledged_write(tmp_path: Path,
                                                                 servers: ForkServerContext) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = _start(servers, tmp_path, port)
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
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        server.join(timeout=30)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        if server.is_alive():
            server.kill()
            server.join()
    assert server.exitcode == -signal.SIGKILL

    with lock:
        snapshot = dict(acked)
    again = _start(servers, tmp_path, port)
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
        again.terminate()
        again.join(timeout=30)
        if again.is_alive():
            again.kill()
            again.join()
