"""Offline check of the fault-word rule (``recallserve.serve.agent.grounding.unfound_topic``) on the question sets.

For every history question (``HISTORY_PATTERN``) of every registered set: is it about a fault no record
has (its facts ask for an absence: "not found" / "no record" / "没有找到" among a fact's alternatives) or one
with a precedent, and does ``unfound_topic`` say that nothing the turn found holds its topic? The turn's
searches are approximated by its **recall**: the demo records (tickets, manual sections) the latest
``loadtests/results/eval-agent-*.json`` row of that question recalled, no tool observations and no
``memory_search`` results (so a code-history question answered by a search shows up as flagged here
although the served check saw the search's hits). Prints one line per set and the questions the rule
gets wrong. No model, no Ray; seconds.

Usage (from the repo root)::

    python -m loadtests.fault_words_check [--skip SET ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from recallserve.serve.agent import default_registry
from recallserve.serve.agent.demo import DemoWorld, load_questions
from recallserve.serve.agent.demo.questions import QUESTION_SETS
from recallserve.serve.agent.grounding import HISTORY_PATTERN, Search, unfound_topic
from recallserve.serve.language import language_of

ROOT = Path(__file__).resolve().parents[1]
_ABSENT = ("not found", "no record", "没有找到")


def latest_rows(results: Path) -> dict[str, dict[str, Any]]:
    """Question text -> its row in the newest eval-agent result file that holds it."""
    rows: dict[str, dict[str, Any]] = {}
    for f in sorted(results.glob("eval-agent-*.json"), key=lambda p: p.stat().st_mtime):
        try:
            sets = json.loads(f.read_text()).get("sets", {})
        except (OSError, ValueError):
            continue
        for data in sets.values():
            for row in data.get("rows", []):
                rows[row["q"]] = row
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip", nargs="*", default=[], help="question sets to leave out (e.g. a blind set not yet run)")
    args = p.parse_args(argv)
    known = [t.description for t in default_registry(demo=True).all()]
    texts = {m.source_id: m.text for m in DemoWorld().memories()}
    rows = latest_rows(ROOT / "loadtests" / "results")
    seen: set[str] = set()
    totals = {"en": [0, 0, 0, 0], "zh": [0, 0, 0, 0]}  # absent, absent caught, precedent, precedent flagged
    wrong = []
    for name in QUESTION_SETS:
        if name in args.skip:
            continue
        counts = [0, 0, 0, 0]
        for q in load_questions(name):
            if q["q"] in seen or not HISTORY_PATTERN.search(q["q"]):
                continue
            seen.add(q["q"])
            absent = any(isinstance(f, list) and any(a in f for a in _ABSENT) for f in q["facts"])
            row = rows.get(q["q"])
            found = tuple(texts.get(s, "") for s in (row["memories"] if row else []))
            topic = unfound_topic([Search("recall", True, found)], q["q"], known)
            i = 0 if absent else 2
            counts[i] += 1
            counts[i + 1] += bool(topic)
            lang = "zh" if language_of(q["q"]) == "zh" else "en"
            totals[lang][i] += 1
            totals[lang][i + 1] += bool(topic)
            if bool(topic) != absent:
                wrong.append(f"  {name}: {'absent, not caught' if absent else 'precedent, flagged ' + str(topic)}: {q['q'][:90]}")
        if counts[0] or counts[2]:
            print(f"{name:20s} absent {counts[1]}/{counts[0]} caught; with a precedent {counts[3]}/{counts[2]} flagged")
    for lang, (a, ac, pr, pf) in totals.items():
        print(f"all, {lang}: absent {ac}/{a} caught; with a precedent {pf}/{pr} flagged")
    print("wrong:\n" + "\n".join(wrong))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
