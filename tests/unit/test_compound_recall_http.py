"""Compound questions recall what each of their single parts recalls first, shown through the HTTP
turn traces (issue 40, Deliver 1): the demo's tickets and manual are posted with ``POST
/v1/memories``; each compound question of the tuned ``compound`` set and each of its single-part
questions is asked with ``POST /v1/chat/completions``; the source ids each turn recalled are read
back from ``GET /v1/turns/{id}``.

The edge rig's whole app (``tests/unit/edge/conftest.py``: real memory service over two hybrid
shards, the hashing embedder as MiniLM's double, a scripted engine: recall runs before the model,
so the engine does not change what is recalled). The same comparison with MiniLM is the recorded
run ``python loadtests/compound_recall.py --http`` (``loadtests/results/compound-recall-http-cpu-local.md``).
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from loadtests.compound_recall import single_parts
from recallserve.serve.agent.demo.questions import load_questions
from recallserve.serve.agent.demo.world import DemoWorld
from recallserve.serve.agent.grounding import asked_ids
from tests.unit.edge.conftest import build_app, headers


def _recalled(c: TestClient, question: str) -> list[str]:
    """The source ids the turn answering ``question`` recalled, in order, read from its trace."""
    r = c.post("/v1/chat/completions", headers=headers("acme"),
               json={"model": "recallserve", "user": "u1", "messages": [{"role": "user", "content": question}]})
    assert r.status_code == 200, r.text
    turn_id = r.json()["recallserve"]["request_id"]
    deadline = time.monotonic() + 30
    while (t := c.get(f"/v1/turns/{turn_id}", headers=headers("acme"))).status_code != 200:
        assert time.monotonic() < deadline, t.text
        time.sleep(0.05)
    trace = t.json()
    assert not trace["memory_error"]
    return [m["source_id"] for m in trace["memories"]]


def test_a_compound_question_recalls_the_record_each_single_part_recalls_first(tmp_path: Path) -> None:
    """A part's record: the first one its turn recalled that names an id or code the part names (a
    batch, an order, E42), or its first one when the part names none; a part naming a code no record
    holds (E99) needs none. The compound question's turn recalls every part's record."""
    app, memory = build_app(tmp_path)
    world = DemoWorld().memories()
    texts = {m.source_id: m.text for m in world}
    records = [{"text": m.text, "source_id": m.source_id, "kind": m.kind} for m in world]
    with TestClient(app) as c:
        r = c.post("/v1/memories", headers=headers("acme"), json={"memories": records})
        assert r.status_code == 200, r.text
        needed = 0
        for q in load_questions("compound"):
            parts = single_parts(q["q"])
            if len(parts) < 2:
                continue
            whole = set(_recalled(c, q["q"]))
            for part in parts:
                ids = asked_ids(part)
                recalled = _recalled(c, part)
                first = [s for s in recalled if any(i in texts[s] for i in ids)][:1] if ids else recalled[:1]
                assert set(first) <= whole, (q["q"], part, first)
                needed += len(first)
        assert needed >= 8
        # the question, whose turn recalled nothing on `up --demo`: the flicker ticket
        question = ("My display keeps flickering, it is from batch B-2320. Has this happened before and how was it "
                    "fixed? Which other orders came from that batch?")
        assert "ticket:T-1121" in _recalled(c, question)
    for shard_client in memory.coordinator.shards:
        shard_client.shard.close()
