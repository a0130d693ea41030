"""``recallserve eval locomo FILE``: LoCoMo evidence recall@k through the memory service.

Every turn of every conversation is written as one memory (tenant = the conversation id,
source id = its dia_id, created at its session's time) through :class:`MemoryService` over an
in-process coordinator of hybrid shards and the real MiniLM embedder, the code the memory API
runs. Each question of categories 1-4 is then searched (hybrid, no time decay, no threshold: the
eval ranks, it does not filter) and recall@k of its evidence ids is averaged per category.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from typing import Any

from recallserve.deployments.cli import UserError

NAME = "locomo"
_DEFAULT_K = "1,5,10,20,50"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``eval locomo``."""
    from recallserve.memory_shards.embedders import EMBEDDER_MODELS

    p = subparsers.add_parser(NAME, help="LoCoMo evidence recall@k of the hybrid memory retrieval")
    p.add_argument("file", help="LoCoMo-format JSON (e.g. ../shared/eval/locomo_dev.json)")
    p.add_argument("--k", default=_DEFAULT_K, help=f"comma-separated cut-offs (default: {_DEFAULT_K})")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("--shards", type=int, default=2, help="in-process shards (default: 2, as cpu-local)")
    p.add_argument("--embedder", choices=list(EMBEDDER_MODELS), default="all-MiniLM-L6-v2",
                   help="embedding model (default: the fp32 MiniLM every profile uses)")
    p.add_argument("--runtime", choices=["auto", "torch", "onnx"], default="auto",
                   help="embedder runtime (default: auto = ONNX Runtime on the CPU, as the cpu-local embedder; fp32 "
                        "gives the same vectors on both)")
    p.add_argument("--mode", choices=["hybrid", "dense", "lexical", "keyword-rerank"], default="hybrid",
                   help="hybrid (default), dense only (fused kernel), lexical only (BM25), or keyword-rerank "
                        "(design source 002's hybrid: BM25's first 20, re-ordered by cosine; cut-offs up to 20)")
    p.add_argument("--context", type=int, default=2,
                   help="neighbouring turns each side stored as a context part of each memory (default: 2; 0 = none)")
    p.add_argument("--only", default=None,
                   help="comma-separated indexes of the conversations to evaluate (default: all), e.g. to time one first")
    p.add_argument("--write-filter", choices=["all", "facts"], default="all",
                   help="store only the turns the chat write filter keeps (serve.write_filter, each turn read as a "
                        "user message; 'all' = every turn, the default): its effect on stored count and recall")
    p.add_argument("--fusion", default=None,
                   help="comma-separated RRF settings C/W_DENSE/W_LEX to compare on the same index (e.g. 20/1/1.5,60/1/1); "
                        "with several, each conversation is scored per setting and leave-one-conversation-out picks, "
                        "for each held-out conversation, the setting best on the others (default: the configured one)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=V1,V2",
                   help="a retrieval knob (a field of RetrievalParams, e.g. date_weight=0,1) to compare: every value is "
                        "crossed with every --fusion setting and leave-one-conversation-out picks among them (repeatable)")
    p.add_argument("--decompose", action="store_true",
                   help="search each question with the router model's sub-queries besides it (cpu-local's llama.cpp model "
                        "writes at most 3; their lists are fused with the question's; deployments/cli/_decompose.py): the "
                        "measurement of query decomposition, which the product does not ship (no gain by leave-one-out)")
    p.add_argument("--decompose-weights", default="0,1", metavar="W1,W2",
                   help="with --decompose, RRF weights of the sub-queries' lists, crossed with the other settings and "
                        "picked leave-one-conversation-out (default: 0,1; 0 = the same run without them)")
    p.add_argument("--decompose-cache", default=None, metavar="FILE",
                   help="JSON file of decompositions read first and filled on a miss, so repeated runs do not re-run the "
                        "model (default: ~/.cache/recallserve/locomo-decompose.json; "
                        "python -m loadtests.locomo_decompose_cost fills it ahead)")
    p.add_argument("--decompose-categories", default="1,2,3,4", metavar="C1,C2",
                   help="with --decompose, the LoCoMo categories whose questions are decomposed (default: all four; "
                        "1 = multi-hop only, the others searched as without it)")
    p.add_argument("--decompose-threads", type=int, default=2, help="llama.cpp threads of the router model (default: 2)")
    p.add_argument("--enrich", action="store_true",
                   help="compare each conversation with and without write-time facts (the router model's atomic facts of "
                        "each turn, stored as parts of it; serve/enrich.py), picked leave-one-conversation-out: only the "
                        "sessions the enrichment cache covers wholly are stored and only the questions whose evidence lies "
                        "in them are asked (both arms alike); no model runs (python -m loadtests.locomo_enrich_cost fills the cache)")
    p.add_argument("--enrich-cache", default=None, metavar="FILE",
                   help="with --enrich, the JSON file of enriched windows (default: ~/.cache/recallserve/locomo-enrich.json)")
    p.add_argument("--enrich-window", type=int, default=4, help="with --enrich, exchanges per model call the cache was "
                                                                  "filled with (default: 4)")
    p.add_argument("--durable", action="store_true",
                   help="write the shards to a temporary folder with WAL fsync (default: in memory; same ranking)")
    p.set_defaults(func=run)


