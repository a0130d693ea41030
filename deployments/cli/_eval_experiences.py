"""``recallserve eval experiences``: segmented reasoning with and without injected experiences,
under the E-CoT rules before and after issue 19.

Runs the written problem set (:mod:`recallserve.serve.experience._eval_problems`: arithmetic, unit and rule
questions) through the reasoner in the segmented mode, per **mode** and **condition**:

* conditions (the design's A/B): ``without`` (E-CoT off: an empty cache, nothing injected) and
  ``with`` (E-CoT on: worked seed experiences in the active cache, injected with the checks
  they imply);
* modes: ``after`` (the defaults: review before reuse, checks extracted from the context,
  hybrid search, the one-rewrite parser fallback) and ``before`` (the behaviour before issue 19
  as far as config reaches it: ``extracted_checks``, ``hybrid`` and ``parse_fallback`` off, and
  the old filing rule :func:`tier_before`, under which only a low-confidence trace waited in
  review). Context cleaning and the archive's error-tag search have no switch: both modes
  have them (the archive is empty in this eval, so the second changes no prompt).

Per mode and condition it reports the share of traces that reach the active cache unreviewed and
wrong (target 0), the verification pass rate (all checks run, and the model's own only), the
parse rate without and with the fallback, the answer accuracy, the confidence mix and the
latency. A prompt the model has already answered in this run is answered from memory
(:class:`_Memo`: temperature 0, seed 0, so the model would write the same reply): the modes'
``without`` runs share their generations, and the modes differ only where their rules do.
Rows are written as JSON with ``--out`` (and row by row to ``<out>.rows.jsonl``).

``--replay FILE,...`` verifies and files again the replies an earlier run stored (its ``--out``
JSON files, merged), with the current rules and no model: each prompt gets the stored reply of its
problem and condition. It re-scores what the model wrote; it says nothing of what the model would
write under a changed prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from recallserve.deployments.cli import UserError

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``experiences`` under ``recallserve eval``."""
    p = subparsers.add_parser(
        "experiences", help="parse and verification rates of segmented reasoning, with and without experiences"
    )
    p.add_argument("--model", default=None,
                   help="built-in model name or GGUF path (default: the default chat model)")
    p.add_argument("--problems", type=Path, default=None,
                   help="JSON lines of {id, domain, topic, question, expected} (default: the shipped set)")
    p.add_argument("--limit", type=int, default=None, help="run only the first N problems")
    p.add_argument("--ids", default=None, help="comma-separated problem ids to run (default: all)")
    p.add_argument("--condition", choices=("both", "without", "with"), default="both",
                   help="E-CoT off (without injected experiences), on (with) or both (the A/B; default)")
    p.add_argument("--mode", choices=("both", "before", "after"), default="both",
                   help="the rules before issue 19 (extracted checks, hybrid search, fallback off; old filing "
                        "rule), after (the defaults) or both (default)")
    p.add_argument("--max-tokens", type=int, default=220, help="generation budget per answer (default 220)")
    # NOTE: 1 thread by default: on a shared 2-core machine llama.cpp's OpenMP threads spin at
    # barriers while descheduled, measured 0.3 tok/s with 2 threads vs 2 tok/s with 1 under load.
    p.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default 1)")
    p.add_argument("--constrained", action="store_true", help="constrain replies with a JSON schema")
    p.add_argument("--no-fallback", action="store_true",
                   help="no rewrite of unparsable replies in the after mode (default: the model rewrites its own once)")
    p.add_argument("--replay", default=None,
                   help="comma-separated --out JSON files of earlier runs: verify their stored replies again "
                        "with the current rules, without a model")
    p.add_argument("--out", type=Path, default=None, help="write per-problem rows and the summary as JSON")
    p.set_defaults(func=run)


class _Replay:
    """An engine that answers each prompt with the reply an earlier run stored for its problem
    under one mode and condition; :meth:`cell` picks which. The problem is found by its question
    in the prompt's last message."""

    def __init__(self, model_name: str, replies: dict[tuple[str, str], str]) -> None:
        self.model_name = model_name
        self._replies = replies
        self._condition = "after/without"
        self.replayed = 0

    def cell(self, mode: str, inject: bool) -> _Replay:
        self._condition = f"{mode}/{'with' if inject else 'without'}"
        return self

    async def chat(self, messages: Any, params: Any) -> Any:
        from recallserve.serve.engine import ChatResult, EngineError

        last = messages[-1].content
        for (question, cond), text in self._replies.items():
            if cond == self._condition and question in last:
                self.replayed += 1
                return ChatResult(text=text, prompt_tokens=0, completion_tokens=0, finish_reason="stop",
                                  model=self.model_name)
        raise EngineError("replay: no stored reply for this prompt")

    async def close(self) -> None:
        return None


