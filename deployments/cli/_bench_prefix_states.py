"""``recallserve bench prefix-states``: prompt tokens the reasoner engine evaluates over mixed traffic, with and
without saved prompt states.

The sequence is what a cpu-local reasoner sees when users mix questions: agent turns (the real
tool prompt of the profile's default scopes + a question) interleaved with direct answers and
summaries (other, short system prompts), each call prefill-only (``max_tokens`` 1) so the figure
is the prompt's cost. The same sequence runs on two engines of the profile's reasoner model,
``engine.prefix_states`` 0 (llama.cpp's own reuse of the previous call's prefix only) and the
profile's setting, interleaved call by call so both see the same machine load. Reported per
engine: prompt tokens, tokens evaluated (prompt - cached), engine seconds, and the ratios.

    recallserve bench prefix-states --out loadtests/results/prefix-states.json   # cpu-local's reasoner
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from recallserve.deployments.cli import UserError, add_profile_arguments
from recallserve.deployments.cli._bench_args import add_out_argument, write_report
from recallserve.deployments.config import load_config
from recallserve.deployments.engines import LlamaCppConfig, LlamaCppEngine
from recallserve.serve.agent import default_registry
from recallserve.serve.agent._prompts import direct_prompt, system_prompt
from recallserve.serve.context._summary import SUMMARY_PROMPT
from recallserve.serve.engine import ChatMessage, GenerationParams

NAME = "prefix-states"

_QUESTIONS = ["What is the status of order 104333?", "Which orders were made from batch B-2315?",
              "What does error E42 mean on a BrewMaster?"]


def _sequence(tool_prompt: str) -> list[tuple[str, list[ChatMessage]]]:
    """Agent turn, direct answer, summary, agent turn, ... (what one reasoner replica serves)."""
    out: list[tuple[str, list[ChatMessage]]] = []
    for i, q in enumerate(_QUESTIONS):
        out.append(("agent", [ChatMessage(role="system", content=tool_prompt),
                              ChatMessage(role="user", content=f"Question: {q}")]))
        out.append(("direct", [ChatMessage(role="system", content=direct_prompt()),
                               ChatMessage(role="user", content=f"Question: thanks, and name one colour ({i}).")]))
        out.append(("summary", [ChatMessage(role="system", content=SUMMARY_PROMPT.format(words=60)),
                                ChatMessage(role="user", content=f"user: my order {104333 + i} is late\nassistant: "
                                            "I checked it: shipped yesterday.")]))
    return out


async def _run(cfg: Any) -> dict[str, Any]:
    engine_cfg = cfg.reasoner.engine
    if not isinstance(engine_cfg, LlamaCppConfig):
        raise UserError(f"{cfg.name}: the reasoner is not a llama.cpp engine")
    tools = default_registry(demo=cfg.agent_demo_tools).for_scopes(list(cfg.auth.default_scopes))
    engines = {"states off": LlamaCppEngine(engine_cfg.model_copy(update={"prefix_states": 0})),
               f"states {engine_cfg.prefix_states}": LlamaCppEngine(engine_cfg)}
    params = GenerationParams(max_tokens=1, temperature=0.0)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    try:
        for kind, messages in _sequence(system_prompt(tools)):
            for name, engine in engines.items():
                out = await engine.chat(messages, params)
                rows[name].append({"kind": kind, "prompt": out.prompt_tokens, "cached": out.cached_tokens,
                                   "evaluated": out.prompt_tokens - out.cached_tokens, "engine_s": out.engine_ms / 1e3})
                print(f"{name:>10} {kind:>7}: {rows[name][-1]}", flush=True)
    finally:
        for engine in engines.values():
            await engine.close()
    return {"profile": cfg.name, "model": engine_cfg.model.display_name, "calls": rows}


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench prefix-states``."""
    p = subparsers.add_parser(NAME, help="reasoner prompt tokens evaluated over mixed traffic, with and without saved states")
    add_profile_arguments(p)
    add_out_argument(p, NAME, markdown=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the sequence on both engines; print and write the table."""
    cfg = load_config(str(args.config) if args.config else (args.profile or "cpu-local"))
    data = asyncio.run(_run(cfg))
    lines = [f"# Saved prompt states: {data['model']}, mixed traffic, prefill only", "",
             f"`recallserve {' '.join(getattr(args, 'argv', []))}`", "",
             "| engine | calls | prompt tokens | evaluated | agent-turn tokens evaluated | engine s |",
             "|---|---:|---:|---:|---:|---:|"]
    totals = {}
    for name, calls in data["calls"].items():
        ev = sum(c["evaluated"] for c in calls)
        agent_ev = sum(c["evaluated"] for c in calls if c["kind"] == "agent")
        secs = sum(c["engine_s"] for c in calls)
        totals[name] = (ev, secs)
        lines.append(f"| {name} | {len(calls)} | {sum(c['prompt'] for c in calls)} | {ev} | {agent_ev} | {secs:.1f} |")
    (off_ev, off_s), (on_ev, on_s) = totals.values()
    lines += ["", f"Tokens evaluated: {off_ev / max(on_ev, 1):.2f}x fewer with saved states; engine time "
              f"{off_s / max(on_s, 1e-9):.2f}x less (calls interleaved, same load)."]
    data["summary"] = {"evaluated_ratio": off_ev / max(on_ev, 1), "engine_time_ratio": off_s / max(on_s, 1e-9)}
    table = "\n".join(lines) + "\n"
    print(table)
    write_report(args, data, table)
    return 0
