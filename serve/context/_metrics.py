"""Prometheus metrics of context-mode, on prometheus_client's default registry.

The ingress's ``/metrics`` exposes the default registry, so these appear there without wiring.
Creation is idempotent ("registry-safe"): if a collector of the same name is already registered
(a module reloaded in a test, two import paths of one file), the existing one is reused instead
of raising ``Duplicated timeseries``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from prometheus_client import REGISTRY, Counter, Histogram

__all__ = [
    "CONTEXT_MODE_TOTAL",
    "CONTEXT_TOKENS",
    "CONTEXT_ASSEMBLY_SECONDS",
    "CONTEXT_SUMMARY_RUNS_TOTAL",
    "CONTEXT_SUMMARY_SECONDS",
    "CONTEXT_BUDGET_REFUSALS_TOTAL",
]

_C = TypeVar("_C")

# NOTE: token buckets span a greeting (16) to a long-context model's full window (128k).
_TOKEN_BUCKETS = (0, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
# NOTE: assembly is pure CPU work plus SQLite reads: expected 1-20 ms; the tail buckets catch a
# cold embedder or a slow disk.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SUMMARY_BUCKETS = (0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def _get_or_create(name: str, factory: Callable[[], _C]) -> _C:
    existing = getattr(REGISTRY, "_names_to_collectors", {}).get(name)
    if existing is not None:
        return existing  # type: ignore[return-value]
    return factory()


def _counter(name: str, doc: str, labels: Sequence[str]) -> Counter:
    return _get_or_create(name + "_total", lambda: Counter(name, doc, labels))


def _histogram(name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Histogram:
    return _get_or_create(name + "_bucket", lambda: Histogram(name, doc, labels, buckets=buckets))


CONTEXT_MODE_TOTAL = _counter(
    "recallserve_context_mode",
    "Context assemblies by the mode used and the mode requested (auto resolves to one of the others).",
    ["mode", "requested"],
)
CONTEXT_TOKENS = _histogram(
    "recallserve_context_tokens",
    "Tokens per part of the assembled context (system, constraints, entities, summary, recent, "
    "retrieved, pending, total).",
    ["part"],
    _TOKEN_BUCKETS,
)
CONTEXT_ASSEMBLY_SECONDS = _histogram(
    "recallserve_context_assembly_seconds",
    "Wall time to assemble one request's context (session load, selection, formatting).",
    ["mode"],
    _LATENCY_BUCKETS,
)
CONTEXT_SUMMARY_RUNS_TOTAL = _counter(
    "recallserve_context_summary_runs",
    "Rolling-summary refreshes by summariser and outcome (ok, error, superseded).",
    ["summariser", "outcome"],
)
CONTEXT_SUMMARY_SECONDS = _histogram(
    "recallserve_context_summary_seconds",
    "Wall time of one rolling-summary refresh (all its batches), off the request path.",
    ["summariser"],
    _SUMMARY_BUCKETS,
)
CONTEXT_BUDGET_REFUSALS_TOTAL = _counter(
    "recallserve_context_budget_refusals",
    "Requests refused because the retention-3 messages do not fit the budget.",
    [],
)