def _load_replay(arg: str, problems: list[dict[str, Any]]) -> tuple[_Replay, list[dict[str, Any]]]:
    """The replay engine of the stored replies in ``arg``'s files (by mode and condition), and the
    problems that have a stored reply in every cell."""
    questions = {p["id"]: p["question"] for p in problems}
    replies: dict[tuple[str, str], str] = {}
    model = ""
    for name in (x for x in arg.split(",") if x.strip()):
        path = Path(name.strip())
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"--replay: {path}: {exc}") from None
        model = model or str(data.get("model", ""))
        for row in data.get("rows", []):
            if row.get("id") in questions and isinstance(row.get("raw_text"), str):
                replies[(questions[row["id"]], f"{row.get('mode')}/{row.get('condition')}")] = row["raw_text"]
    cells = [f"{m}/{c}" for m in MODES for c in ("with", "without")]
    kept = [p for p in problems if all((p["question"], c) in replies for c in cells)]
    if not kept:
        raise UserError("--replay: no stored replies of the chosen problems")
    return _Replay(model or "replay", replies), kept


def _load_problems(path: Path | None, limit: int | None, ids: str | None = None) -> list[dict[str, Any]]:
    from recallserve.serve.experience._eval_problems import PROBLEMS

    if path is None:
        problems = list(PROBLEMS)
    else:
        if not path.is_file():
            raise UserError(f"--problems: {path} does not exist")
        problems = []
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"--problems: line {n}: {exc.msg}") from None
            missing = {"id", "domain", "topic", "question", "expected"} - set(row)
            if missing:
                raise UserError(f"--problems: line {n}: missing {', '.join(sorted(missing))}")
            problems.append(row)
    if ids:
        wanted = [i.strip() for i in ids.split(",") if i.strip()]
        unknown = sorted(set(wanted) - {p["id"] for p in problems})
        if unknown:
            raise UserError(f"--ids: unknown problem ids {', '.join(unknown)}")
        problems = [p for p in problems if p["id"] in wanted]
    if limit is not None:
        if limit < 1:
            raise UserError("--limit: must be >= 1")
        problems = problems[:limit]
    if not problems:
        raise UserError("--problems: no problems to run")
    return problems


def is_correct(answer: str | None, expected: Any) -> bool:
    """Numbers within 1% (or 1e-6 absolute), words by whole-word match (``no`` but not ``yes``)."""
    from recallserve.serve.experience._calculator import extract_number

    if not answer:
        return False
    if isinstance(expected, str):
        words = set(answer.lower().replace(".", " ").replace(",", " ").split())
        other = {"yes": "no", "no": "yes"}.get(expected.lower())
        return expected.lower() in words and (other is None or other not in words)
    got = extract_number(answer)
    # NOTE: 1% matches how answers are rounded in words ("about 33.3").
    return got is not None and abs(got - float(expected)) <= max(1e-6, 0.01 * abs(float(expected)))


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    # NOTE: not_run checks (no expression code can execute) are counted apart, not in the pass rates.
    not_run = sum(r.get("model_checks_not_run", 0) for r in rows)
    items = sum(r["model_checks"] for r in rows) - not_run
    passed = sum(r["model_checks_passed"] for r in rows)
    ext = sum(r.get("extracted_checks", 0) for r in rows)
    ext_passed = sum(r.get("extracted_passed", 0) for r in rows)
    conf: dict[str, int] = {}
    for r in rows:
        conf[r["confidence"] or "none"] = conf.get(r["confidence"] or "none", 0) + 1
    return {
        "problems": n,
        "parse_success_rate": sum(r["parse_ok"] for r in rows) / n,
        "answer_found_rate": sum(r["answer"] is not None for r in rows) / n,
        # NOTE: every check run on the traces (the model's and, after, the extracted ones).
        "verification_pass_rate": (passed + ext_passed) / (items + ext) if items + ext else 0.0,
        "verification_items": items + ext,
        "model_check_pass_rate": passed / items if items else 0.0,
        "model_check_items": items,
        "model_checks_not_run": not_run,
        "all_checks_pass_rate": sum(r["model_checks"] > 0 and r["model_checks"] == r["model_checks_passed"]
                                    for r in rows) / n,
        "accuracy": sum(r["correct"] for r in rows) / n,
        "injected_rate": sum(r["injected"] > 0 for r in rows) / n,
        "parse_rate_without_fallback": sum(r.get("first_parse_ok", r["parse_ok"]) for r in rows) / n,
        "rewritten": sum(r.get("rewritten", False) for r in rows),
        # Share of traces filed active without review although their answer is wrong (target 0),
        # under the row's own filing rule, and under the old rule applied to the same traces.
        "unreviewed_wrong": sum(r.get("tier") == "active" and not r["correct"] for r in rows) / n,
        "unreviewed_wrong_before": sum(r.get("tier_before") == "active" and not r["correct"] for r in rows) / n,
        "unreviewed_wrong_after": sum(r.get("tier_after") == "active" and not r["correct"] for r in rows) / n,
        "active_share": sum(r.get("tier") == "active" for r in rows) / n,
        "extracted_pass_rate": ext_passed / ext if ext else 0.0,
        "extracted_items": ext,
        "confidence": conf,
        "generations": sum(not r.get("replayed", False) for r in rows),
        "mean_latency_s": sum(r["latency_s"] for r in rows) / n,
        "mean_completion_tokens": sum(r["completion_tokens"] for r in rows) / n,
    }


