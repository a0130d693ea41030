"""Prometheus metrics of the experience memory (default registry, served on ``/metrics``).

* ``recallserve_experience_cache_hit_rate``: share of active-cache lookups that returned at
  least one experience (hits / lookups since the process started);
* ``recallserve_experience_verification_pass_rate``: share of executed verification items
  whose status is ``pass`` (a ``not_run`` item, no expression code can execute, is counted apart
  under its own status label and left out of the rate: it was not executed);
* ``recallserve_experience_active_cache_freshness``: mean soft-decay factor
  ``1/(1 + 0.1 x days since last use)`` over all active records (1 = all used just now).

The counters behind the rates are exported too, so a Prometheus server can aggregate the
rates across replicas itself (``sum(rate(hits)) / sum(rate(lookups))``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client import Counter, Gauge

from recallserve.serve.api.metrics import GAUGE_MODE, TENANT_PREFIX, TENANT_REGISTRY

__all__ = ["record_lookup", "record_verification", "record_conflicts", "set_active_freshness", "snapshot"]

CACHE_LOOKUPS = Counter(
    "recallserve_experience_cache_lookups", "Active experience cache lookups by result.", ["result"]
)
CACHE_HIT_RATE = Gauge("recallserve_experience_cache_hit_rate", "Active cache hits / lookups in this process.",
                       multiprocess_mode=GAUGE_MODE)
VERIFICATION_ITEMS = Counter(
    "recallserve_experience_verification_items",
    "Verification items by status (not_run: no expression code can execute; not in the pass rate).", ["status"]
)
VERIFICATION_PASS_RATE = Gauge(
    "recallserve_experience_verification_pass_rate", "Executed verification items that passed / all executed.",
    multiprocess_mode=GAUGE_MODE,
)
ACTIVE_FRESHNESS = Gauge(
    "recallserve_experience_active_cache_freshness", "Mean soft-decay factor 1/(1+0.1*days) of active records.",
    multiprocess_mode=GAUGE_MODE,
)
CONFLICTS = Counter(
    "recallserve_experience_conflicts", "Active records superseded by a newer archival record on the same topic."
)

# NOTE: the same counts by tenant, for the console's Health page (kept off /metrics: serve.api.metrics).
TENANT_LOOKUPS = Counter(TENANT_PREFIX + "experience_cache_lookups", "Active cache lookups by tenant and result.",
                         ["tenant", "result"], registry=TENANT_REGISTRY)
TENANT_VERIFICATION_ITEMS = Counter(TENANT_PREFIX + "experience_verification_items",
                                    "Verification items by tenant and status.", ["tenant", "status"],
                                    registry=TENANT_REGISTRY)

_lock = threading.Lock()
_counts = {"lookups": 0, "hits": 0, "items": 0, "passed": 0, "not_run": 0}


def record_lookup(hit: bool, tenant: str | None = None) -> None:
    """Count one active-cache lookup (and the tenant's, when named) and refresh the hit-rate gauge."""
    CACHE_LOOKUPS.labels(result="hit" if hit else "miss").inc()
    if tenant is not None:
        TENANT_LOOKUPS.labels(tenant=tenant, result="hit" if hit else "miss").inc()
    with _lock:
        _counts["lookups"] += 1
        _counts["hits"] += int(hit)
        CACHE_HIT_RATE.set(_counts["hits"] / _counts["lookups"])


def record_verification(statuses: Iterable[str], tenant: str | None = None) -> None:
    """Count verification items by status (and the tenant's, when named) and refresh the pass-rate
    gauge (executed items only)."""
    statuses = list(statuses)
    if not statuses:
        return
    for s in statuses:
        VERIFICATION_ITEMS.labels(status=s).inc()
        if tenant is not None:
            TENANT_VERIFICATION_ITEMS.labels(tenant=tenant, status=s).inc()
    executed = [s for s in statuses if s != "not_run"]
    with _lock:
        _counts["not_run"] += len(statuses) - len(executed)
        _counts["items"] += len(executed)
        _counts["passed"] += sum(1 for s in executed if s == "pass")
        if _counts["items"]:
            VERIFICATION_PASS_RATE.set(_counts["passed"] / _counts["items"])


def record_conflicts(n: int) -> None:
    """Count conflict alerts."""
    if n:
        CONFLICTS.inc(n)


def set_active_freshness(value: float | None) -> None:
    """Set the freshness gauge (``None``: no active records, reported as 1.0)."""
    ACTIVE_FRESHNESS.set(1.0 if value is None else value)


def snapshot() -> dict[str, float]:
    """The process-local rates (for tests and the eval report)."""
    with _lock:
        c = dict(_counts)
    return {
        "cache_hit_rate": c["hits"] / c["lookups"] if c["lookups"] else 0.0,
        "verification_pass_rate": c["passed"] / c["items"] if c["items"] else 0.0,
        "lookups": float(c["lookups"]),
        "verification_items": float(c["items"]),
        "verification_not_run": float(c["not_run"]),
    }
