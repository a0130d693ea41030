"""CPU cost of the pieces of one memory search, in process: what a search through the cluster must at least pay.

On shared cores wall times follow the neighbours, so every figure here is the calling thread's
CPU time (``time.thread_time``) per operation:

* ``embed_1``: MiniLM embedding of one 4-word query (what each idle search pays the embedder);
* ``embed_16``: per query, when 16 queries share one forward pass (what batching buys);
* ``hybrid_<N>``: one shard's ``hybrid_search`` (dense top-64 + BM25 top-64) over ``N`` rows of
  the tenant, and ``dense_<N>`` without the lexical list;
* ``pickle_kib_<N>`` / ``pickle_ms_<N>``: the size of that answer and the CPU to pickle and
  unpickle it (what a hop between processes adds for the payload itself).

Rows are built as the offline seed of ``bench search`` builds them (:func:`._rows.bulk_rows`:
MiniLM vectors of ``distinct`` bench texts plus noise), in memory.
"""

from __future__ import annotations

import pickle
import random
import time
from collections.abc import Callable

import numpy as np
import torch

from recallserve.kernels import ScoreParams

from ..config import ShardConfig
from ..embedders import build_embedder
from ..retrieval import HybridShard
from ..shard import MemoryShard
from ._rows import bulk_rows, query_text, ticket_text

__all__ = ["run_search_cost"]


def _cpu_ms(fn: Callable[[], object], repeats: int) -> float:
    start = time.thread_time()
    for _ in range(repeats):
        fn()
    return 1e3 * (time.thread_time() - start) / repeats


def run_search_cost(sizes: list[int], distinct: int = 200, repeats: int = 20) -> dict[str, float | int]:
    """CPU ms per operation (see the module docstring), one key per figure and size.

    Raises:
        ValueError: a size outside [1000, 1000000], ``distinct`` outside [50, 5000] or ``repeats`` outside [1, 1000].
    """
    if not sizes or not all(1000 <= n <= 1_000_000 for n in sizes):
        raise ValueError(f"rows: sizes within [1000, 1000000], got {sizes}")
    if not 50 <= distinct <= 5000 or not 1 <= repeats <= 1000:
        raise ValueError(f"distinct: within [50, 5000] and repeats within [1, 1000], got {distinct} and {repeats}")
    torch.set_num_threads(1)
    emb = build_embedder("all-MiniLM-L6-v2", device="cpu", batch_size=16, torch_threads=1)
    rng = random.Random(0)
    queries = [query_text(rng) for _ in range(max(16, repeats))]
    emb.embed(queries[:16])
    out: dict[str, float | int] = {
        "embed_1": _cpu_ms(lambda: emb.embed(queries[:1]), repeats),
        "embed_16": _cpu_ms(lambda: emb.embed(queries[:16]), max(1, repeats // 4)) / 16,
    }
    # NOTE: the words between "Ticket T-<n>: " and the final "." of the bench's own texts.
    words = [ticket_text(rng, i).split(": ", 1)[1][:-1] for i in range(distinct)]
    base = np.asarray(emb.embed(words), dtype=np.float32)
    qv = np.asarray(emb.embed(queries), dtype=np.float32)
    params = ScoreParams(threshold=0.35)
    for n in sizes:
        shard = HybridShard(MemoryShard(ShardConfig(shard_id=0, model_id=emb.model_id, dim=emb.dim)))
        for lo in range(0, n, 10_000):
            shard.upsert(bulk_rows(min(n, lo + 10_000), distinct, base, words, "local", "profile", 0.2, 0, lo))
        calls = iter(range(10**9))

        def search(lexical: int) -> object:
            i = next(calls) % len(queries)
            return shard.hybrid_search(qv[i], queries[i], "local", 64, lexical, params, None, time.time())

        search(64)
        out[f"hybrid_{n}"] = _cpu_ms(lambda: search(64), repeats)
        out[f"dense_{n}"] = _cpu_ms(lambda: search(0), repeats)
        answer = search(64)
        # NOTE: Ray serialises a shard's answer (plain dataclasses and numpy arrays of importable
        # classes) with cloudpickle, which writes what pickle protocol 5 writes for them.
        blob = pickle.dumps(answer, protocol=5)
        out[f"pickle_kib_{n}"] = round(len(blob) / 1024, 1)
        out[f"pickle_ms_{n}"] = _cpu_ms(lambda: pickle.loads(pickle.dumps(answer, protocol=5)), repeats)
        shard.close()
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}
