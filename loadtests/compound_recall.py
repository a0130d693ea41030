"""Recall of compound questions against their single-part questions (issue 40), on the demo world.

For every question of the compound sets (``recallserve eval agent --questions compound_all``) that
asks two or more things, the turn's recall (:func:`recallserve.serve.turn.recall_memories`, the
function ``ChatPipeline.build_turn`` calls for ``POST /v1/chat/completions``; demo memories in the
served memory service over in-process shards, MiniLM) is run for:

* the compound question, with the recall's parts (``max_parts`` 4, the default) and without
  (``max_parts`` 1, one search of the whole message: the recall before issue 40);
* each single-part question: the statements of the message plus one of its question sentences
  (as the issue asked the flicker question "without the last sentence").

A question's **needed** records are the union of what its single parts recall; the figure is how
many of them each compound recall holds (target: all, i.e. at least as good as the best single part).

Run (loads MiniLM; under the shared lock): ``python -m recallserve.loadtests.compound_recall`` or
``python loadtests/compound_recall.py``; writes ``loadtests/results/compound-recall-cpu-local.md``.

``--http``: the same comparison through the HTTP API, as a user meets it: the ingress app in one
process (the served memory service over in-process hybrid shards with MiniLM, the turn-trace store,
the chat pipeline with its default recall settings, the tiny real model SmolLM2-135M writing a
one-token answer: recall runs before the model, the model does not change it); the demo's records
go in with ``POST /v1/memories``, every question and single part is asked with ``POST
/v1/chat/completions``, and the recalled source ids are read from ``GET /v1/turns/{id}``. Besides the
union figure it counts each part's **first record**: the first record its turn recalled that names
an id or code the part names (its first record when it names none; none when no record names its
code). Writes ``loadtests/results/compound-recall-http-cpu-local.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from recallserve.serve.agent.demo._memory import LocalMemory
from recallserve.serve.agent.demo.questions import load_questions
from recallserve.serve.agent.demo.scenario import load_demo_memories
from recallserve.serve.turn import RecallConfig, recall_memories

_SENTENCES = re.compile(r"(?<=[.!?])\s+")
OUT = Path(__file__).parent / "results" / "compound-recall-cpu-local.md"
OUT_HTTP = Path(__file__).parent / "results" / "compound-recall-http-cpu-local.md"
KEY = {"Authorization": "Bearer sk-demo"}


def single_parts(question: str) -> list[str]:
    """The statements of ``question`` plus one of its question sentences, for each question sentence."""
    sentences = [s.strip() for s in _SENTENCES.split(question) if s.strip()]
    stated = [s for s in sentences if not s.endswith("?")]
    return [" ".join([*stated, s]) for s in sentences if s.endswith("?")]


async def main() -> None:
    memory = LocalMemory()
    await load_demo_memories(memory)
    lines = ["| set | # | needed (union of single parts) | whole message, one search | with parts | question |",
             "|---|---|---|---|---|---|"]
    held = {"one": 0, "parts": 0, "needed": 0}
    for name in ("compound", "compound_holdout"):
        for n, q in enumerate(load_questions(name), 1):
            parts = single_parts(q["q"])
            if len(parts) < 2:
                continue
            needed: set[str] = set()
            for part in parts:
                hits, _ = await recall_memories(memory, "eval", part, RecallConfig())
                needed |= {h.source_id for h in hits}
            one = {h.source_id for h in (await recall_memories(memory, "eval", q["q"], RecallConfig(max_parts=1)))[0]}
            with_parts = {h.source_id for h in (await recall_memories(memory, "eval", q["q"], RecallConfig()))[0]}
            held["needed"] += len(needed)
            held["one"] += len(needed & one)
            held["parts"] += len(needed & with_parts)
            lines.append(f"| {name} | {n} | {', '.join(sorted(needed)) or '-'} | {len(needed & one)}/{len(needed)} | "
                         f"{len(needed & with_parts)}/{len(needed)} | {q['q'][:70]} |")
    summary = (f"Needed records recalled: whole message, one search {held['one']}/{held['needed']}; "
               f"with parts {held['parts']}/{held['needed']}.")
    OUT.write_text("# Compound questions: recall against their single parts (issue 40)\n\n"
                   "`python loadtests/compound_recall.py` (MiniLM, demo world, the chat recall's function).\n\n"
                   + summary + "\n\n" + "\n".join(lines) + "\n")
    print(summary)
    print("\n".join(lines))


def _http_app(root: Path) -> tuple[Any, Any]:
    """(the app, its memory service): memory API, turn traces and the plain chat pipeline (tiny real model)."""
    from recallserve.deployments.engines import LlamaCppConfig, LlamaCppEngine
    from recallserve.serve.agent.demo._memory import LocalMemory
    from recallserve.serve.api.app import create_app
    from recallserve.serve.api.auth import Authenticator
    from recallserve.serve.memory_api import build_router
    from recallserve.serve.pipeline import ChatPipeline, PipelineSettings
    from recallserve.serve.traces import TraceRecorder, TraceStore
    from recallserve.serve.traces import build_router as build_turn_router

    memory = LocalMemory()
    auth = Authenticator({"sk-demo": "demo"})
    engine = LlamaCppEngine(LlamaCppConfig(model="smollm2-135m-instruct-q4_1", n_ctx=4096, n_threads=1))
    traces = TraceRecorder(TraceStore(root / "turns.sqlite3"))
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), memory=memory, traces=traces)
    routers = [build_router(memory, auth), build_turn_router(traces.store, auth)]
    return create_app(pipeline, auth, routers=routers), memory


def _recalled(client: Any, question: str) -> list[str]:
    """The source ids the turn answering ``question`` recalled (its trace), in the recall's order."""
    r = client.post("/v1/chat/completions", headers=KEY, json={
        "model": "recallserve", "user": "u1", "max_tokens": 1, "messages": [{"role": "user", "content": question}]})
    r.raise_for_status()
    turn_id = r.json()["recallserve"]["request_id"]
    deadline = time.monotonic() + 30
    while (t := client.get(f"/v1/turns/{turn_id}", headers=KEY)).status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no trace for turn {turn_id}: {t.text}")
        time.sleep(0.05)
    trace = t.json()
    if trace["memory_error"]:
        raise RuntimeError(f"recall failed for a turn: {trace['memory_error']}")
    return [m["source_id"] for m in trace["memories"]]