#: Design source 002's hybrid search: keyword recall of about 20, then a vector re-rank.
KEYWORD_RECALL = 20


def _parse_ks(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UserError(f"--k: expected comma-separated integers, got {text!r}") from None
    if not ks or ks[0] < 1 or ks[-1] > 200:
        raise UserError(f"--k: cut-offs must be in 1..200, got {text!r}")
    return ks


def _parse_fusion(text: str | None) -> list[tuple[float, float, float]] | None:
    if not text:
        return None
    out = []
    for item in text.split(","):
        try:
            c, wd, wl = (float(x) for x in item.split("/"))
        except ValueError:
            raise UserError(f"--fusion: {item!r} is not C/W_DENSE/W_LEX (e.g. 20/1/1.5)") from None
        if c < 0 or wd < 0 or wl < 0 or wd + wl == 0:
            raise UserError(f"--fusion: {item!r} needs C >= 0 and non-negative weights, not both 0")
        out.append((c, wd, wl))
    return out


def _parse_sets(items: list[str]) -> list[tuple[str, list[float]]]:
    """``["date_weight=0,1", ...]`` -> ``[("date_weight", [0.0, 1.0]), ...]``, each key a RetrievalParams field."""
    from recallserve.memory_shards.retrieval import RetrievalParams

    out = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or key not in RetrievalParams.model_fields:
            raise UserError(f"--set: {item!r} is not KEY=V1,V2 with KEY a retrieval knob "
                            f"({', '.join(sorted(RetrievalParams.model_fields))})")
        try:
            vals = [float(v) for v in values.split(",") if v.strip()]
            for v in vals:
                RetrievalParams.model_validate({key: int(v) if v.is_integer() else v})
        except ValueError as exc:
            raise UserError(f"--set: {item!r}: {str(exc).splitlines()[0]} ({exc})") from None
        if not vals:
            raise UserError(f"--set: {item!r} has no values")
        out.append((key, vals))
    return out


def _settings(fusion: list[tuple[float, float, float]] | None,
              sets: list[tuple[str, list[float]]]) -> list[tuple[str, dict[str, float]]]:
    """Named RetrievalParams updates: every fusion setting crossed with every --set value."""
    import itertools

    from recallserve.memory_shards.retrieval import RetrievalParams

    base = RetrievalParams()
    fusion = fusion or [(base.rrf_k, base.dense_weight, base.lexical_weight)]
    out = []
    for (c, wd, wl), combo in itertools.product(fusion, itertools.product(*[[(k, v) for v in vals] for k, vals in sets])):
        update = {"rrf_k": c, "dense_weight": wd, "lexical_weight": wl,
                  **{k: int(v) if v.is_integer() and isinstance(RetrievalParams.model_fields[k].default, int) else v
                     for k, v in combo}}
        name = ",".join([f"c={c:g},dense={wd:g},lexical={wl:g}", *(f"{k}={v:g}" for k, v in combo)])
        out.append((name, update))
    return out


def _with_decompose_weights(settings: list[tuple[str, dict[str, float]]], text: str) -> list[tuple[str, dict[str, float]]]:
    """``settings`` crossed with the sub-queries' weights (``--decompose-weights``), each under the key ``sub_query_weight``."""
    try:
        weights = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--decompose-weights: expected comma-separated weights, got {text!r}") from None
    if not weights or any(not 0 <= w <= 100 for w in weights):
        raise UserError(f"--decompose-weights: weights must be in 0..100, got {text!r}")
    return [(f"{name},sub_query_weight={w:g}", {**update, SUB_QUERY_WEIGHT: w}) for name, update in settings for w in weights]


SUB_QUERY_WEIGHT = "sub_query_weight"
"""NOTE: the key of a setting's sub-query weight: an argument of the search, not a RetrievalParams field."""

ENRICHED_TENANT = "~facts"
"""NOTE: the suffix of the tenant holding a conversation's enriched records (the eval's own tenants)."""

ENRICH = "enrich"
"""NOTE: the key of a setting's index: 1 = the records with their facts (another tenant), not a RetrievalParams field."""


def _with_enrich(settings: list[tuple[str, dict[str, float]]]) -> list[tuple[str, dict[str, float]]]:
    """``settings`` crossed with enrichment off / on (``--enrich``)."""
    return [(f"{name},enrich={e}", {**update, ENRICH: float(e)}) for name, update in settings for e in (0, 1)]


def _enriched(args: argparse.Namespace, conversations: list[Any]) -> tuple[list[Any], dict[str, dict[str, list[str]]], dict[str, Any]]:
    """With ``--enrich``: the conversations cut to their wholly enriched sessions and the questions
    whose evidence lies there, each turn's facts (sample id -> dia_id -> facts), and the coverage."""
    if not args.enrich:
        return conversations, {}, {}
    from recallserve.deployments.cli._enrich_locomo import cached_facts, covered_questions
    from recallserve.deployments.models import DEFAULT_MODEL
    from recallserve.serve import envs
    from recallserve.serve.enrich import EnrichConfig, EnrichmentCache

    if args.write_filter != "all":
        raise UserError("--enrich: needs --write-filter all (the enrichment cache's windows are of every turn)")
    if not 1 <= args.enrich_window <= 8:
        raise UserError(f"--enrich-window: must be in 1..8, got {args.enrich_window}")
    path = args.enrich_cache or str(envs.recallserve_home() / "locomo-enrich.json")
    try:
        cache = EnrichmentCache(path)
    except ValueError as exc:
        raise UserError(f"--enrich-cache: {exc}") from None
    cfg = EnrichConfig(window=args.enrich_window)
    out, facts, coverage = [], {}, {}
    for conv in conversations:
        got, sessions = cached_facts(cache, DEFAULT_MODEL, conv, cfg)
        asked = covered_questions(conv.questions, sessions)
        facts[conv.sample_id] = got
        coverage[conv.sample_id] = {"sessions": sorted(sessions), "turns": sum(1 for t in conv.turns if t.session in sessions),
                                    "turns_with_facts": sum(1 for t in conv.turns if t.session in sessions and got.get(t.dia_id)),
                                    "facts": sum(len(got.get(t.dia_id, [])) for t in conv.turns if t.session in sessions),
                                    "questions": sum(1 for q in asked if q.category in (1, 2, 3, 4))}
        if sessions and coverage[conv.sample_id]["questions"]:
            out.append(conv.model_copy(update={"turns": [t for t in conv.turns if t.session in sessions], "questions": asked}))
    if not out:
        raise UserError(f"--enrich: the cache {path} covers no whole session holding a question's evidence")
    return out, facts, {"cache": path, "model": DEFAULT_MODEL, "window": cfg.window, "per_conversation": coverage}


def leave_one_out(per_conv: dict[str, dict[str, dict[str, dict[str, float]]]], metric: str = "recall@10") -> dict[str, Any]:
    """Leave-one-conversation-out selection among fusion settings.

    For each held-out conversation ``h``, the setting with the best mean ``overall`` ``metric``
    over the other conversations is chosen, and its figures on ``h`` are reported; nothing is
    chosen on the conversation it is reported on. Returns the folds, the mean of the held-out
    figures (overall and per category, macro over folds) and their spread (min, max).
    """
    convs = sorted(per_conv)
    settings = sorted(next(iter(per_conv.values())))
    folds = []
    for held in convs:
        others = [c for c in convs if c != held]
        best = max(settings, key=lambda s: (sum(per_conv[c][s]["overall"][metric] for c in others) / len(others), s))
        folds.append({"held_out": held, "chosen": best, "results": per_conv[held][best]})
    cats = sorted({name for f in folds for name in f["results"]})

    def spread(name: str, m: str) -> dict[str, float]:
        vals = [f["results"][name][m] for f in folds if name in f["results"]]
        return {"mean": round(sum(vals) / len(vals), 4), "min": round(min(vals), 4), "max": round(max(vals), 4)}

    summary = {}
    for name in cats:
        metrics = sorted({m for f in folds for m in f["results"].get(name, {}) if m.startswith("recall@")},
                         key=lambda m: int(m.split("@")[1]))
        # NOTE: the chosen setting's other cut-offs too (chosen by ``metric``, reported at every k).
        summary[name] = {**spread(name, metric), **{m: spread(name, m) for m in metrics}}
    return {"metric": metric, "folds": folds, "held_out": summary}


def run(args: argparse.Namespace) -> int:
    """Run the evaluation; print a table or JSON."""
    ks = _parse_ks(args.k)
    fusion = _parse_fusion(args.fusion)
    sets = _parse_sets(args.sets)
    if not 1 <= args.shards <= 64:
        raise UserError(f"--shards: must be in 1..64, got {args.shards}")
    if not 0 <= args.context <= 8:
        raise UserError(f"--context: must be in 0..8, got {args.context}")
    from recallserve.memory_shards.retrieval.locomo import load_locomo

    try:
        conversations = load_locomo(args.file)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if not conversations:
        raise UserError(f"{args.file}: no conversations")
    if args.only:
        try:
            picked = sorted({int(x) for x in args.only.split(",") if x.strip()})
        except ValueError:
            raise UserError(f"--only: expected comma-separated indexes, got {args.only!r}") from None
        if not picked or picked[0] < 0 or picked[-1] >= len(conversations):
            raise UserError(f"--only: indexes must be in 0..{len(conversations) - 1}, got {args.only!r}")
        conversations = [conversations[i] for i in picked]
    settings = _settings(fusion, sets)
    if args.decompose:
        settings = _with_decompose_weights(settings, args.decompose_weights)
    if args.enrich:
        settings = _with_enrich(settings)
    compare = fusion is not None or bool(sets) or args.decompose or args.enrich
    doc = asyncio.run(_compare(args, conversations, ks, settings) if compare
                      else _evaluate(args, conversations, ks))
    if args.json or compare:
        print(json.dumps(doc, indent=2))
    else:
        _print_table(doc, ks)
    return 0


def _decomposer(args: argparse.Namespace) -> Any:
    """The cached router-model decomposer of ``--decompose`` (the model loads on the first miss), or None."""
    if not args.decompose:
        return None
    from recallserve.deployments.cli._decompose import CachedDecomposer, DecompositionCache, QueryDecomposer
    from recallserve.deployments.models import DEFAULT_MODEL
    from recallserve.serve import envs

    path = args.decompose_cache or str(envs.recallserve_home() / "locomo-decompose.json")
    try:
        cache = DecompositionCache(path)
    except ValueError as exc:
        raise UserError(f"--decompose-cache: {exc}") from None

    def load() -> QueryDecomposer:
        from recallserve.deployments.engines import LlamaCppConfig, build_engine

        # NOTE: cpu-local's router is the reasoner's model (router: shared_with: reasoner), the default model.
        return QueryDecomposer(build_engine(LlamaCppConfig(model=DEFAULT_MODEL, n_ctx=1024, n_threads=args.decompose_threads)))

    return CachedDecomposer(cache, DEFAULT_MODEL, load)


def _decomposed_questions(args: argparse.Namespace, conversations: list[Any]) -> set[str]:
    """The questions ``--decompose`` decomposes: those of ``--decompose-categories`` (none without --decompose)."""
    if not args.decompose:
        return set()
    try:
        cats = {int(x) for x in args.decompose_categories.split(",") if x.strip()}
    except ValueError:
        raise UserError(f"--decompose-categories: expected comma-separated categories 1-4, got {args.decompose_categories!r}") from None
    if not cats or not cats <= {1, 2, 3, 4}:
        raise UserError(f"--decompose-categories: expected comma-separated categories 1-4, got {args.decompose_categories!r}")
    return {q.question for c in conversations for q in c.questions if q.category in cats}


def _decompose_cost(decomposer: Any, questions: list[str]) -> dict[str, Any] | None:
    """The router model's time per question (from the cache: the run that wrote each entry) and the sub-query counts."""
    if decomposer is None:
        return None
    import numpy as np

    got = [decomposer.cache.get(decomposer.model, q) for q in questions]
    got = [d for d in got if d is not None]
    if not got:
        return None
    ms = [d.model_ms for d in got]
    return {"model": decomposer.model, "questions": len(got), "cache": str(decomposer.cache.path),
            "model_ms_p50": round(float(np.percentile(ms, 50)), 1), "model_ms_p95": round(float(np.percentile(ms, 95)), 1),
            "model_ms_mean": round(float(np.mean(ms)), 1),
            "sub_queries_mean": round(float(np.mean([len(d.queries) for d in got])), 2),
            "without_sub_queries": sum(1 for d in got if not d.queries),
            "model_calls_this_run": decomposer.misses}


def _filtered(conversations: list[Any], mode: str) -> list[Any]:
    """The conversations with only the turns the chat write filter stores (each turn read as a user message)."""
    if mode == "all":
        return conversations
    from recallserve.serve.write_filter import WriteFilterConfig, worth_storing

    cfg = WriteFilterConfig(mode=mode)
    return [c.model_copy(update={"turns": [t for t in c.turns if worth_storing(t.text, "", cfg) is not None]})
            for c in conversations]


async def _evaluate(args: argparse.Namespace, conversations: list[Any], ks: list[int]) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import Progress

    from recallserve.memory_shards.embedders import build_embedder
    from recallserve.serve import envs
    from recallserve.memory_shards.retrieval import RetrievalParams, local_hybrid_coordinator
    from recallserve.memory_shards.retrieval.locomo import IndexOptions, evaluate_locomo
    from recallserve.serve.memory_api import MemoryService, SearchRequest

    emb = build_embedder(args.embedder, runtime=args.runtime, cache_dir=envs.recallserve_home() / "onnx")
    tmp = tempfile.TemporaryDirectory(prefix="locomo-") if args.durable else None
    coord = local_hybrid_coordinator(args.shards, emb.model_id, emb.dim, data_root=tmp.name if tmp else None,
                                     fsync=bool(tmp))

    async def embed(texts: list[str]):
        return await asyncio.to_thread(emb.embed, texts)

    k_max = max(ks)
    # NOTE: "lexical" keeps only BM25 by giving the dense list no weight; the dense list still
    # supplies the similarity shown for each hit.
    weights = {"hybrid": (1.0, 1.0), "dense": (1.0, 0.0), "lexical": (0.0, 1.0), "keyword-rerank": (0.0, 1.0)}[args.mode]
    if args.mode == "keyword-rerank" and k_max > KEYWORD_RECALL:
        raise UserError(f"--k: keyword-rerank ranks BM25's first {KEYWORD_RECALL} only; got a cut-off of {k_max}")
    base = RetrievalParams()
    retrieval = base.model_copy(update={
        "dense_candidates": max(base.dense_candidates, k_max),
        "lexical_candidates": 0 if args.mode == "dense" else max(base.lexical_candidates, k_max),
        "dense_weight": base.dense_weight * weights[0], "lexical_weight": base.lexical_weight * weights[1],
        # NOTE: the eval ranks every turn; the service's default drops weak lexical-only hits.
        "lexical_min_ratio": 0.0,
    })
    service = MemoryService(coord, embed, top_k=min(k_max, 200), threshold=-1.0, retrieval=retrieval)
    # NOTE: decay "none": every turn is years old and the question has no date, so a time factor
    # would only reorder sessions by age; threshold -1 keeps a full ranking to k_max.
    no_decay = {"decay": "none"}

    latencies: list[float] = []

    async def search(tenant: str, question: str, k: int) -> list[str]:
        rerank = args.mode == "keyword-rerank"
        req = SearchRequest(query=question, k=KEYWORD_RECALL if rerank else k, threshold=-1.0, decay=no_decay,
                            hybrid=args.mode != "dense")
        t0 = time.perf_counter()
        hits = await service.search_request(tenant, req, now=asked_at[tenant])
        if rerank:  # NOTE: 002: keyword recall, then the vectors order what it found (decay none: cosine)
            hits = sorted(hits, key=lambda h: -h.dense_score)[:k]
        latencies.append(time.perf_counter() - t0)
        return [h.record.source_id for h in hits]

    all_turns = sum(len(c.turns) for c in conversations)
    conversations = _filtered(conversations, args.write_filter)
    asked_at = _asked_at(conversations)

    console = Console(stderr=True)
    started = time.perf_counter()
    total_turns = sum(len(c.turns) for c in conversations)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"indexing {total_turns} turns, then asking", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        results = await evaluate_locomo(conversations, service.add_records, search, ks,
                                        IndexOptions(context_window=args.context), progress)
    elapsed = time.perf_counter() - started
    if tmp is not None:
        for client in coord.shards:
            client.shard.close()
        tmp.cleanup()
    import numpy as np

    return {
        "command": shlex.join(["recallserve", *args.argv]),
        "file": args.file,
        "conversations": len(conversations),
        "only": args.only,
        "write_filter": args.write_filter,
        "turns": all_turns,
        "stored_memories": total_turns,
        "search_p50_ms": round(float(np.percentile(latencies, 50)) * 1000, 1) if latencies else None,
        "search_p95_ms": round(float(np.percentile(latencies, 95)) * 1000, 1) if latencies else None,
        "k": ks,
        "mode": args.mode,
        "context_window": args.context,
        "embedder": emb.model_id,
        "shards": args.shards,
        "seconds": round(elapsed, 1),
        "results": results,
    }


def _asked_at(conversations: list[Any]) -> dict[str, float]:
    """When each conversation's questions are asked: one day after its last session began.

    NOTE: the eval protocol, not a tuned constant: LoCoMo's questions carry no time, and time
    expressions in them ("last year", "in June") are read as asked just after the conversation.
    """
    return {c.sample_id: max((t.time for t in c.turns), default=0.0) + 86_400.0 for c in conversations}


async def _compare(args: argparse.Namespace, conversations: list[Any], ks: list[int],
                   settings: list[tuple[str, dict[str, float]]]) -> dict[str, Any]:
    """Index each conversation once, score it under every setting; leave-one-out over conversations."""
    import numpy as np

    from recallserve.memory_shards.embedders import build_embedder
    from recallserve.serve import envs
    from recallserve.memory_shards.retrieval import RetrievalParams, local_hybrid_coordinator
    from recallserve.memory_shards.retrieval.locomo import CATEGORIES, IndexOptions, evaluate_locomo
    from recallserve.memory_shards.retrieval.when import query_time_window
    from recallserve.serve.memory_api import MemoryService, SearchRequest

    emb = build_embedder(args.embedder, runtime=args.runtime, cache_dir=envs.recallserve_home() / "onnx")
    coord = local_hybrid_coordinator(args.shards, emb.model_id, emb.dim, data_root=None, fsync=False)
    cache: dict[str, np.ndarray] = {}

    async def embed(texts: list[str]):
        # NOTE: every setting asks the same questions (and sub-queries); a query is embedded once. A batch
        # of many texts is a write (the turns), embedded as is.
        if len(texts) <= 8 and all(t in cache for t in texts):
            return np.stack([cache[t] for t in texts])
        out = await asyncio.to_thread(emb.embed, texts)
        if len(texts) <= 8:
            cache.update(zip(texts, out))
        return out

    k_max = max(ks)
    base = RetrievalParams()
    decomposer = _decomposer(args)
    service = MemoryService(coord, embed, top_k=min(k_max, 200), threshold=-1.0)
    names = [n for n, _ in settings]
    latencies: dict[str, list[float]] = {n: [] for n in names}
    dated: dict[str, list[float]] = {n: [] for n in names}
    current = names[0]
    sub_query_weight = 0.0
    conversations = _filtered(conversations, args.write_filter)
    asked_at = _asked_at(conversations)
    decomposed = _decomposed_questions(args, conversations)
    conversations, facts, coverage = _enriched(args, conversations)
    # NOTE: the enriched index of a conversation is another tenant: the same records with their facts.
    suffix = ""

    async def search(tenant: str, question: str, k: int) -> list[str]:
        req = SearchRequest(query=question, k=k, threshold=-1.0, decay={"decay": "none"})
        # NOTE: the decomposition is read before the timer (cache or model, done before any setting
        # is timed); the search time is that of the shard calls and fusion of the question and its sub-queries.
        subs = (await decomposer(question)).queries if question in decomposed else []
        t0 = time.perf_counter()
        hits = await service.search_request(tenant + suffix, req, now=asked_at[tenant], sub_queries=subs,
                                            sub_query_weight=sub_query_weight)
        latencies[current].append(time.perf_counter() - t0)
        if query_time_window(question, asked_at[tenant]) is not None:
            dated[current].append(latencies[current][-1])
        return [h.record.source_id for h in hits]

    async def no_write(records: list[Any]) -> None:
        return None

    def enriched_write(sample_id: str) -> Any:
        from recallserve.serve.enrich import with_facts

        async def write(records: list[Any]) -> Any:
            got = facts.get(sample_id, {})
            return await service.add_records([with_facts(r.model_copy(update={"tenant": r.tenant + ENRICHED_TENANT}),
                                                         got.get(r.source_id, [])) for r in records])
        return write

    started = time.perf_counter()
    per_conv: dict[str, dict[str, Any]] = {}
    for conv in conversations:
        per_conv[conv.sample_id] = {}
        # NOTE: the questions are embedded before any setting is timed, so every setting's
        # latency is the same path (shard calls and fusion) without the query embedding.
        questions = {q.question for q in conv.questions if q.category in CATEGORIES}
        if decomposer is not None:
            # NOTE: decomposed (model or cache) before any setting is timed; the sub-queries are embedded with the questions.
            for q in sorted(questions & decomposed):
                questions |= set((await decomposer(q)).queries)
        questions = sorted(questions - set(cache))
        for start in range(0, len(questions), 256):
            vecs = await asyncio.to_thread(emb.embed, questions[start : start + 256])
            cache.update(zip(questions[start : start + 256], vecs))
        written: set[float] = set()
        for name, update in settings:
            current = name
            update = dict(update)
            sub_query_weight = update.pop(SUB_QUERY_WEIGHT, 0.0)
            enrich = update.pop(ENRICH, 0.0)
            suffix = ENRICHED_TENANT if enrich else ""
            write = no_write if enrich in written else enriched_write(conv.sample_id) if enrich else service.add_records
            written.add(enrich)
            service.retriever.params = base.model_copy(update={
                **update, "lexical_min_ratio": 0.0,
                "dense_candidates": max(base.dense_candidates, k_max),
                "lexical_candidates": max(base.lexical_candidates, k_max)})
            per_conv[conv.sample_id][name] = await evaluate_locomo(
                [conv], write, search, ks, IndexOptions(context_window=args.context))
    doc: dict[str, Any] = {
        "command": shlex.join(["recallserve", *args.argv]), "file": args.file, "only": args.only,
        "conversations": len(conversations), "write_filter": args.write_filter,
        "stored_memories": sum(len(c.turns) for c in conversations), "k": ks, "context_window": args.context,
        "embedder": emb.model_id, "seconds": round(time.perf_counter() - started, 1),
        "questions_asked_at": "one day after the conversation's last session (time expressions are read from then)",
        # NOTE: latencies exclude the query embedding (done once before timing; the same for every setting).
        "settings": {n: {"retrieval": dict(u),
                         "search_p50_ms": round(float(np.percentile(latencies[n], 50)) * 1000, 1),
                         "search_p95_ms": round(float(np.percentile(latencies[n], 95)) * 1000, 1),
                         # NOTE: the questions that name a time, the only ones date-aware scoring changes.
                         "dated_questions": len(dated[n]),
                         "dated_search_p50_ms": round(float(np.percentile(dated[n], 50)) * 1000, 1) if dated[n] else None,
                         "dated_search_p95_ms": round(float(np.percentile(dated[n], 95)) * 1000, 1) if dated[n] else None,
                         "query_embedding_timed": False} for n, u in settings},
        "decompose": _decompose_cost(decomposer, sorted(decomposed)),
        "enrich": coverage or None,
        "per_conversation": per_conv,
    }
    if len(per_conv) > 1 and len(names) > 1:
        doc["leave_one_out"] = leave_one_out(per_conv, "recall@10" if 10 in ks else f"recall@{ks[-1]}")
    return doc


def _print_table(doc: dict[str, Any], ks: list[int]) -> None:
    print(f"LoCoMo evidence recall@k  file={doc['file']}  conversations={doc['conversations']}  turns={doc['turns']}  "
          f"mode={doc['mode']}  context={doc['context_window']}  ({doc['seconds']} s)")
    print(f"stored {doc['stored_memories']} of {doc['turns']} turns (write filter: {doc['write_filter']}); "
          f"search p50 {doc['search_p50_ms']} ms, p95 {doc['search_p95_ms']} ms")
    header = f"{'category':<12} {'n':>4}  " + "  ".join(f"{'R@' + str(k):>6}" for k in ks)
    print(header)
    print("-" * len(header))
    for name, row in doc["results"].items():
        print(f"{name:<12} {int(row['n']):>4}  " + "  ".join(f"{row[f'recall@{k}']:>6.3f}" for k in ks))
    sys.stdout.flush()
