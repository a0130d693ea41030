"""Write-time enrichment as a batch job: each stored exchange gets the atomic facts the router model reads in it.

For every record of the memory tier (or of one ``--tenant``) that is a source (not a derived
write-back), of kind ``message`` or ``text``, and has no facts yet, the router model
(:class:`recallserve.serve.enrich.FactEnricher`; cpu-local: the reasoner's llama.cpp model) reads
windows of ``--window`` records of one tenant and topic (a chat session), in time order, and
writes their facts; the code resolves relative dates against each record's own time and stores
the facts as ``fact`` parts of the record they came from (their vectors embedded by the memory
tier's embedder, the record's own rows kept as they were). A search hit on a fact returns its
source record (a record is scored by its best row), and erasing or overwriting the source
removes its facts.

Like ``consolidate``, it runs on the shard folders (cluster stopped) or ``--live`` through the
running app's shard deployments, resumable (checkpoint after every page), with progress and
``--dry-run`` (the model runs, nothing is written). Every write is a compare-and-set on the
record's content version: a record a user rewrote while the model read it is left alone
(``conflicts``). Bounded: ``--max-records`` records asked per run, the enricher's own bounds
(tokens, wall time per call, facts per record, characters per fact); a failed or late call
leaves its records without facts (``failed_calls``) and they are asked again on the next run
(``--restart``).

Records are paged in id order (random), so a window holds the records of one topic within one
page, not necessarily consecutive turns; each fact is attributed by the words it shares with a
record (``serve.enrich.parse_facts``).

Run: ``recallserve job enrich [--tenant T] [--window 4] [--max-records N] [--live]`` or
``ray job submit -- python -m recallserve.deployments.jobs.enrich --live``. Measured on LoCoMo:
loadtests/results/locomo-enrich.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from recallserve.deployments.jobs._args import add_live_arguments, live_from_args, options_from_args, run_main
from recallserve.memory_shards import EmbeddedRecord
from recallserve.memory_shards.records import MemoryRecord
from recallserve.serve.enrich import EnrichConfig, Enrichment, Exchange, facts_of, with_facts
from recallserve.serve.memory import DERIVED_KEY
from recallserve.serve.pii import mask_pii

__all__ = ["add_arguments", "enrich", "enrich_batch", "run", "main"]

JOB = "enrich"

#: Record kinds whose text is an exchange worth reading for facts.
KINDS = frozenset({"message", "text"})

Enricher = Callable[[Sequence[Exchange]], Awaitable[Enrichment]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The enrichment job's own flags (and ``--live``/``--app``/``--ray-address``)."""
    add_live_arguments(p)
    p.add_argument("--tenant", default=None, help="enrich only this tenant's records (default: every tenant)")
    p.add_argument("--window", type=int, default=4, help="records of one topic read in one model call (1-8, default 4)")
    p.add_argument("--max-records", type=int, default=10_000, help="most records asked in this run (default 10000)")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads of the router model (default 2)")
    p.add_argument("--timeout", type=float, default=60.0, help="wall-time bound of one model call, s (default 60)")
    p.add_argument("--embedder", default=None,
                   help="embedding model of the stored vectors, e.g. all-MiniLM-L6-v2 (default: the profile's)")


def _eligible(rec: MemoryRecord, tenant: str | None) -> bool:
    return (rec.kind in KINDS and not rec.metadata.get(DERIVED_KEY) and not facts_of(rec)
            and (tenant is None or rec.tenant == tenant))


def windows_of(items: Sequence[EmbeddedRecord], size: int) -> list[list[EmbeddedRecord]]:
    """``items`` grouped by tenant and topic, each group in time order, cut into windows of at most ``size``."""
    groups: dict[tuple[str, str], list[EmbeddedRecord]] = defaultdict(list)
    for it in items:
        groups[(it.record.tenant, it.record.topic_path)].append(it)
    out = []
    for key in sorted(groups):
        group = sorted(groups[key], key=lambda it: (it.record.created_at, it.record.id))
        out += [group[i : i + size] for i in range(0, len(group), size)]
    return out


def _exchange(rec: MemoryRecord) -> Exchange:
    speaker = rec.metadata.get("speaker")
    # NOTE: a text that already starts with its speaker ("Caroline: ...") is shown as it is.
    named = isinstance(speaker, str) and speaker and not rec.text.startswith(speaker)
    return Exchange(rec.id, rec.text, rec.created_at, str(speaker) if named else "")


