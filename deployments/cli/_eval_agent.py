"""``recallserve eval agent``: tool choice, answer key facts and loop latency of the agent with a real model.

For each question of a shipped set (``--questions tuned|holdout|all``, see
:mod:`recallserve.serve.agent.demo.questions`) the full agent runs (memory recall over the demo world, router,
loop) on the turn the chat pipeline builds for the same request (:func:`recallserve.serve.pipeline.agent_turn`). Two verdicts per question:

* **tool choice**: the trace holds the expected call with arguments that passed validation and
  match the expected values (calculator: the computed result within 0.01), or, when no tool is
  expected, no tool call at all;
* **key facts**: the answer states every fact of the question and none of its ``must_not``
  strings (:func:`recallserve.serve.agent.demo.facts.score_answer`); a failing row lists what was missing;
* **claims of absence without a search** (must be 0): the answer's sentences saying that something
  did not happen or is not on record that no search of the turn supports
  (:func:`recallserve.serve.agent.grounding.unsupported_absence` over the answer and the turn's record of searches).

Reported per set: both shares, loop latency p50/p95, the time to the first answer character, and
the engine's time to first token with a warm prompt cache (the stable system prefix already
evaluated). ``--rescore FILE`` scores the answers of an earlier run's JSON by the current facts
(no model).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from recallserve.deployments.cli import UserError
from recallserve.serve.agent.demo.facts import score_answer
from recallserve.serve.agent.demo.questions import QUESTION_SETS, load_questions
from recallserve.serve.agent.grounding import Search, model_text, unsupported_absence
from recallserve.serve.language import language_of
from recallserve.serve.agent.schemas import AgentResult, ToolCallRecord
from recallserve.serve.pipeline import agent_turn

__all__ = ["add_model_arguments", "add_parser", "build_llama_engine", "evaluate", "fact_row", "rescore", "run",
           "run_with_model", "score_result", "summarise"]

_VALIDATED = ("ok", "cached", "error", "timeout")


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
    """A llama.cpp engine for ``model`` (built-in name or GGUF path)."""
    from recallserve.deployments.engines import build_engine, parse_engine_config

    return build_engine(parse_engine_config({"kind": "llama_cpp", "model": model, "n_threads": threads,
                                             "n_ctx": n_ctx}))


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


async def _engine_ttft(agent: Any, scopes: list[str]) -> float:
    """Engine time to first token (ms) for a short question after the same prefix was evaluated."""
    from recallserve.serve.agent._prompts import system_prompt
    from recallserve.serve.engine import ChatMessage, GenerationParams

    system = ChatMessage(role="system", content=system_prompt(agent.tools.for_scopes(scopes)))
    params = GenerationParams(max_tokens=8, temperature=0.0)
    times = []
    for q in ("Question: hello", "Question: what is 2+2?", "Question: thanks!"):
        t = time.perf_counter()
        async for _ in agent.reasoner.stream([system, ChatMessage(role="user", content=q)], params):
            times.append((time.perf_counter() - t) * 1e3)
            break
    return statistics.median(times[1:])


def fact_row(q: dict[str, Any], answer: str) -> dict[str, Any]:
    """The key-fact verdict of ``answer`` to ``q`` as row fields: ``facts_pass``, ``missing``, ``forbidden``, and
    ``language_pass``: the answer, less the lines quoting a record or an observation (``grounding.model_text``),
    is in the question's language (``language.language_of``)."""
    verdict = score_answer(answer, q["facts"], q.get("must_not", ()))
    return {"facts_pass": verdict.passed, "missing": verdict.missing, "forbidden": verdict.forbidden,
            "language_pass": language_of(model_text(answer)) == language_of(q["q"])}


