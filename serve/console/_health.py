"""The Health page's figures, read from the Prometheus metrics (:func:`serve.api.metrics.render_metrics`).

Figures (totals since the processes started; the page turns two readings into a rate):

* ``requests``: HTTP requests answered, by status class; ``error_rate = 5xx / all``;
* ``latency_p50_s`` / ``latency_p95_s``: the upper bound of the histogram bucket where the
  cumulative count first reaches 50 % / 95 % of all requests (``/metrics`` scrapes left out);
* ``cache_hit_rate = hits / lookups`` of the active experience cache;
* ``verification_pass_rate = passed / executed`` verification items of E-CoT records;
* ``memory_records``: records on every shard (all tenants and the shared collection, as
  ``/metrics`` is the operator's, not a tenant's), when the memory tier answers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from pydantic import Field

from kernels import StrictModel

__all__ = ["HealthFigures", "health_figures"]

_SKIP_ROUTES = {"/metrics", "/v1/console/health"}


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
    memory_records: int | None = Field(default=None, description="Memory records on every shard (None: unknown).")
    memory_error: str = Field(default="", description="Why the memory count is unknown ('' = it is known).")


def _quantile(buckets: dict[float, float], q: float) -> float | None:
    total = buckets.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound
    return None


def health_figures(metrics_text: str, memory_records: int | None = None, memory_error: str = "") -> HealthFigures:
    """The figures of ``metrics_text`` (Prometheus text format)."""
    by_class: dict[str, float] = defaultdict(float)
    buckets: dict[float, float] = defaultdict(float)
    lookups: dict[str, float] = defaultdict(float)
    items: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(metrics_text):
        samples: Iterable = family.samples
        for s in samples:
            labels = s.labels
            if s.name == "recallserve_http_requests_total" and labels.get("route") not in _SKIP_ROUTES:
                by_class[labels.get("status", "?")[:1] + "xx"] += s.value
            elif s.name == "recallserve_http_request_seconds_bucket" and labels.get("route") not in _SKIP_ROUTES:
                buckets[float(labels["le"])] += s.value
            elif s.name == "recallserve_experience_cache_lookups_total":
                lookups[labels.get("result", "?")] += s.value
            elif s.name == "recallserve_experience_verification_items_total":
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
