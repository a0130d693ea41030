"""Tool-choice evaluation of the agent with a real model: ``python -m serve.agent.eval``.

For each question of a shipped set (``--questions tuned``: ``serve/agent/demo/questions.json``,
40 questions, 30 expect a tool call, 10 none; ``holdout``: ``questions_holdout.json``, 40 more
written without seeing the rules or the tuned set, 28 with a tool, 12 without) the full agent runs (memory recall over the demo world, router, loop). A question passes
when the trace holds the expected call with arguments that passed validation and match the
expected values (calculator: the computed result within 0.01), or, when no tool is expected,
when the trace holds no tool call at all. Reported: the pass share, loop latency p50/p95, the
time to the first answer character, and the engine's time to first token with a warm prompt
cache (the stable system prefix already evaluated).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

from serve.agent.schemas import AgentRequest, AgentResult, ToolCallRecord

__all__ = ["QUESTION_SETS", "load_questions", "score_result", "build_llama_engine", "evaluate", "main"]

_VALIDATED = ("ok", "cached", "error", "timeout")


QUESTION_SETS = {"tuned": ("questions.json",), "holdout": ("questions_holdout.json",),
                 "all": ("questions.json", "questions_holdout.json")}


def load_questions(which: str = "tuned") -> list[dict[str, Any]]:
    """A shipped tool-choice question set.

    ``tuned``: the 40 questions the prompts, descriptions and routing hints were developed
    against; ``holdout``: 40 questions written afterwards by someone who saw neither (an honest
    measure of generalisation); ``all``: both.
    """
    if which not in QUESTION_SETS:
        raise ValueError(f"questions: expected one of {sorted(QUESTION_SETS)}, got {which!r}")
    out: list[dict[str, Any]] = []
    for name in QUESTION_SETS[which]:
        text = resources.files("serve.agent.demo").joinpath(name).read_text(encoding="utf-8")
        out.extend(json.loads(text))
    return out


def _match(rec: ToolCallRecord, q: dict[str, Any]) -> bool:
    if rec.name != q["tool"] or rec.status not in _VALIDATED:
        return False
    for key, want in (q.get("args") or {}).items():
        if str(rec.args.get(key)) != str(want):
            return False
    for key, part in (q.get("args_contain") or {}).items():
        if part.lower() not in str(rec.args.get(key, "")).lower():
            return False
    if "result" in q:
        got = rec.result.get("result") if isinstance(rec.result, dict) else None
        # NOTE: 0.01 absolute tolerance: money and averages are compared to the cent.
        if not isinstance(got, (int, float)) or abs(float(got) - float(q["result"])) > 0.01:
            return False
    return True


def score_result(q: dict[str, Any], result: AgentResult) -> bool:
    """Whether ``result``'s trace makes the expected call with valid arguments (or none when none is expected)."""
    if q["tool"] is None:
        return not result.tool_calls
    return any(_match(rec, q) for rec in result.tool_calls)


def build_llama_engine(model: str, threads: int | None = None, n_ctx: int = 4096) -> Any:
    """A llama.cpp engine for ``model`` (built-in name or GGUF path) through ``deployments.engines``."""
    from deployments.engines import build_engine, parse_engine_config

    return build_engine(parse_engine_config({"kind": "llama_cpp", "model": model, "n_threads": threads,
                                             "n_ctx": n_ctx}))


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


async def _engine_ttft(agent: Any, scopes: list[str]) -> float:
    """Engine time to first token (ms) for a short question after the same prefix was evaluated."""
    from serve.agent._prompts import system_prompt
    from serve.engine import ChatMessage, GenerationParams

    system = ChatMessage(role="system", content=system_prompt(agent.tools.for_scopes(scopes)))
    params = GenerationParams(max_tokens=8, temperature=0.0)
    times = []
    for q in ("Question: hello", "Question: what is 2+2?", "Question: thanks!"):
        t = time.perf_counter()
        async for _ in agent.reasoner.stream([system, ChatMessage(role="user", content=q)], params):
            times.append((time.perf_counter() - t) * 1e3)
            break
    return statistics.median(times[1:])