async def evaluate(agent: Any, questions: list[tuple[int, dict[str, Any]]], scopes: list[str], *,
                   verbose: bool = True, on_row: Callable[[list[dict[str, Any]]], None] | None = None,
                   ) -> dict[str, Any]:
    """Run every ``(number, question)`` through ``agent``; returns the summary and per-question rows
    (``on_row`` gets the rows so far after each question)."""
    rows = []
    known = [t.description for t in agent.tools.all()]  # NOTE: as the served check reads a question's fault words
    for n, q in questions:
        # NOTE: the turn is built as for POST /v1/chat/completions (budget, context-mode, the one recall).
        request, turn = await agent_turn(agent, [{"role": "user", "content": q["q"]}], tenant="eval-user",
                                         scopes=scopes)
        result = await agent.run(request, turn)
        ok = score_result(q, result)
        calls = [(c.name, c.args, c.status) for c in result.tool_calls]
        searches = [Search(s["source"], s["ran"], tuple(s["found"])) for s in result.searches]
        row = {"n": n, "q": q["q"], "expected": q["tool"], "pass": ok, **fact_row(q, result.answer),
               "absence_unsupported": unsupported_absence(result.answer, searches, q["q"], known),
               "absence_left_out": [d for st in result.steps if st.kind == "guard" for d in st.data.get("dropped", ())],
               "searches": [(s.source, s.ran, len(s.found)) for s in searches],
               "route": result.route.model_dump(), "calls": calls, "answer": result.answer,
               "memories": [h["source_id"] for h in result.memory_hits], "elapsed_ms": result.elapsed_ms,
               "first_token_ms": result.first_token_ms, "finish_reason": result.finish_reason,
               "usage": result.usage.model_dump()}
        rows.append(row)
        if on_row is not None:
            on_row(rows)
        if verbose:
            facts = "facts ok" if row["facts_pass"] else f"facts FAIL missing={row['missing']} forbidden={row['forbidden']}"
            print(f"{n:2d} {'PASS' if ok else 'FAIL'} {facts} {result.elapsed_ms / 1e3:6.1f}s route={result.route.route}"
                  f"{result.route.tools} calls={calls} | {q['q'][:60]}", flush=True)
    return summarise(rows)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Shares and latencies of scored rows (``pass``: tool choice, ``facts_pass``: key facts)."""
    lat = [r["elapsed_ms"] for r in rows]
    ftt = [r["first_token_ms"] for r in rows if r.get("first_token_ms") is not None]
    return {
        "questions": len(rows), "passed": sum(r["pass"] for r in rows),
        "score": _share(rows),
        "with_tool_score": _share([r for r in rows if r["expected"]]),
        "no_tool_score": _share([r for r in rows if not r["expected"]]),
        "facts_passed": sum(r["facts_pass"] for r in rows), "facts_score": _share(rows, "facts_pass"),
        "language_passed": sum(r.get("language_pass", False) for r in rows),
        "absence_without_search": sum(len(r.get("absence_unsupported") or ()) for r in rows),
        "absence_left_out": sum(len(r.get("absence_left_out") or ()) for r in rows),
        "both_score": sum(r["pass"] and r["facts_pass"] for r in rows) / max(1, len(rows)),
        "facts_failed": [{"n": r["n"], "q": r["q"], "missing": r["missing"], "forbidden": r["forbidden"]}
                         for r in rows if not r["facts_pass"]],
        "prompt_tokens_mean": sum(r.get("usage", {}).get("prompt_tokens", 0) for r in rows) / max(1, len(rows)),
        "memories_shown_mean": sum(len(r.get("memories", ())) for r in rows) / max(1, len(rows)),
        "latency_ms_p50": _pct(lat, 50), "latency_ms_p95": _pct(lat, 95),
        "first_answer_char_ms_p50": _pct(ftt, 50), "first_answer_char_ms_p95": _pct(ftt, 95),
        "rows": rows,
    }


def _share(rows: list[dict[str, Any]], key: str = "pass") -> float:
    return sum(bool(r[key]) for r in rows) / max(1, len(rows))


def question_numbers(text: str) -> list[int]:
    """``--only``: 1-based question numbers, comma-separated, ranges as ``a-b`` (``3,5,26-40``); at most 1,000."""
    wanted: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a question number or a range a-b") from None
        if lo < 1 or hi < lo or len(wanted) + hi - lo + 1 > 1000:
            raise argparse.ArgumentTypeError(f"{part!r}: numbers start at 1, a range runs low-high, 1,000 at most")
        wanted += range(lo, hi + 1)
    return wanted


def _selected(which: str, only: list[int], limit: int) -> list[tuple[int, dict[str, Any]]]:
    """The questions of one set to run, numbered from 1 within the set (``--only``, ``--limit``)."""
    questions = list(enumerate(load_questions(which), 1))
    if only:
        bad = [i for i in only if not 1 <= i <= len(questions)]
        if bad:
            raise UserError(f"--only: {bad} outside 1..{len(questions)} of set {which!r}")
        questions = [questions[i - 1] for i in only]
    return questions[:limit] if limit else questions


def _sets(which: str) -> list[str]:
    return {"all": ["tuned", "holdout"], "compound_all": ["compound", "compound_holdout"]}.get(which, [which])


def rescore(report: dict[str, Any]) -> dict[str, Any]:
    """An earlier run's report with every answer scored again by the current facts (no model).

    Rows are matched to questions by their text; a row whose question is no longer shipped is dropped.
    A report of one set without ``sets`` (older runs) is read as that set.
    """
    out = {k: v for k, v in report.items() if k not in ("rows", "sets")}
    sets = report["sets"] if "sets" in report else {report["questions_set"]: report}
    out["sets"] = {}
    for name, summary in sets.items():
        by_text = {q["q"]: (n, q) for n, q in enumerate(load_questions(name), 1)}
        rows = [{**r, "n": by_text[r["q"]][0], **fact_row(by_text[r["q"]][1], r["answer"])}
                for r in summary["rows"] if r["q"] in by_text]
        out["sets"][name] = {**{k: v for k, v in summary.items() if k not in ("rows",)}, **summarise(rows)}
    return out


def _print_summary(report: dict[str, Any]) -> None:
    head = {k: v for k, v in report.items() if k != "sets"}
    sets = {name: {k: v for k, v in s.items() if k not in ("rows", "facts_failed")} for name, s in report["sets"].items()}
    print(json.dumps({**head, "sets": sets}, indent=1))
    for name, s in report["sets"].items():
        print(f"{name}: tool choice {s['passed']}/{s['questions']} = {s['score']:.3f}; key facts "
              f"{s['facts_passed']}/{s['questions']} = {s['facts_score']:.3f}; claims of absence without a search "
              f"{s.get('absence_without_search', 'n/a')} (left out by the check: {s.get('absence_left_out', 'n/a')}); "
              f"answers in the question's language {s.get('language_passed', 'n/a')}/{s['questions']}")
        for f in s["facts_failed"]:
            print(f"  {name} #{f['n']} facts FAIL missing={f['missing']} forbidden={f['forbidden']} | {f['q'][:70]}")


async def _amain(a: argparse.Namespace) -> int:
    from recallserve.serve.agent import Agent, AgentConfig, default_registry
    from recallserve.serve.agent.demo import DEMO_SCOPES
    from recallserve.serve.agent.demo._memory import LocalMemory
    from recallserve.serve.agent.demo.scenario import load_demo_memories
    from recallserve.serve.turn import RecallConfig

    if a.rescore:
        report = rescore(json.loads(Path(a.rescore).read_text()))
        _print_summary(report)
        if a.out:
            Path(a.out).write_text(json.dumps(report, indent=1, default=str))
        return 0
    selected = {name: _selected(name, a.only, a.limit) for name in _sets(a.questions)}
    engine = build_llama_engine(a.model, a.threads)
    memory = None
    if not a.no_memory:
        memory = LocalMemory()
        await load_demo_memories(memory)
    timeouts = {"engine_timeout_s": a.timeout, "request_timeout_s": a.timeout * 2}
    if a.tool_choice_only:  # NOTE: score the first step's choice; skip the answer generation (CPU time)
        cfg = AgentConfig(use_router=not a.no_router, routing_rules=not a.no_rules, max_steps=1,
                          model_partial_answer=False, **timeouts)
    else:
        cfg = AgentConfig(use_router=not a.no_router, routing_rules=not a.no_rules, max_steps=a.max_steps,
                          check_absence=not a.no_check_absence, **timeouts)
    recall = RecallConfig(**{k: v for k, v in (("relative_cut", a.relative_cut), ("prompt_chars", a.recall_chars))
                             if v is not None})
    agent = Agent(engine, default_registry(), memory=memory, config=cfg, recall=recall)
    if a.no_ttft:  # NOTE: still load the model and fill the prompt cache once, outside the first question's time
        await agent.warm_up(DEMO_SCOPES)
        ttft = float("nan")
    else:
        ttft = await _engine_ttft(agent, DEMO_SCOPES)
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "model": a.model, "questions_set": a.questions, "only": a.only, "limit": a.limit, "rules": not a.no_rules,
        "router": not a.no_router, "tool_choice_only": a.tool_choice_only, "memory": not a.no_memory,
        "check_absence": not a.no_check_absence,
        "recall": agent.recall.model_dump(), "engine_ttft_warm_ms": ttft, "sets": {}}
    for name, questions in selected.items():
        def partial(rows: list[dict[str, Any]], name: str = name) -> None:
            if a.out:  # NOTE: after each question: a run stopped early keeps what it measured
                Path(a.out).write_text(json.dumps({**report, "sets": {**report["sets"], name: summarise(rows)}},
                                                  indent=1, default=str))

        report["sets"][name] = await evaluate(agent, questions, DEMO_SCOPES, on_row=partial)
        if a.out:  # NOTE: written after each set: a long run that is stopped keeps what it measured
            Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    report["wall_s"] = time.perf_counter() - t0
    _print_summary(report)
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    await engine.close()
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``eval agent``."""
    p = subparsers.add_parser("agent", help="tool choice and answer key facts of the agent on the demo questions")
    add_model_arguments(p)
    p.add_argument("--questions", default="tuned", choices=sorted(QUESTION_SETS),
                   help="question set: tuned (developed against), holdout (written blind), all; compound, "
                   "compound_holdout (never tuned on), compound_all; zh-tuned, zh-holdout; compound_holdout2, "
                   "zh-holdout2, compound_holdout3, zh-holdout3 (written blind in session 3, never tuned on)")
    p.add_argument("--limit", type=int, default=0, help="only the first N questions (of each set)")
    p.add_argument("--only", type=question_numbers, default=[],
                   help="1-based question numbers within each set, comma-separated, ranges as a-b (3,5,26-40)")
    p.add_argument("--max-steps", type=int, default=5, help="loop steps")
    p.add_argument("--no-router", action="store_true", help="skip the router model (loop with all tools when the rules are undecided)")
    p.add_argument("--no-rules", action="store_true", help="ablation: no routing rules (router model or loop decide alone)")
    p.add_argument("--tool-choice-only", action="store_true",
                   help="one loop step per question, no answer generation: scores the first tool choice only")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds one engine call may take (the loop's deadline: twice that); raise it on a busy machine")
    p.add_argument("--no-ttft", action="store_true",
                   help="skip the warm engine time-to-first-token measurement (three engine calls) before the questions")
    p.add_argument("--relative-cut", type=float, default=None, metavar="C",
                   help="recall's relevance cut (RecallConfig.relative_cut; default: the schema's; 0 = whole top-k)")
    p.add_argument("--recall-chars", type=int, default=None, metavar="N",
                   help="most characters of all recalled memories in the prompt (RecallConfig.prompt_chars; "
                        "default: the schema's)")
    p.add_argument("--no-memory", action="store_true", help="run without the demo memories")
    p.add_argument("--no-check-absence", action="store_true",
                   help="ablation: keep claims of absence no search supports (agent.check_absence off)")
    p.add_argument("--out", default="", help="write the JSON report (per set: shares, per-question rows) here")
    p.add_argument("--rescore", default="", metavar="FILE",
                   help="no model: score the answers of an earlier --out report by the current key facts")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the evaluation (loads the model: takes minutes on a CPU)."""
    return run_with_model(_amain(args))


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """``--model`` and ``--threads`` of a command that runs the agent in-process on llama.cpp."""
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m", help="built-in model name or GGUF path")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads")


def run_with_model(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main``; a model that cannot load or answer is one line (exit 2), not a traceback."""
    from recallserve.deployments.cli import UserError
    from recallserve.serve.engine import EngineError

    try:
        return asyncio.run(main)
    except EngineError as exc:
        raise UserError(f"model: {exc}") from None
