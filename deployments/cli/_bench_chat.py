"""``recallserve bench chat``: chat turns through the running cluster, timed part by part, and the
raw engine in process on the same questions (table + JSON rows).

Through the cluster (``--url``, loopback only) each prompt is sent as a streaming request with
``stream_options.include_usage``; per turn the report gives

* ``wall_s``: request sent -> last byte; ``ttft_s``: request sent -> first content delta;
* ``engine_calls``, ``prompt_tokens``, ``cached_tokens`` (reused from the engines' prefix caches,
  not evaluated), ``evaluated_tokens = prompt_tokens - cached_tokens`` and ``completion_tokens``,
  summed over the turn's engine calls (``recallserve.agent.usage`` of the last chunk);
* ``engine_s``: the time the engines themselves reported working on those calls;
* ``overhead = (wall_s - engine_s) / engine_s``: what the pipeline (routing, recall, embedding,
  context, Ray hops, queueing for an engine) adds over the engine time of the same turn.

With ``--raw`` the profile's reasoner model is also loaded in this process (llama.cpp) and asked
each question as a plain two-message prompt (the pipeline's system prompt, the question), streamed:
the floor a user would get from the bare engine on this machine. The raw prompt is not the
pipeline's (no tools, no memories), so compare ``engine_s`` and the overhead, not the wall times
of tool turns.

Example::

    recallserve up &                       # wait for "ready"
    recallserve bench chat --url http://127.0.0.1:8000 --repeats 3 --raw
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from recallserve.deployments.cli import UserError, add_profile_arguments
from recallserve.deployments.cli._bench_args import add_out_argument, add_repeats_argument, check_range, write_report
from recallserve.deployments.cli._cluster_client import add_cluster_arguments, cluster_base, sync_client

NAME = "chat"

#: (name, question, max_tokens): a direct answer, a one-tool question, the demo's flicker question
#: (text only) and the demo question with its photo (``demo-photo``: the question text is
#: :data:`recallserve.serve.agent.demo.DEMO_QUESTION`, sent with the demo photo; through the cluster only).
PROMPTS: list[tuple[str, str, int]] = [
    ("direct", "Name one colour.", 40),
    ("one-tool", "What is the status of order 104333?", 120),
    ("demo", "My BrewMaster from batch B-2320 has a display that flickers and sometimes goes blank. Has anyone "
             "had this before, what fixed it, and who supplied the display for that batch?", 200),
    ("demo-photo", "", 256),
]
PHOTO_PROMPT = "demo-photo"


def _user_content(name: str, question: str) -> Any:
    """The user message's content: the question, or the demo question and photo for ``demo-photo``."""
    if name != PHOTO_PROMPT:
        return question
    from recallserve.serve.agent.demo import DEMO_QUESTION, demo_photo_data_url

    return [{"type": "text", "text": DEMO_QUESTION}, {"type": "image_url", "image_url": {"url": demo_photo_data_url()}}]


@dataclass
class TurnRow:
    """One timed turn (see the module docstring for each figure)."""

    path: str
    prompt: str
    repeat: int
    status: int
    wall_s: float
    ttft_s: float | None
    engine_calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    evaluated_tokens: int = 0
    completion_tokens: int = 0
    engine_s: float = 0.0
    overhead: float | None = None
    tools: str = ""
    answer: str = ""


def _cluster_turn(http: Any, model: str, name: str, question: str, max_tokens: int, repeat: int) -> TurnRow:
    body = {"model": model, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": max_tokens,
            "temperature": 0, "messages": [{"role": "user", "content": _user_content(name, question)}]}
    start = time.perf_counter()
    ttft, meta, pieces, status = None, {}, [], 0
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        status = r.status_code
        if status != 200:
            r.read()
            return TurnRow("cluster", name, repeat, status, time.perf_counter() - start, None,
                           answer=r.text[:200])
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    pieces.append(text)
            meta = chunk.get("recallserve") or meta
    wall = time.perf_counter() - start
    agent = meta.get("agent") or {}
    usage = agent.get("usage") or {}
    engine_s = float(usage.get("engine_ms", 0.0)) / 1e3
    row = TurnRow("cluster", name, repeat, status, wall, ttft, engine_calls=int(usage.get("engine_calls", 0)),
                  prompt_tokens=int(usage.get("prompt_tokens", 0)), cached_tokens=int(usage.get("cached_tokens", 0)),
                  completion_tokens=int(usage.get("completion_tokens", 0)), engine_s=engine_s,
                  tools=",".join(c.get("name", "?") for c in agent.get("tool_calls") or []),
                  answer="".join(pieces)[:200])
    row.evaluated_tokens = row.prompt_tokens - row.cached_tokens
    row.overhead = (wall - engine_s) / engine_s if engine_s > 0 else None
    return row