async def evaluate(agent: Any, questions: list[dict[str, Any]], scopes: list[str], *, verbose: bool = True,
                   ) -> dict[str, Any]:
    """Run every question through ``agent``; returns the summary and per-question rows."""
    rows = []
    for i, q in enumerate(questions):
        req = AgentRequest.from_messages("eval-user", [{"role": "user", "content": q["q"]}], scopes=scopes)
        result = await agent.run(req)
        ok = score_result(q, result)
        calls = [(c.name, c.args, c.status) for c in result.tool_calls]
        rows.append({"q": q["q"], "expected": q["tool"], "pass": ok, "route": result.route.model_dump(),
                     "calls": calls, "answer": result.answer, "elapsed_ms": result.elapsed_ms,
                     "first_token_ms": result.first_token_ms, "finish_reason": result.finish_reason,
                     "usage": result.usage.model_dump()})
        if verbose:
            print(f"{i + 1:2d} {'PASS' if ok else 'FAIL'} {result.elapsed_ms / 1e3:6.1f}s route={result.route.route}"
                  f"{result.route.tools} calls={calls} | {q['q'][:60]}", flush=True)
    lat = [r["elapsed_ms"] for r in rows]
    ftt = [r["first_token_ms"] for r in rows if r["first_token_ms"] is not None]
    return {
        "questions": len(rows), "passed": sum(r["pass"] for r in rows),
        "score": sum(r["pass"] for r in rows) / max(1, len(rows)),
        "with_tool_score": _share([r for r in rows if r["expected"]]),
        "no_tool_score": _share([r for r in rows if not r["expected"]]),
        "latency_ms_p50": _pct(lat, 50), "latency_ms_p95": _pct(lat, 95),
        "first_answer_char_ms_p50": _pct(ftt, 50), "first_answer_char_ms_p95": _pct(ftt, 95),
        "rows": rows,
    }


def _share(rows: list[dict[str, Any]]) -> float:
    return sum(r["pass"] for r in rows) / max(1, len(rows))


async def _amain(a: argparse.Namespace) -> int:
    from serve.agent import Agent, AgentConfig, default_registry
    from serve.agent.demo import DEMO_SCOPES
    from serve.agent.demo._memory import LocalMemory
    from serve.agent.demo.scenario import load_demo_memories

    questions = load_questions(a.questions)
    if a.only:
        questions = [questions[int(i) - 1] for i in a.only.split(",")]
    questions = questions[: a.limit] if a.limit else questions
    engine = build_llama_engine(a.model, a.threads)
    memory = None
    if not a.no_memory:
        memory = LocalMemory()
        await load_demo_memories(memory)
    if a.tool_choice_only:  # NOTE: score the first step's choice; skip the answer generation (CPU time)
        cfg = AgentConfig(use_router=not a.no_router, routing_rules=not a.no_rules, max_steps=1,
                          model_partial_answer=False)
    else:
        cfg = AgentConfig(use_router=not a.no_router, routing_rules=not a.no_rules, max_steps=a.max_steps)
    agent = Agent(engine, default_registry(), memory=memory, config=cfg)
    ttft = await _engine_ttft(agent, DEMO_SCOPES)
    t0 = time.perf_counter()
    summary = await evaluate(agent, questions, DEMO_SCOPES)
    summary.update({"model": a.model, "questions_set": a.questions, "rules": not a.no_rules, "router": not a.no_router, "tool_choice_only": a.tool_choice_only, "memory": not a.no_memory,
                    "engine_ttft_warm_ms": ttft, "wall_s": time.perf_counter() - t0})
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1, default=str))
    await engine.close()
    return 0


def build_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Arguments of the eval (shared by ``python -m serve.agent.eval`` and ``recallserve eval agent``)."""
    p = p or argparse.ArgumentParser(prog="python -m serve.agent.eval", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m", help="built-in model name or GGUF path")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    p.add_argument("--questions", default="tuned", choices=sorted(QUESTION_SETS),
                   help="question set: tuned (developed against), holdout (written blind), all")
    p.add_argument("--limit", type=int, default=0, help="only the first N questions")
    p.add_argument("--only", default="", help="comma-separated 1-based question numbers")
    p.add_argument("--max-steps", type=int, default=5, help="loop steps")
    p.add_argument("--no-router", action="store_true", help="skip the router model (loop with all tools when the rules are undecided)")
    p.add_argument("--no-rules", action="store_true", help="ablation: no routing rules (router model or loop decide alone)")
    p.add_argument("--tool-choice-only", action="store_true",
                   help="one loop step per question, no answer generation: scores the first tool choice only")
    p.add_argument("--no-memory", action="store_true", help="run without the demo memories")
    p.add_argument("--out", default="", help="write the JSON summary with per-question rows here")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    return asyncio.run(_amain(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