# NOTE: the config of each mode; "before" also files by tier_before (see the module docstring).
MODES: dict[str, dict[str, Any]] = {
    "before": {"extracted_checks": False, "hybrid": False, "parse_fallback": False},
    "after": {},
}


class _Memo:
    """An engine that answers a prompt it has answered before (same messages, same parameters)
    from memory. Every generation here is at temperature 0 with a fixed seed, so the model would
    write the same reply again; the memo only saves the minutes. ``replayed`` counts the reuses."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._seen: dict[str, Any] = {}
        self.replayed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def chat(self, messages: Any, params: Any) -> Any:
        key = json.dumps([[m.role, m.content] for m in messages]) + params.model_dump_json()
        if key in self._seen:
            self.replayed += 1
            return self._seen[key]
        out = self._seen[key] = await self._engine.chat(messages, params)
        return out


def tier_before(confidence: str | None, label: str | None = None) -> str:
    """The filing rule before review-before-reuse (the baseline of the report): only a trace
    labelled wrong or of low confidence waited in review; every other one went active."""
    return "review" if label == "wrong" or (label is None and confidence == "low") else "active"


async def _run_condition(engine: Any, embed: Any, problems: list[dict[str, Any]], *, inject: bool,
                         max_tokens: int, constrained: bool, progress: Any,
                         rows_file: Path | None = None, fallback: bool = False,
                         mode: str = "after") -> list[dict[str, Any]]:
    from recallserve.serve.experience import ExperienceConfig, ExperienceRecord, ExperienceService
    from recallserve.serve.experience._eval_problems import RULES, SEEDS

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="recallserve-eval-exp-") as tmp:
        cfg = ExperienceConfig(data_dir=Path(tmp), rules=RULES, max_tokens=max_tokens, constrain_json=constrained,
                               **MODES[mode])
        # NOTE: the eval has one model: with the fallback it is also the rewriter (in a cluster
        # the router model is).
        service = ExperienceService(cfg, embed=embed, rewriter=engine if fallback else None)
        try:
            if inject:
                for seed in SEEDS:
                    rec = ExperienceRecord.model_validate(seed)
                    rec.metadata.source_model = engine.model_name
                    view = await service.create("eval", rec)
                    if view.record.outcome.confidence != "high":
                        raise UserError(f"seed {rec.context.raw_text!r} does not verify: fix the fixture")
            for prob in problems:
                t0 = time.perf_counter()
                replayed_before = getattr(engine, "replayed", 0)
                out = await service.produce("eval", engine, prob["question"], domain=prob["domain"],
                                            topic=prob["topic"], inject=inject, store=False)
                latency = time.perf_counter() - t0
                checks = out.experience.record.verification if out.experience else []
                model_checks = [c for c in checks
                                if not c.notes.startswith("required by") and c.input.get("source") != "context"]
                extracted = [c for c in checks if c.input.get("source") == "context"]
                correct = is_correct(out.answer, prob["expected"])
                conf = out.experience.record.outcome.confidence if out.experience and out.answer else None
                tier_after = out.experience.tier if out.experience and out.answer else None
                old = tier_before(conf) if out.answer else None
                rows.append({
                    "mode": mode, "condition": "with" if inject else "without", "id": prob["id"],
                    "domain": prob["domain"], "expected": prob["expected"], "answer": out.answer, "correct": correct,
                    "parse_ok": out.report.ok, "format": out.report.format, "problems": out.report.problems,
                    "first_parse_ok": out.first_report.ok if out.first_report is not None else out.report.ok,
                    "rewritten": out.first_report is not None,
                    "tier": old if mode == "before" else tier_after,
                    "tier_before": old, "tier_after": tier_after,
                    "error_tags": out.experience.record.evaluation.error_tags if out.experience else [],
                    "extracted_checks": len(extracted), "extracted_passed": sum(c.status == "pass" for c in extracted),
                    "model_checks": len(model_checks),
                    "model_checks_passed": sum(c.status == "pass" for c in model_checks),
                    "model_checks_not_run": sum(c.status == "not_run" for c in model_checks),
                    "checks": [{"type": c.type, "target": c.target, "status": c.status, "notes": c.notes}
                               for c in checks],
                    "confidence": conf,
                    "injected": len(out.injected), "required_checks": out.required_checks,
                    "replayed": getattr(engine, "replayed", 0) > replayed_before,
                    "latency_s": round(latency, 2), "prompt_tokens": out.prompt_tokens,
                    "completion_tokens": out.completion_tokens, "raw_text": out.raw_text,
                })
                if rows_file is not None:  # NOTE: row by row, so an interrupted run keeps its results
                    with rows_file.open("a") as fh:
                        fh.write(json.dumps(rows[-1]) + "\n")
                progress.update(1)
        finally:
            service.close()
    return rows


def run(args: argparse.Namespace) -> int:
    """Run the evaluation; prints a table and optionally writes JSON."""
    # NOTE: passive OpenMP waits so llama.cpp threads sleep instead of spinning (shared CPUs);
    # must be set before llama.cpp's OpenMP runtime starts, i.e. before the imports below.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from tqdm import tqdm

    from recallserve.deployments.engines import LlamaCppConfig, build_engine
    from recallserve.deployments.models import ModelSpec, default_spec
    from recallserve.memory_shards.embedders import MiniLMEmbedder
    from recallserve.serve.engine import EngineError

    if args.max_tokens < 32:
        raise UserError("--max-tokens: must be >= 32")
    if args.threads < 1:
        raise UserError("--threads: must be >= 1")
    problems = _load_problems(args.problems, args.limit, args.ids)
    replay: _Replay | None = None
    if args.replay:
        replay, problems = _load_replay(args.replay, problems)
        engine: Any = replay
    else:
        spec = default_spec() if args.model is None else ModelSpec.model_validate(args.model)
        try:
            engine = build_engine(LlamaCppConfig(model=spec, n_threads=args.threads, n_ctx=4096))
        except EngineError as exc:
            raise UserError(f"--model: {exc}") from None
    embedder = MiniLMEmbedder()
    memo: Any = _Memo(engine) if replay is None else replay
    conditions = {"both": [False, True], "without": [False], "with": [True]}[args.condition]
    modes = {"both": ["after", "before"], "before": ["before"], "after": ["after"]}[args.mode]
    rows: list[dict[str, Any]] = []
    summaries: dict[str, Any] = {}
    rows_file = None if args.out is None else args.out.with_suffix(".rows.jsonl")
    if rows_file is not None:
        rows_file.parent.mkdir(parents=True, exist_ok=True)
        rows_file.write_text("")
    started = time.perf_counter()
    with tqdm(total=len(problems) * len(conditions) * len(modes), desc="eval experiences", unit="problem") as bar:
        for inject in conditions:
            for mode in modes:
                if replay is not None:
                    replay.cell(mode, inject)
                cond_rows = asyncio.run(_run_condition(memo, embedder.embed, problems, inject=inject,
                                                       max_tokens=args.max_tokens, constrained=args.constrained,
                                                       progress=bar, rows_file=rows_file,
                                                       fallback=mode == "after" and not args.no_fallback, mode=mode))
                rows += cond_rows
                summaries[f"{mode}/{'with' if inject else 'without'}"] = _summary(cond_rows)
    asyncio.run(engine.close())
    print(f"model: {engine.model_name}  problems: {len(problems)}  max_tokens: {args.max_tokens}"
          f"  constrained: {args.constrained}  generations reused: {memo.replayed}")
    cols = ("unreviewed_wrong", "verification_pass_rate", "model_check_pass_rate", "parse_rate_without_fallback",
            "parse_success_rate", "accuracy", "mean_latency_s")
    heads = ("unrev.wrong", "verif.pass", "model.pass", "parse(no fb)", "parse", "accuracy", "latency_s")
    print(f"{'mode/condition':<16}" + "".join(f"{h:>14}" for h in heads))
    for name, s in summaries.items():
        print(f"{name:<16}" + "".join(f"{s[c]:>14.3f}" for c in cols))
    for name, s in summaries.items():
        print(f"{name}: verification items {s['verification_items']} (extracted {s['extracted_items']}, pass "
              f"{s['extracted_pass_rate']:.3f}; model's not run {s['model_checks_not_run']}), confidence "
              f"{s['confidence']}, {s['rewritten']} rewritten, active {s['active_share']:.3f}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"model": engine.model_name, "max_tokens": args.max_tokens,
                                        "constrained": args.constrained, "threads": args.threads,
                                        "replayed_from": args.replay,
                                        "problem_ids": [p["id"] for p in problems], "modes": MODES,
                                        "generations_reused": memo.replayed,
                                        "wall_s": round(time.perf_counter() - started, 1),
                                        "summary": summaries, "rows": rows}, indent=1))
        print(f"wrote {args.out}")
    return 0
