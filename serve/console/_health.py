"""The Health page's figures of one tenant, read from the per-tenant Prometheus families
(:func:`recallserve.serve.api.metrics.render_tenant_metrics`).

Every figure is the caller's own (totals since the processes started; the page turns two readings
into a rate), so no tenant learns another's traffic, errors, latency or memory count:

* ``requests``: the tenant's HTTP requests answered, by status class; ``error_rate = 5xx / all``;
* ``latency_p50_s`` / ``latency_p95_s``: the upper bound of the histogram bucket where the
  cumulative count first reaches 50 % / 95 % of the tenant's requests (the page's polls left out);
* ``cache_hit_rate = hits / lookups`` of the tenant's active experience cache lookups;
* ``verification_pass_rate = passed / executed`` verification items of the tenant's E-CoT records;
* ``memory_records``: the tenant's own memories (not the shared collection's), when the memory
  tier answers; ``memory_error`` names only the kind of failure (no shard's message).

NOTE: these figures were the whole process's (every tenant's requests and memory records): a
tenant could watch another's traffic and count its writes by polling. The operator's totals are
``/metrics``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from pydantic import Field

from recallserve.kernels import StrictModel

__all__ = ["HealthFigures", "health_figures"]

_PREFIX = "recallserve_tenant_"


class HealthFigures(StrictModel):
    """What an operator checks first."""

    requests: int = Field(description="HTTP requests answered (all routes but the metrics reads).")
    requests_by_class: dict[str, int] = Field(description="Requests by status class (2xx, 4xx, 5xx).")
    error_rate: float | None = Field(description="5xx / all requests (None before the first request).")
    latency_p50_s: float | None = Field(description="Median latency, upper bucket bound, seconds.")
    latency_p95_s: float | None = Field(description="95th percentile latency, upper bucket bound, seconds.")
    cache_hit_rate: float | None = Field(description="Active experience cache hits / lookups.")
    cache_lookups: int = Field(description="Active experience cache lookups.")
    verification_pass_rate: float | None = Field(description="Verification items passed / executed.")
    verification_items: int = Field(description="Verification items executed.")
    memory_records: int | None = Field(default=None, description="The tenant's memory records (None: unknown).")
    memory_error: str = Field(default="", description="Why the memory count is unknown ('' = it is known).")


def _quantile(buckets: dict[float, float], q: float) -> float | None:
    total = buckets.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound
    return None


def health_figures(metrics_text: str, tenant: str, memory_records: int | None = None,
                   memory_error: str = "") -> HealthFigures:
    """The figures of ``tenant`` in ``metrics_text`` (Prometheus text of the per-tenant families).

    Example:
        >>> health_figures("", "acme").requests
        0
    """
    by_class: dict[str, float] = defaultdict(float)
    buckets: dict[float, float] = defaultdict(float)
    lookups: dict[str, float] = defaultdict(float)
    items: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(metrics_text):
        samples: Iterable = family.samples
        for s in samples:
            labels = s.labels
            if labels.get("tenant") != tenant:
                continue
            if s.name == _PREFIX + "http_requests_total":
                by_class[labels.get("status", "?")[:1] + "xx"] += s.value
            elif s.name == _PREFIX + "http_request_seconds_bucket":
                buckets[float(labels["le"])] += s.value
            elif s.name == _PREFIX + "experience_cache_lookups_total":
                lookups[labels.get("result", "?")] += s.value
            elif s.name == _PREFIX + "experience_verification_items_total":
                items[labels.get("status", "?")] += s.value
    total = sum(by_class.values())
    n_lookups, n_items = sum(lookups.values()), sum(items.values())
    return HealthFigures(
        requests=int(total), requests_by_class={k: int(v) for k, v in sorted(by_class.items())},
        error_rate=by_class.get("5xx", 0.0) / total if total else None,
        latency_p50_s=_quantile(buckets, 0.5), latency_p95_s=_quantile(buckets, 0.95),
        cache_hit_rate=lookups.get("hit", 0.0) / n_lookups if n_lookups else None, cache_lookups=int(n_lookups),
        verification_pass_rate=items.get("pass", 0.0) / n_items if n_items else None, verification_items=int(n_items),
        memory_records=memory_records, memory_error=memory_error,
    )
