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
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from recallserve.serve.agent.demo._memory import LocalMemory
from recallserve.serve.agent.demo.questions import load_questions
from recallserve.serve.agent.demo.scenario import load_demo_memories
from recallserve.serve.turn import RecallConfig, recall_memories

_SENTENCES = re.compile(r"(?<=[.!?])\s+")
OUT = Path(__file__).parent / "results" / "compound-recall-cpu-local.md"


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


if __name__ == "__main__":
    asyncio.run(main())
