"""An experience search's write-back does not undo a label stored meanwhile.

A search wrote back the whole record it had read (to store its retrieval score): a label stored
between that read and the write was undone in the record (no label, note or reviewer) while the
row stayed filed in the label's tier.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from recallserve.serve.experience import ExperienceStore
from recallserve.serve.experience._schema import ExperienceRecord
from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import headers
from tests.unit.experience._records import speed_record


def _json(rig: Rig, method: str, url: str, body: Any = None, tenant: str = A, **kw: Any) -> Any:
    return rig.client.request(method, url, json=body, headers=headers(tenant), **kw)


def _experience(exp_id: str | None = None) -> dict[str, Any]:
    # NOTE: now: the active cache holds a record for 30 days from its own time (002).
    rec = speed_record(timestamp=time.time())
    if exp_id is not None:
        rec["metadata"]["id"] = exp_id
    return rec


# ---- a search's touch does not undo a label stored meanwhile -------------------------------------------

def test_a_searchs_touch_keeps_a_label_stored_after_its_read(rig: Rig, tmp_path: Path) -> None:
    # NOTE: through HTTP first (the positive path: a label, then a search, keeps the label) ...
    assert _json(rig, "POST", "/v1/experiences", _experience("exp-race")).status_code == 201
    assert _json(rig, "POST", "/v1/experiences/exp-race/label", {"label": "correct", "note": "checked"}).status_code == 200
    hits = _json(rig, "POST", "/v1/experiences/search", {"query": "car speed", "source_model": "Qwen2.5-Coder-1.5B-Instruct"})
    assert [h["experience"]["record"]["evaluation"]["review_note"] for h in hits.json()["hits"]] == ["checked"], hits.text
    # ... then the interleaving a concurrent search and label produce, on the store both routes use.
    store = ExperienceStore(tmp_path / "exp")
    rec = ExperienceRecord.model_validate(_experience("exp-race"))
    emb = np.ones(4, dtype=np.float32)

    async def interleave() -> ExperienceRecord:
        await store.put(A, rec, tier="review", family="qwen", embedding=emb, last_used_at=1.7e9)
        read = (await store.get(A, "exp-race")).record  # the search's read
        labelled = rec.model_copy(update={"evaluation": rec.evaluation.model_copy(
            update={"human_label": "correct", "review_note": "checked"})})
        await store.put(A, labelled, tier="active", family="qwen", embedding=emb, last_used_at=1.7e9)  # the label
        scored = read.model_copy(update={"evaluation": read.evaluation.model_copy(update={"retrieval_score": 0.5})})
        await store.touch(A, [("exp-race", 1.8e9, scored.model_dump_json())])  # the search's touch
        return (await store.get(A, "exp-race")).record

    try:
        got = asyncio.run(interleave())
    finally:
        store.close()
    assert got.evaluation.human_label == "correct" and got.evaluation.review_note == "checked", got.evaluation
    assert got.evaluation.retrieval_score == 0.5
