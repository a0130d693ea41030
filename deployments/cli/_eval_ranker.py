"""``recallserve eval ranker FILE``: train the learned ranker with leave-one-conversation-out, report, write it.

The training script of ``memory_shards/retrieval/ranker_model.json``. Every conversation of FILE is indexed
as ``recallserve eval locomo`` does (in-process hybrid shards, the real embedder, the memory service's
write path). For each question, the service's search with the ranker off returns the fused first
``--depth`` hits; their features (``HybridRetriever.features``, the function the search path uses) and
labels (hit is evidence) are the rows. Then, per held-out conversation, a model is fitted on the other
conversations' rows only, and the held-out questions are asked again through the service's search with
that model re-ranking (``rerank_depth`` = ``--depth``): recall@k with and without the ranker, per fold,
with the spread. ``--out`` writes the model fitted on every conversation (the file that ships).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import time
from typing import Any

from recallserve.deployments.cli import UserError

NAME = "ranker"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``eval ranker``."""
    p = subparsers.add_parser(NAME, help="train the learned ranker (leave-one-conversation-out on a LoCoMo file)")
    p.add_argument("file", help="LoCoMo-format JSON (e.g. ../shared/eval/locomo_dev.json)")
    p.add_argument("--depth", type=int, default=64, help="fused candidates re-ranked (default: 64)")
    p.add_argument("--k", default="1,5,10,20", help="comma-separated cut-offs (default: 1,5,10,20)")
    p.add_argument("--shards", type=int, default=2, help="in-process shards (default: 2, as cpu-local)")
    p.add_argument("--out", default=None, help="write the model fitted on every conversation here (JSON)")
    p.add_argument("--rows", default=None,
                   help="also save the training rows here (.npz: x, y, question, conversation, evidence count, category)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train, report (JSON on stdout), optionally write the model."""
    from recallserve.deployments.cli._eval_locomo import _parse_ks
    from recallserve.memory_shards.retrieval.locomo import load_locomo

    ks = _parse_ks(args.k)
    if not 1 <= args.depth <= 256:
        raise UserError(f"--depth: must be in 1..256, got {args.depth}")
    if not 1 <= args.shards <= 64:
        raise UserError(f"--shards: must be in 1..64, got {args.shards}")
    try:
        conversations = load_locomo(args.file)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if len(conversations) < 2:
        raise UserError(f"{args.file}: leave-one-conversation-out needs at least 2 conversations, got {len(conversations)}")
    doc = asyncio.run(_train(args, conversations, ks))
    print(json.dumps(doc, indent=2))
    return 0


def _spread(vals: list[float]) -> dict[str, float]:
    return {"mean": round(sum(vals) / len(vals), 4), "min": round(min(vals), 4), "max": round(max(vals), 4)}


async def _train(args: argparse.Namespace, conversations: list[Any], ks: list[int]) -> dict[str, Any]:
    import numpy as np

    from recallserve.deployments.cli._eval_locomo import _asked_at
    from recallserve.memory_shards.embedders import build_embedder
    from recallserve.memory_shards.retrieval import RetrievalParams, local_hybrid_coordinator
    from recallserve.memory_shards.retrieval.locomo import CATEGORIES, evaluate_locomo, turn_records
    from recallserve.memory_shards.retrieval.ranker import FEATURES
    from recallserve.memory_shards.retrieval.ranker_train import fit_ranker
    from recallserve.serve import envs
    from recallserve.serve.memory_api import MemoryService, SearchRequest

    emb = build_embedder("all-MiniLM-L6-v2", runtime="auto", cache_dir=envs.recallserve_home() / "onnx")
    coord = local_hybrid_coordinator(args.shards, emb.model_id, emb.dim, data_root=None, fsync=False)
    cache: dict[str, np.ndarray] = {}

    async def embed(texts: list[str]):
        if len(texts) == 1 and texts[0] in cache:
            return cache[texts[0]][None, :]
        return await asyncio.to_thread(emb.embed, texts)

    k_max = max(max(ks), args.depth)
    base = RetrievalParams()
    # NOTE: as `eval locomo`: the eval ranks every turn (no lexical floor), lists at least k_max deep.
    off = base.model_copy(update={"lexical_min_ratio": 0.0, "dense_candidates": max(base.dense_candidates, k_max),
                                  "lexical_candidates": max(base.lexical_candidates, k_max), "rerank_depth": 0})
    on = off.model_copy(update={"rerank_depth": args.depth})
    service = MemoryService(coord, embed, top_k=min(k_max, 200), threshold=-1.0, retrieval=off)
    asked_at = _asked_at(conversations)
    started = time.perf_counter()
    for conv in conversations:
        recs = turn_records(conv, conv.sample_id)
        for start in range(0, len(recs), 256):
            await service.add_records(recs[start : start + 256])
        questions = sorted({q.question for q in conv.questions} - set(cache))
        for start in range(0, len(questions), 256):
            cache.update(zip(questions[start : start + 256], await asyncio.to_thread(emb.embed, questions[start : start + 256])))

    def request(question: str, k: int) -> SearchRequest:
        return SearchRequest(query=question, k=k, threshold=-1.0, decay={"decay": "none"})

    # Rows: the fused first --depth hits of every question, ranker off.
    rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    feature_s: list[float] = []
    meta: list[tuple[int, str, int, int]] = []
    asked = 0
    for conv in conversations:
        xs, ys = [], []
        for q in conv.questions:
            if q.category not in CATEGORIES or not q.evidence:
                continue
            hits = await service.search_request(conv.sample_id, request(q.question, args.depth), now=asked_at[conv.sample_id])
            t0 = time.perf_counter()
            x = service.retriever.features(q.question, hits, off, asked_at[conv.sample_id])
            feature_s.append(time.perf_counter() - t0)
            xs.append(x)
            ys.append(np.array([h.record.source_id in q.evidence for h in hits], dtype=np.int8))
            meta += [(asked + len(ys), conv.sample_id, len(q.evidence), q.category)] * len(hits)
        rows[conv.sample_id] = (np.concatenate(xs), np.concatenate(ys))
        asked += len(ys)

    latencies: dict[str, list[float]] = {"off": [], "on": []}
    mode = "off"

    async def search(tenant: str, question: str, k: int) -> list[str]:
        service.retriever.params = on if mode == "on" else off
        t0 = time.perf_counter()
        hits = await service.search_request(tenant, request(question, k), now=asked_at[tenant])
        latencies[mode].append(time.perf_counter() - t0)
        return [h.record.source_id for h in hits]

    async def no_write(records: list[Any]) -> None:
        return None

    folds = []
    paired: dict[str, list[float]] = {"off": [], "on": []}
    for conv in conversations:
        others = [c.sample_id for c in conversations if c.sample_id != conv.sample_id]
        x = np.concatenate([rows[c][0] for c in others])
        y = np.concatenate([rows[c][1] for c in others])
        service.retriever.ranker = fit_ranker(x, y, {"conversations": others})
        fold: dict[str, Any] = {"held_out": conv.sample_id, "trained_on": others, "coef": service.retriever.ranker.coef}
        # NOTE: off and on alternate per conversation, so host load drifts hit both alike.
        for mode in ("off", "on"):
            fold[mode] = await evaluate_locomo([conv], no_write, search, ks)
        folds.append(fold)
        # The added cost, paired: each question asked off then on, back to back (host load hits both alike).
        for q in conv.questions:
            if q.category in CATEGORIES and q.evidence:
                for m in ("off", "on"):
                    service.retriever.params = on if m == "on" else off
                    t0 = time.perf_counter()
                    await service.search_request(conv.sample_id, request(q.question, 10), now=asked_at[conv.sample_id])
                    paired[m].append(time.perf_counter() - t0)
    service.retriever.ranker = None
    metric = "recall@10" if 10 in ks else f"recall@{ks[-1]}"
    cats = ["overall", *CATEGORIES.values()]
    held_out = {mode: {c: {f"recall@{k}": _spread([f[mode][c][f"recall@{k}"] for f in folds if c in f[mode]])
                           for k in ks} for c in cats if any(c in f[mode] for f in folds)} for mode in ("off", "on")}
    doc: dict[str, Any] = {
        "command": shlex.join(["recallserve", *args.argv]), "file": args.file,
        "conversations": [c.sample_id for c in conversations], "depth": args.depth, "k": ks, "metric": metric,
        "embedder": emb.model_id, "candidate_rows": {c: int(len(r[1])) for c, r in rows.items()},
        "evidence_in_candidates": {c: int(r[1].sum()) for c, r in rows.items()},
        "folds": folds, "held_out": held_out,
        # NOTE: in process, query embedding excluded (cached); "features" is the ranker's own step per query.
        # paired_k10: each question searched with k = 10 off then on, back to back; "added" = on - off per question.
        "search_ms": {m: {"p50": round(float(np.percentile(v, 50)) * 1000, 2), "p95": round(float(np.percentile(v, 95)) * 1000, 2)}
                      for m, v in latencies.items()},
        "search_ms_paired_k10": {
            **{m: {"p50": round(float(np.percentile(v, 50)) * 1000, 2), "p95": round(float(np.percentile(v, 95)) * 1000, 2)}
               for m, v in paired.items()},
            "added": {"p50": round(float(np.percentile(np.subtract(paired["on"], paired["off"]), 50)) * 1000, 2),
                      "p95": round(float(np.percentile(np.subtract(paired["on"], paired["off"]), 95)) * 1000, 2)}},
        "features_ms": {"p50": round(float(np.percentile(feature_s, 50)) * 1000, 2),
                        "p95": round(float(np.percentile(feature_s, 95)) * 1000, 2)},
        "seconds": round(time.perf_counter() - started, 1),
    }
    if args.rows:
        np.savez(args.rows, x=np.concatenate([r[0] for r in rows.values()]), y=np.concatenate([r[1] for r in rows.values()]),
                 question=np.array([m[0] for m in meta]), conversation=np.array([m[1] for m in meta]),
                 evidence=np.array([m[2] for m in meta]), category=np.array([m[3] for m in meta]), features=np.array(FEATURES))
        doc["rows_saved"] = args.rows
    if args.out:
        x = np.concatenate([r[0] for r in rows.values()])
        y = np.concatenate([r[1] for r in rows.values()])
        model = fit_ranker(x, y, {"command": doc["command"], "conversations": doc["conversations"], "depth": args.depth,
                                  "rows": int(len(y)), "embedder": emb.model_id})
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(model.model_dump_json(indent=1) + "\n")
        doc["written"] = args.out
    return doc
