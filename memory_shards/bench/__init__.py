"""The memory tier's benchmarks, in process (no Ray, no HTTP): each returns JSON-ready rows.

One module per ``recallserve bench`` subcommand, whose front end (arguments, table, files) is in
``recallserve.deployments.cli``:

* :func:`run_memory_bench` (``bench memory``): retrieve-then-filter baselines vs the fused scan;
* :func:`run_gather_bench` (``bench gather``): one shard under concurrent searches, alone vs gathered;
* :func:`run_restart_bench` (``bench restart``): a shard's restart with and without a snapshot;
* :func:`run_scan_layout_bench` (``bench scan-layout``): row-major vs column-major vectors;
* :func:`run_search_cost` (``bench search-cost``): CPU ms of each piece of one search.

:func:`bulk_rows`, :func:`ticket_text` and :func:`query_text` make the tenant of support tickets
that ``bench search`` writes through the API, so every search benchmark measures the same data.
"""

from recallserve.kernels import lazy_exports

__all__ = ["WORDS", "bulk_rows", "query_text", "run_gather_bench", "run_memory_bench", "run_restart_bench",
           "run_scan_layout_bench", "run_search_cost", "ticket_text"]

# NOTE: names load on first use: ``bench memory`` on a GPU machine must not import the embedders
# (sentence-transformers) that ``bench search-cost`` needs, nor ``--help`` import torch.
_LAZY = {
    "WORDS": "recallserve.memory_shards.bench._rows",
    "bulk_rows": "recallserve.memory_shards.bench._rows",
    "query_text": "recallserve.memory_shards.bench._rows",
    "ticket_text": "recallserve.memory_shards.bench._rows",
    "run_gather_bench": "recallserve.memory_shards.bench.gather",
    "run_memory_bench": "recallserve.memory_shards.bench.memory",
    "run_restart_bench": "recallserve.memory_shards.bench.restart",
    "run_scan_layout_bench": "recallserve.memory_shards.bench.scan_layout",
    "run_search_cost": "recallserve.memory_shards.bench.search_cost",
}

__getattr__ = lazy_exports(__name__, _LAZY)