async def _raw_turns(config: Any, repeats: int) -> list[TurnRow]:
    from recallserve.deployments.engines import build_engine
    from recallserve.serve.engine import ChatDelta, ChatMessage, GenerationParams

    if config.reasoner.engine.kind != "llama_cpp":
        raise UserError("--raw: the profile's reasoner is not a llama.cpp model")
    engine = build_engine(config.reasoner.engine)  # NOTE: the role's own settings: model, n_ctx, threads
    rows = []
    try:
        for repeat in range(repeats):
            for name, question, max_tokens in PROMPTS:
                if name == PHOTO_PROMPT:
                    continue  # NOTE: the raw engine is text only
                messages = [ChatMessage(role="system", content=config.chat.system_prompt),
                            ChatMessage(role="user", content=question)]
                start, ttft, pieces, last = time.perf_counter(), None, [], None
                async for delta in engine.stream(messages, GenerationParams(max_tokens=max_tokens, temperature=0)):
                    if delta.text:
                        ttft = ttft if ttft is not None else time.perf_counter() - start
                        pieces.append(delta.text)
                    last = delta
                wall = time.perf_counter() - start
                final = last or ChatDelta()  # NOTE: an engine's stream always ends with the counting delta
                row = TurnRow("raw engine", name, repeat, 200, wall, ttft, engine_calls=1,
                              prompt_tokens=final.prompt_tokens or 0, cached_tokens=final.cached_tokens or 0,
                              completion_tokens=final.completion_tokens or 0,
                              engine_s=(final.engine_ms or 0.0) / 1e3, answer="".join(pieces)[:200])
                row.evaluated_tokens = row.prompt_tokens - row.cached_tokens
                rows.append(row)
    finally:
        await engine.close()
    return rows


def _median(rows: list[TurnRow], attr: str) -> float | None:
    values = [getattr(r, attr) for r in rows if getattr(r, attr) is not None]
    return statistics.median(values) if values else None


def summarise(rows: list[TurnRow]) -> list[dict[str, Any]]:
    """Medians per (path, prompt) over the successful repeats; failures counted."""
    out = []
    for path in dict.fromkeys(r.path for r in rows):
        for name, _q, _m in PROMPTS:
            group = [r for r in rows if r.path == path and r.prompt == name]
            ok = [r for r in group if r.status == 200]
            if not group:
                continue
            out.append({"path": path, "prompt": name, "turns": len(group), "failed": len(group) - len(ok),
                        **{k: _median(ok, k) for k in ("wall_s", "ttft_s", "engine_s", "overhead", "engine_calls",
                                                        "prompt_tokens", "cached_tokens", "evaluated_tokens",
                                                        "completion_tokens")}})
    return out


def render(summary: list[dict[str, Any]]) -> str:
    """The summary as a markdown table."""

    def f(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    lines = ["| path | prompt | turns (failed) | wall p50 | TTFT p50 | engine | overhead | calls | prompt tok "
             "| cached | evaluated | generated |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['path']} | {s['prompt']} | {s['turns']} ({s['failed']}) | {f(s['wall_s'], '.2f')} s "
                     f"| {f(s['ttft_s'], '.2f')} s | {f(s['engine_s'], '.2f')} s | {f(s['overhead'], '.0%')} "
                     f"| {f(s['engine_calls'], '.0f')} | {f(s['prompt_tokens'], '.0f')} | {f(s['cached_tokens'], '.0f')} "
                     f"| {f(s['evaluated_tokens'], '.0f')} | {f(s['completion_tokens'], '.0f')} |")
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench chat``."""
    p = subparsers.add_parser(NAME, help="chat turns through the running cluster (and the raw engine), timed")
    add_profile_arguments(p)
    add_cluster_arguments(p)
    add_repeats_argument(p, 3, "turns per prompt (1-20)")
    p.add_argument("--raw", action="store_true", help="also time the raw reasoner engine in this process")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one turn may take (default 600)")
    add_out_argument(p, NAME)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Time the prompts through the cluster (then the raw engine), print the table, write JSON."""
    import asyncio

    from recallserve.deployments.config import load_config

    check_range("repeats", args.repeats, 1, 20)
    base = cluster_base(args.url)
    config = load_config(str(args.config) if args.config else (args.profile or "cpu-local"))
    rows: list[TurnRow] = []
    # NOTE: the raw SSE stream of the client's httpx client: the bench times the first and each chunk.
    with sync_client(base, args.key, args.timeout) as rs:
        http = rs.http
        for repeat in range(args.repeats):
            for name, question, max_tokens in PROMPTS:
                row = _cluster_turn(http, config.chat.model_name, name, question, max_tokens, repeat)
                print(f"cluster {name} #{repeat + 1}: {row.status} in {row.wall_s:.1f} s "
                      f"({row.engine_calls} engine calls, {row.engine_s:.1f} s in engines)", flush=True)
                rows.append(row)
    if args.raw:
        rows += asyncio.run(_raw_turns(config, args.repeats))
    summary = summarise(rows)
    print(render(summary))
    write_report(args, {"url": base, "profile": config.name, "repeats": args.repeats,
                        "summary": summary, "turns": [asdict(r) for r in rows]})
    return 0 if all(r.status == 200 for r in rows) else 1
