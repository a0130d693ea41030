"""Offline check of Chinese history questions over the English demo records, with and without the query's gloss.

For every Chinese history question (``HISTORY_PATTERN``) of the registered sets whose note names its precedent
ticket (T-xxxx): where that ticket ranks in the turn's recall (``recall_memories``, ``RecallConfig()``
defaults, its parts and relevance cut) and in a ``memory_search`` of the question (the served memory
service's search, k = 5), once with the hybrid search's English gloss of Chinese queries
(``RetrievalParams.gloss_weight``, memory_shards.retrieval.glossary) at its shipped weight and once with it
off. Counts: first, in the first three, found at all. No chat model, no Ray; about a minute.

Usage (from the repo root)::

    python -m loadtests.crosslingual_check [--skip SET ...]
"""

from __future__ import annotations

import argparse
import asyncio
import re

from recallserve.serve.agent.demo import DemoWorld, load_questions
from recallserve.serve.agent.demo._memory import LocalMemory
from recallserve.serve.agent.demo.questions import QUESTION_SETS
from recallserve.serve.agent.grounding import HISTORY_PATTERN
from recallserve.serve.language import language_of
from recallserve.serve.memory import is_derived
from recallserve.serve.turn import RecallConfig, recall_memories

_TICKET = re.compile(r"T-\d{4}")
#: Sets that hold others (counted once through their parts).
_UNIONS = ("all", "compound_all")


def _rank(source_ids: list[str], named: set[str]) -> int | None:
    return next((i for i, s in enumerate(source_ids) if s.rsplit(":", 1)[-1] in named), None)


async def _run(skip: set[str]) -> dict[str, list[int | None]]:
    memory = LocalMemory()
    await memory.write("demo", DemoWorld().memories())
    shipped = memory.retriever.params
    questions = []
    seen: set[str] = set()
    for name in QUESTION_SETS:
        if name in skip or name in _UNIONS:
            continue
        for q in load_questions(name):
            named = set(_TICKET.findall(q.get("note") or ""))
            if q["q"] in seen or language_of(q["q"]) != "zh" or not HISTORY_PATTERN.search(q["q"]) or not named:
                continue
            seen.add(q["q"])
            questions.append((q["q"], named))
    out: dict[str, list[int | None]] = {}
    for label, weight in (("gloss on", shipped.gloss_weight), ("gloss off", 0.0)):
        memory.retriever.params = shipped.model_copy(update={"gloss_weight": weight})
        for text, named in questions:
            hits, _ = await recall_memories(memory, "demo", text, RecallConfig())
            out.setdefault(f"recall, {label}", []).append(_rank([h.source_id for h in hits if not is_derived(h)], named))
            found = await memory.search("demo", text, 5)
            out.setdefault(f"memory_search, {label}", []).append(_rank([h.source_id for h in found], named))
    memory.retriever.params = shipped
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip", nargs="*", default=[], help="question sets to leave out (e.g. a blind set not yet run)")
    args = p.parse_args(argv)
    for label, ranks in asyncio.run(_run(set(args.skip))).items():
        print(f"{label:26s} n={len(ranks):3d}  first {sum(r == 0 for r in ranks):3d}  "
              f"top 3 {sum(r is not None and r < 3 for r in ranks):3d}  found {sum(r is not None for r in ranks):3d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
