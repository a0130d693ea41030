"""Offline check of which record a history question gets quoted (``recallserve.serve.agent.grounding.record_note``).

For every history question (``HISTORY_PATTERN``) of every registered set that either has a precedent (its
note names the ticket, T-xxxx) or asks about a fault no record has (a fact asks for "not found" / "no
record" / "没有找到"): the turn's real recall over the demo records (the served memory service in process,
``RecallConfig()`` defaults, its parts and relevance cut), the fault-word check over what it found
(``unfound_topic``, the tools' descriptions as known words), and the record ``record_note`` quotes after an
empty answer. Counts, per language and whether the question names ids or codes: precedents quoted right
(the named ticket), quoted wrong, not quoted; absent faults quoted (always wrong). The turn's tool
observations and ``memory_search`` results are not part of it (the Chinese questions' recall finds little:
the default embedder is English). No chat model, no Ray; about a minute (the embedder).

Usage (from the repo root)::

    python -m loadtests.record_quote_check [--skip SET ...]
"""

from __future__ import annotations

import argparse
import asyncio
import re

from recallserve.serve.agent import default_registry
from recallserve.serve.agent.demo import DemoWorld, load_questions
from recallserve.serve.agent.demo._memory import LocalMemory
from recallserve.serve.agent.demo.questions import QUESTION_SETS
from recallserve.serve.agent.grounding import CLOSE_COSINE, HISTORY_PATTERN, Search, asked_ids, record_note, unfound_topic
from recallserve.serve.language import language_of
from recallserve.serve.memory import is_derived
from recallserve.serve.turn import RecallConfig, recall_memories

_ABSENT = ("not found", "no record", "没有找到")
_TICKET = re.compile(r"T-\d{4}")
#: Sets that hold others (counted once through their parts).
_UNIONS = ("all", "compound_all")


async def _run(skip: set[str]) -> dict[tuple[str, str, str], list[int]]:
    memory = LocalMemory()
    await memory.write("demo", DemoWorld().memories())
    known = [t.description for t in default_registry(demo=True).all()]
    config = RecallConfig()
    seen: set[str] = set()
    out: dict[tuple[str, str, str], list[int]] = {}  # (lang, kind, ids) -> n, quoted right, quoted wrong, none
    for name in QUESTION_SETS:
        if name in skip or name in _UNIONS:
            continue
        for q in load_questions(name):
            text = q["q"]
            if text in seen or not HISTORY_PATTERN.search(text):
                continue
            seen.add(text)
            absent = any(isinstance(f, list) and any(a in f for a in _ABSENT) for f in q["facts"])
            named = set(_TICKET.findall(q.get("note") or ""))
            if not absent and not named:
                continue
            hits, _ = await recall_memories(memory, "demo", text, config)
            sources = [h for h in hits if not is_derived(h)]
            found = Search("recall", True, tuple(h.text for h in sources),
                           tuple(h.text for h in sources if h.similarity >= CLOSE_COSINE))
            unfound = unfound_topic([found], text, known)
            note = record_note(text, [(h.source_id, h.text) for h in sources], "", known=known, unfound=unfound,
                               close=found.close)
            quoted = set(_TICKET.findall(re.split(r"[:：]", note, maxsplit=1)[0])) if note else set()
            key = ("zh" if language_of(text) == "zh" else "en", "absent" if absent else "precedent",
                   "names ids" if asked_ids(text) else "no ids")
            row = out.setdefault(key, [0, 0, 0, 0])
            row[0] += 1
            if not note:
                row[3] += 1
            elif not absent and quoted & named:
                row[1] += 1
            else:
                row[2] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip", nargs="*", default=[], help="question sets to leave out (e.g. a blind set not yet run)")
    args = p.parse_args(argv)
    for (lang, kind, ids), (n, right, wrong, none) in sorted(asyncio.run(_run(set(args.skip))).items()):
        print(f"{lang} {kind:9s} {ids:9s} n={n:3d}  quoted right {right:3d}  quoted wrong {wrong:3d}  not quoted {none:3d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