def main_http() -> None:
    from fastapi.testclient import TestClient

    from recallserve.serve.agent.demo.world import DemoWorld
    from recallserve.serve.agent.grounding import asked_ids

    world = DemoWorld().memories()
    texts = {m.source_id: m.text for m in world}
    lines = ["| set | # | whole message: recalled | parts' first records (held / needed) | union of parts held | question |",
             "|---|---|---|---|---|---|"]
    held = {"first": 0, "first_needed": 0, "union": 0, "union_needed": 0}
    with tempfile.TemporaryDirectory() as root:
        app, memory = _http_app(Path(root))
        with TestClient(app) as client:
            r = client.post("/v1/memories", headers=KEY, json={"memories": [
                {"text": m.text, "source_id": m.source_id, "kind": m.kind} for m in world]})
            r.raise_for_status()
            for name in ("compound", "compound_holdout"):
                for n, q in enumerate(load_questions(name), 1):
                    parts = single_parts(q["q"])
                    if len(parts) < 2:
                        continue
                    whole = _recalled(client, q["q"])
                    firsts: set[str] = set()
                    union: set[str] = set()
                    for part in parts:
                        recalled = _recalled(client, part)
                        ids = asked_ids(part)
                        firsts |= set([s for s in recalled if any(i in texts[s] for i in ids)][:1] if ids else recalled[:1])
                        union |= set(recalled)
                    got_first, got_union = len(firsts & set(whole)), len(union & set(whole))
                    held["first"] += got_first
                    held["first_needed"] += len(firsts)
                    held["union"] += got_union
                    held["union_needed"] += len(union)
                    lines.append(f"| {name} | {n} | {', '.join(whole) or '0 memories'} | {got_first}/{len(firsts)} "
                                 f"({', '.join(sorted(firsts)) or '-'}) | {got_union}/{len(union)} | {q['q'][:60]} |")
        for shard_client in memory.coordinator.shards:
            shard_client.shard.close()
    summary = (f"Parts' first records held by the compound question's recall: {held['first']}/{held['first_needed']}; "
               f"union of everything the parts recalled: {held['union']}/{held['union_needed']}.")
    OUT_HTTP.write_text("# Compound questions through the HTTP trace: recall against their single parts (issue 40)\n\n"
                        "`python loadtests/compound_recall.py --http` (MiniLM, demo records posted with "
                        "`POST /v1/memories`, each turn asked with `POST /v1/chat/completions`, recalled ids read "
                        "from `GET /v1/turns/{id}`; default chat recall settings).\n\n" + summary + "\n\n"
                        + "\n".join(lines) + "\n")
    print(summary)
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--http", action="store_true", help="through the HTTP API and the turn traces")
    if parser.parse_args().http:
        main_http()
    else:
        asyncio.run(main())
