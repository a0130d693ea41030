"""Prometheus metrics of the HTTP ingress (default registry, one set per process)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

__all__ = ["REQUESTS", "LATENCY", "TOKENS", "TIME_TO_FIRST_TOKEN", "MEMORY_SEARCH", "MEMORY_ROUTING",
           "MEMORY_MIGRATION_WRITES", "STATE_CALL", "render_metrics", "CONTENT_TYPE_LATEST"]

REQUESTS = Counter("recallserve_http_requests_total", "HTTP requests by route and status.", ["route", "method", "status"])
# NOTE: buckets span 5 ms (a cached memory search) to 5 min (a long CPU generation).
LATENCY = Histogram(
    "recallserve_http_request_seconds", "HTTP request latency by route.", ["route", "method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
TOKENS = Counter("recallserve_tokens_total", "Tokens processed per model role.", ["role", "direction"])
TIME_TO_FIRST_TOKEN = Histogram(
    "recallserve_time_to_first_token_seconds", "Time to the first streamed token.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)

MEMORY_SEARCH = Histogram(
    "recallserve_memory_search_seconds", "Memory search latency (embed + shard fan-out + fusion), by caller.",
    ["caller"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

# NOTE: during a re-embed (memory.migration) every write goes to two generations; a write that
# reached the old one but failed on the new one is answered 5xx and left for the fill job's
# next run, so its count tells the operator when to run `reembed --live` again.
MEMORY_ROUTING = Gauge(
    "recallserve_memory_generation", "1 for each memory generation this ingress uses, by role (serving/target), "
    "reads and writes side.", ["generation", "role", "reads", "writes"],
)
MEMORY_MIGRATION_WRITES = Counter(
    "recallserve_memory_migration_writes_total", "Writes during a memory migration, by generation and outcome "
    "(ok / failed).", ["generation", "outcome"],
)

# NOTE: sessions and experiences sit behind one state deployment; a chat turn makes ~3 calls, so
# this is where a saturated or rolling state replica shows first.
STATE_CALL = Histogram(
    "recallserve_state_call_seconds", "Calls from the ingress to the state deployment, by store, method and "
    "outcome (ok / error).", ["store", "method", "outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
)


def render_metrics() -> bytes:
    """The default registry in Prometheus text format."""
    return generate_latest()
