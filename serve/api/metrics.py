"""Prometheus metrics of recallserve, and how they are rendered for a scrape.

Metrics live in prometheus-client's default registry of each process. A cluster has several
processes that record them (two or more ingress replicas, say), while a scrape of ``/metrics``
through the Serve proxy reaches one replica at random, so a per-process render would jump between
replicas' counts and make every ``rate()`` wrong. With ``PROMETHEUS_MULTIPROC_DIR`` set (the runner
sets it for ``recallserve up``; the Helm chart sets it in every Ray pod) each process writes its
values to files in that folder, and :func:`render_metrics` sums them over all processes of the
machine or pod: counters and histograms add up (a stopped replica's counts stay in the sum, so
totals never go backwards), gauges keep the most recent value of a live process
(``multiprocess_mode="livemostrecent"``; files of processes that have exited are dropped at each
render). Without the variable it renders this process's registry, as before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = ["REQUESTS", "LATENCY", "TENANT_PREFIX", "TENANT_REGISTRY", "TENANT_REQUESTS", "TENANT_LATENCY",
           "render_tenant_metrics", "TOKENS", "TIME_TO_FIRST_TOKEN", "MEMORY_SEARCH", "MEMORY_HOP", "MEMORY_ROUTING",
           "MEMORY_MIGRATION_WRITES", "STATE_CALL", "MULTIPROC_ENV", "GAUGE_MODE", "render_metrics", "CONTENT_TYPE_LATEST"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# NOTE: the mode every recallserve gauge uses; ignored when the process is not in multiprocess mode.
GAUGE_MODE = "livemostrecent"

REQUESTS = Counter("recallserve_http_requests_total", "HTTP requests by route and status.", ["route", "method", "status"])
# NOTE: buckets span 5 ms (a cached memory search) to 5 min (a long CPU generation).
LATENCY = Histogram(
    "recallserve_http_request_seconds", "HTTP request latency by route.", ["route", "method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
# NOTE: per-tenant figures for the console's Health page (a tenant sees only its own): in a registry of
# their own and left out of /metrics, which answers without a key, so no tenant name or traffic shows
# there. The tenant label is bounded by the configured API keys (a bad key counts for no tenant).
TENANT_PREFIX = "recallserve_tenant_"
TENANT_REGISTRY = CollectorRegistry(auto_describe=True)
TENANT_REQUESTS = Counter(TENANT_PREFIX + "http_requests_total", "HTTP requests by tenant and status.",
                          ["tenant", "status"], registry=TENANT_REGISTRY)
TENANT_LATENCY = Histogram(TENANT_PREFIX + "http_request_seconds", "HTTP request latency by tenant.", ["tenant"],
                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
                           registry=TENANT_REGISTRY)
TOKENS = Counter("recallserve_tokens_total", "Tokens processed per model role.", ["role", "direction"])
TIME_TO_FIRST_TOKEN = Histogram(
    "recallserve_time_to_first_token_seconds", "Time to the first streamed token.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)

MEMORY_SEARCH = Histogram(
    "recallserve_memory_search_seconds", "Memory search latency (embed + shard fan-out + fusion), by caller.",
    ["caller"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

# NOTE: where a search's time goes (issue 15): each hop as the ingress waits for it ("embed_call",
# "shard_call": queueing, transport, pickling and the work) and the work inside the replica
# ("embed_forward" per batch of embed calls, "shard_search" per call, thread wait included);
# call minus work is the hop's overhead, and embed_call count / embed_forward count the batch size.
# Bulk embed calls (ingestion, issue 16) run in a lane of their own and count as "embed_bulk_forward".
MEMORY_HOP = Histogram(
    "recallserve_memory_hop_seconds", "Memory tier hops: a call as the ingress sees it, and the work inside the replica.",
    ["hop"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)

# NOTE: during a re-embed (memory.migration) every write goes to two generations; a write that
# reached the old one but failed on the new one is answered 5xx and left for the fill job's
# next run, so its count tells the operator when to run `reembed --live` again.
MEMORY_ROUTING = Gauge(
    "recallserve_memory_generation", "1 for each memory generation this ingress uses, by role (serving/target), "
    "reads and writes side.", ["generation", "role", "reads", "writes"], multiprocess_mode=GAUGE_MODE,
)
MEMORY_MIGRATION_WRITES = Counter(
    "recallserve_memory_migration_writes_total", "Writes during a memory migration, by generation and outcome "
    "(ok / failed).", ["generation", "outcome"],
)

# NOTE: sessions and experiences sit behind one state deployment; a chat turn makes ~3 calls, so
# this is where a saturated or rolling state replica shows first.
STATE_CALL = Histogram(
    "recallserve_state_call_seconds", "Calls from the ingress to the state deployment, by store, method and "
    "outcome (ok / error: the store's own error / unavailable: the replica could not be reached).", ["store", "method", "outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
)


_LIVE_GAUGE_FILE = re.compile(r"^gauge_live\w+?_(\d+)\.db$")


def _drop_exited_processes(folder: Path) -> None:
    """Remove the live-gauge files of processes that have exited (their gauges no longer hold)."""
    import psutil
    from prometheus_client import multiprocess

    pids = {int(m.group(1)) for f in folder.glob("gauge_live*.db") if (m := _LIVE_GAUGE_FILE.match(f.name))}
    for pid in pids:
        if not psutil.pid_exists(pid):
            multiprocess.mark_process_dead(pid, str(folder))


def render_metrics(folder: str | Path | None = None) -> bytes:
    """Prometheus text of every process sharing the metrics folder, or of this process alone.

    Args:
        folder: the multiprocess folder; None reads ``$PROMETHEUS_MULTIPROC_DIR`` and renders the
            default registry of this process when that is unset.
    """
    folder = folder if folder is not None else os.environ.get(MULTIPROC_ENV)
    if not folder:
        return generate_latest()
    from prometheus_client import multiprocess

    _drop_exited_processes(Path(folder))
    registry = CollectorRegistry()
    registry.register(_OwnMetrics(multiprocess.MultiProcessCollector(None, path=str(folder))))
    return generate_latest(registry)


def render_tenant_metrics(folder: str | Path | None = None) -> bytes:
    """Prometheus text of the per-tenant families (``recallserve_tenant_*``), summed as
    :func:`render_metrics` sums the others; only the console reads it, filtered to one tenant."""
    folder = folder if folder is not None else os.environ.get(MULTIPROC_ENV)
    if not folder:
        return generate_latest(TENANT_REGISTRY)
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    registry.register(_OwnMetrics(multiprocess.MultiProcessCollector(None, path=str(folder)), TENANT_PREFIX))
    return generate_latest(registry)


class _OwnMetrics(Collector):
    """Only the ``recallserve_*`` families of a collector (``prefix``: only those; by default the
    per-tenant families are left out, see :data:`TENANT_PREFIX`).

    NOTE: every process of the Ray cluster inherits the folder, Ray's own (autoscaler monitor,
    dashboard) too, and writes its prometheus-client metrics there; those are Ray's to export
    (port 8080), not ours to repeat with a pid label.
    """

    def __init__(self, inner: Collector, prefix: str | None = None) -> None:
        self._inner = inner
        self._prefix = prefix

    def collect(self) -> Iterable[Metric]:
        if self._prefix is not None:
            return (m for m in self._inner.collect() if m.name.startswith(self._prefix))
        return (m for m in self._inner.collect()
                if m.name.startswith("recallserve_") and not m.name.startswith(TENANT_PREFIX))