def enrich_batch(access: Any, items: Sequence[EmbeddedRecord], dry_run: bool, *, enricher: Enricher,
                 embed: Callable[[list[str]], np.ndarray], run: Callable[[Awaitable[Enrichment]], Enrichment],
                 window: int, tenant: str | None, budget: list[int]) -> dict[str, int]:
    """Enrich one page of records and write them back (compare-and-set) unless ``dry_run``.

    Args:
        access: the shard (:class:`~recallserve.memory_shards.shard_access.ShardAccess`).
        items: the page, with the stored vectors.
        enricher: ``await enricher(window) -> Enrichment``.
        embed: the memory tier's embedder (texts -> vectors) for the facts.
        run: runs one enricher call to completion (the job's event loop).
        window: records per call.
        tenant: only this tenant's records, or every tenant's.
        budget: ``[records still to ask]``, shared across pages (the ``--max-records`` bound).
    """
    from recallserve.memory_shards.shard import record_version

    counts = {"asked": 0, "enriched": 0, "facts": 0, "failed_calls": 0, "conflicts": 0}
    todo = [it for it in items if _eligible(it.record, tenant)]
    upserts: list[EmbeddedRecord] = []
    expected: dict[str, str] = {}
    for win in windows_of(todo, window):
        if budget[0] <= 0:
            break
        win = win[: budget[0]]  # NOTE: the last window is cut so a run asks at most --max-records
        budget[0] -= len(win)
        got = run(enricher([_exchange(it.record) for it in win]))
        counts["asked"] += len(win)
        counts["failed_calls"] += int(got.failed)
        for it, facts in zip(win, got.facts):
            # NOTE: the model writes new text: masked like any write-back before it is stored.
            facts = [mask_pii(f) for f in facts]
            if not facts:
                continue
            rec = with_facts(it.record, facts)
            added = [p.text for p in rec.parts[len(it.record.parts):]]
            if not added:
                continue
            vectors = np.concatenate([np.asarray(it.vectors, dtype=np.float32),
                                      np.asarray(embed(added), dtype=np.float32)])
            upserts.append(EmbeddedRecord(rec, vectors))
            expected[rec.id] = record_version(it.record)
            counts["facts"] += len(added)
    if upserts and not dry_run:
        done = access.apply({}, upserts, expected)
        counts["conflicts"] += len(done["conflicts"])
        counts["enriched"] += len(done["upserted"])
    elif upserts:
        counts["enriched"] += len(upserts)
    return counts


def enrich(opts: Any, *, tenant: str | None = None, window: int = 4, max_records: int = 10_000, threads: int = 2,
           timeout_s: float = 60.0, embedder: str | None = None, live: Any = None,
           enricher: Enricher | None = None, embed: Callable[[list[str]], np.ndarray] | None = None) -> Any:
    """Enrich every eligible record of every shard; returns a :class:`JobReport`.

    Args:
        opts: :class:`recallserve.deployments.jobs.JobOptions`.
        enricher, embed: the model call and the embedder; None builds the router model (llama.cpp,
            ``threads``) and the memory tier's embedder (``embedder``, default ``opts.model_id``).

    Raises:
        ValueError: a bound out of range (names the option), an embedder of another model than the stored vectors'.
    """
    from recallserve.deployments.jobs._common import run_access_job

    if not 1 <= window <= 8:
        raise ValueError(f"window: must be in 1..8, got {window}")
    if max_records < 1:
        raise ValueError(f"max_records: must be >= 1, got {max_records}")
    cfg = EnrichConfig(window=window, timeout_s=timeout_s)
    loop = asyncio.new_event_loop()
    engine = None
    try:
        if enricher is None:
            from recallserve.deployments.engines import LlamaCppConfig, build_engine
            from recallserve.deployments.models import DEFAULT_MODEL
            from recallserve.serve.enrich import FactEnricher

            # NOTE: cpu-local's router is the reasoner's model (router: shared_with: reasoner), the default model.
            engine = build_engine(LlamaCppConfig(model=DEFAULT_MODEL, n_ctx=2048, n_threads=threads))
            enricher = FactEnricher(engine, cfg)
        if embed is None:
            from recallserve.memory_shards.embedders import build_embedder

            emb = build_embedder(embedder or opts.model_id)
            if emb.model_id != opts.model_id:
                raise ValueError(f"embedder: {emb.model_id} is not the stored vectors' model {opts.model_id}")
            embed = emb.embed
        budget = [max_records]
        params = {"tenant": tenant, "window": window, "max_records": max_records}

        def make(p: dict[str, Any]):  # type: ignore[no-untyped-def]
            def batch(access: Any, items: Sequence[EmbeddedRecord], dry_run: bool) -> dict[str, int]:
                return enrich_batch(access, items, dry_run, enricher=enricher, embed=embed, run=loop.run_until_complete,
                                    window=p["window"], tenant=p["tenant"], budget=budget)
            return batch

        return run_access_job(JOB, opts, params, make, live=live)
    finally:
        if engine is not None:
            loop.run_until_complete(engine.close())
        loop.close()


def run(args: argparse.Namespace) -> Any:
    """Entry used by both ``recallserve job enrich`` and ``python -m``."""
    return enrich(options_from_args(args), tenant=args.tenant, window=args.window, max_records=args.max_records,
                  threads=args.threads, timeout_s=args.timeout, embedder=args.embedder, live=live_from_args(args))


def main(argv: list[str] | None = None) -> int:
    return run_main(JOB, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
