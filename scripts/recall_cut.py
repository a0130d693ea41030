"""Choose ``RecallConfig.relative_cut`` and check ``min_similarity`` on the demo questions (no model, ~1 min on a CPU).

    PYTHONPATH=$PWD python scripts/recall_cut.py [--questions tuned|holdout]

Recalls (demo memories, MiniLM, the memory tier's top-k and threshold) for every question of the
set and for the demo scenario (question + the OCR text of its photo), then prints for each cut
``c``: how many of the memories the answers need survive :func:`recallserve.serve.turn.relevance_cut`
(``similarity >= c * best``), and how many
memories the prompts would show in all. The default is the largest cut that keeps every needed
memory of the tuned set; run it with ``--questions holdout`` to report (not fit) the held-out set.

Then, at the default cut, for each absolute floor ``f`` (``similarity >= f`` for every hit, BM25's
best match included): the needed memories kept, and the memories shown to questions that need
none (what a floor saves). The default floor is the memory tier's threshold (the design's 0.35
cosine), not a fit: the table shows that it keeps every needed memory of both sets. These rows pass
the question as the query, so the id and topic-code rules of :func:`recallserve.serve.turn.relevance_cut`
apply with ``RecallConfig``'s default patterns; a last block reports, per query, which memories each
of those two rules keeps (``--show``).
"""

from __future__ import annotations

import argparse
import asyncio

from recallserve.serve.agent.demo import DEMO_QUESTION, DEMO_TENANT, demo_photo_data_url, load_demo_memories, load_questions
from recallserve.serve.agent.demo._memory import LocalMemory
from recallserve.serve.agent.images import analyse_images
from recallserve.serve.turn import RecallConfig, recall_query, relevance_cut, relevance_patterns

#: The memories a right answer needs, per question text (tuned and held-out sets, and the demo).
NEEDED = {
    "Search the knowledge base for anything about water leaking from the group head.": {"ticket:T-1080"},
    "Search memory for past tickets about a weak steam wand.": {"ticket:T-1130"},
    "How long is the warranty on the BrewMaster?": {"manual:7.1"},
    "What does error E12 mean on my machine?": {"manual:2.1"},
    DEMO_QUESTION: {"ticket:T-1042", "ticket:T-1057", "ticket:T-1063", "ticket:T-1110"},
    # held out
    "Have any other customers reported water leaking from the group head? Please search the old tickets.":
        {"ticket:T-1080"},
    "search the knowledge base for anything about a flickering display": {"ticket:T-1121"},
    "did we ever see E12 pump problems on other units? look through past tickets for me": {"ticket:T-1071"},
    "my BrewMaster shows E07, what does that mean?": {"manual:2.1"},
    "How often am I supposed to descale the machine? We have hard water here.": {"manual:5.1"},
    "how long is the warranty on your espresso machines?": {"manual:7.1"},
}
CUTS = (0.0, 0.7, 0.75, 0.8, 0.85, 0.88, 0.9, 0.95)
FLOORS = (-1.0, 0.2, 0.3, 0.35, 0.4, 0.45, 0.5)


async def _main(which: str, show: bool) -> None:
    memory = LocalMemory()
    await load_demo_memories(memory)
    queries = [q["q"] for q in load_questions(which)]
    if which == "tuned":
        images, _ = await analyse_images([demo_photo_data_url()], DEMO_QUESTION)
        queries.append(recall_query(DEMO_QUESTION, images))
    hits = {}
    for q in queries:
        key = DEMO_QUESTION if q.startswith(DEMO_QUESTION) else q
        hits[key] = await memory.search(DEMO_TENANT, q)
    need = sum(len(NEEDED[q]) for q in hits if q in NEEDED)
    print(f"{which}: {len(hits)} queries, {need} needed memories")
    for cut in CUTS:
        kept = {q: {h.source_id for h in relevance_cut(hs, cut)} for q, hs in hits.items()}
        found = sum(len(NEEDED[q] & kept[q]) for q in hits if q in NEEDED)
        shown = sum(len(v) for v in kept.values())
        print(f"relative_cut {cut:.2f}: needed kept {found}/{need}, memories shown {shown}")
    config = RecallConfig()
    cut = config.relative_cut
    ids, codes = relevance_patterns(config)
    for floor in FLOORS:
        kept = {q: {h.source_id for h in relevance_cut(hs, cut, floor, q, id_pattern=ids, topic_code_pattern=codes)}
                for q, hs in hits.items()}
        found = sum(len(NEEDED[q] & kept[q]) for q in hits if q in NEEDED)
        idle = sum(len(v) for q, v in kept.items() if q not in NEEDED)
        busy = sum(len(v) for q, v in kept.items() if q in NEEDED)
        print(f"relative_cut {cut:.2f}, min_similarity {floor:+.2f}: needed kept {found}/{need}, "
              f"memories shown to the {len(hits) - len(set(hits) & set(NEEDED))} questions that need none {idle}, "
              f"to the {len(set(hits) & set(NEEDED))} that need some {busy}")
    # What the id and topic-code rules change, at the default cut and the tier's threshold.
    floor = float(getattr(memory, "threshold", 0.35))
    rules = {"none": (None, None), "id": (ids, None), "id+code": (ids, codes)}
    for name, (id_p, code_p) in rules.items():
        kept = {q: {h.source_id for h in relevance_cut(hs, cut, floor, q, id_pattern=id_p, topic_code_pattern=code_p)}
                for q, hs in hits.items()}
        found = sum(len(NEEDED[q] & kept[q]) for q in hits if q in NEEDED)
        shown = sum(len(v) for v in kept.values())
        print(f"rules {name:8s} (cut {cut:.2f}, floor {floor:.2f}): needed kept {found}/{need}, memories shown {shown}")
        if show:
            for q, v in kept.items():
                print(f"    {q[:60]!r}: {sorted(v)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--questions", default="tuned", choices=("tuned", "holdout"))
    p.add_argument("--show", action="store_true", help="print the memories each rule keeps, per query")
    args = p.parse_args()
    asyncio.run(_main(args.questions, args.show))


if __name__ == "__main__":
    main()
