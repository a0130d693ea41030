"""Offline check of ``recallserve.serve.agent.grounding.CLOSE_COSINE`` on the question sets.

For every history question (``HISTORY_PATTERN``) of every registered set: the highest cosine (the
default embedder, MiniLM) between any of its recall queries (``question_parts``: the whole question and,
for a compound one, each sentence) and any demo record (tickets, manual sections), and which record
that is. A question about a fault no record has (a fact asks for "not found" / "no record" / "没有找到")
must stay below ``CLOSE_COSINE``: at or above it, its closest record would be quoted as its precedent and
the fault-word check would not call it unfound. For questions with a precedent, how many come at or
above the threshold, and whether their closest record is the ticket their note names. Prints one line
per set, the totals per language and the highest cosine of an absent fault. No Ray, no chat model;
seconds after the embedder loads.

Usage (from the repo root)::

    python -m loadtests.fault_close_check [--cosine 0.72]
"""

from __future__ import annotations

import argparse
import re

import numpy as np

from recallserve.memory_shards.embedders import MiniLMEmbedder
from recallserve.serve.agent.demo import DemoWorld, load_questions
from recallserve.serve.agent.demo.questions import QUESTION_SETS
from recallserve.serve.agent.grounding import CLOSE_COSINE, HISTORY_PATTERN
from recallserve.serve.language import language_of
from recallserve.serve.turn import question_parts

_ABSENT = ("not found", "no record", "没有找到")
MAX_PARTS = 4


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cosine", type=float, default=CLOSE_COSINE, help="the threshold to check (default: the product's)")
    args = p.parse_args(argv)
    memories = DemoWorld().memories()
    embedder = MiniLMEmbedder()
    records = embedder.embed([m.text for m in memories])
    seen: set[str] = set()
    totals: dict[str, list[int]] = {}  # lang -> absent, absent at/above, precedent, at/above, of those the named ticket
    top_absent = -1.0
    for name in QUESTION_SETS:
        counts = [0, 0, 0, 0, 0]
        for q in load_questions(name):
            if q["q"] in seen or not HISTORY_PATTERN.search(q["q"]):
                continue
            seen.add(q["q"])
            absent = any(isinstance(f, list) and any(a in f for a in _ABSENT) for f in q["facts"])
            cosines = embedder.embed(question_parts(q["q"], MAX_PARTS)) @ records.T
            best = float(cosines.max())
            closest = memories[int(np.unravel_index(cosines.argmax(), cosines.shape)[1])].source_id
            named = set(re.findall(r"T-\d{4}", q.get("note") or ""))
            lang = "zh" if language_of(q["q"]) == "zh" else "en"
            row = totals.setdefault(lang, [0, 0, 0, 0, 0])
            if absent:
                top_absent = max(top_absent, best)
                for c in (counts, row):
                    c[0] += 1
                    c[1] += best >= args.cosine
            else:
                for c in (counts, row):
                    c[2] += 1
                    c[3] += best >= args.cosine
                    c[4] += best >= args.cosine and closest.rsplit(":", 1)[-1] in named
        if counts[0] or counts[2]:
            print(f"{name:20s} absent at/above {counts[1]}/{counts[0]}; with a precedent at/above {counts[3]}/{counts[2]} "
                  f"(closest = the named ticket: {counts[4]})")
    for lang, (a, aa, pr, pa, named_ok) in sorted(totals.items()):
        print(f"all, {lang}: absent at/above {aa}/{a}; with a precedent at/above {pa}/{pr} (closest = the named ticket: {named_ok})")
    print(f"highest cosine of a question about a fault no record has: {top_absent:.3f} (threshold {args.cosine:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
