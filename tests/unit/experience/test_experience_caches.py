"""Cache policy: ranking formula, decay, demotions, conflicts and model families."""

from __future__ import annotations

import numpy as np
import pytest

from recallserve.serve.experience import (
    ExperienceContext,
    ExperienceMetadata,
    ExperienceOutcome,
    ExperienceRecord,
    decay_factor,
    model_family,
    rank_active,
)
from recallserve.serve.experience._caches import demotions, find_conflicts
from recallserve.serve.experience._store import StoredRow

DAY = 86400.0
NOW = 1_800_000_000.0


def row(i: str, *, used_days_ago: float, vec, created_days_ago: float = 0.0, topic="math", tier="active",
        label=None) -> StoredRow:
    v = np.asarray(vec, dtype=np.float32)
    rec = ExperienceRecord(
        metadata=ExperienceMetadata(id=i, source_model="m", topic=topic, timestamp=NOW - created_days_ago * DAY),
        context=ExperienceContext(raw_text=i), outcome=ExperienceOutcome(answer="1"),
    )
    rec.evaluation.human_label = label
    return StoredRow(tenant="t", record=rec, tier=tier, family="m", last_used_at=NOW - used_days_ago * DAY,
                     use_count=0, embedding=v / np.linalg.norm(v))


def test_rank_formula_is_07_recency_plus_03_similarity():
    q = np.array([1.0, 0.0], dtype=np.float32)
    # NOTE: all three were retrieved together just now: the recency rank is by the record's time.
    rows = [row("old_exact", used_days_ago=1, created_days_ago=3, vec=[1, 0]),      # sim 1.0, rank 2 -> 0.0
            row("new_far", used_days_ago=1, created_days_ago=1, vec=[0.6, 0.8]),    # sim 0.6, rank 0 -> 1.0
            row("mid", used_days_ago=1, created_days_ago=2, vec=[0.8, 0.6])]        # sim 0.8, rank 1 -> 0.5
    out = rank_active(rows, q, now=NOW, k=3)
    assert [r.row.id for r in out] == ["new_far", "mid", "old_exact"]
    assert [r.score for r in out] == pytest.approx([0.7 * 1 + 0.3 * 0.6, 0.7 * 0.5 + 0.3 * 0.8, 0.3 * 1.0])
    assert out[0].decay == pytest.approx(1 / 1.1)
    assert [r.row.id for r in rank_active(rows, q, now=NOW, k=1)] == ["new_far"]


def test_rank_threshold_filters_before_recency_rank():
    q = np.array([1.0, 0.0], dtype=np.float32)
    rows = [row("recent_unrelated", used_days_ago=0, vec=[0, 1]),
            row("related", used_days_ago=5, created_days_ago=5, vec=[1, 0.1])]
    out = rank_active(rows, q, now=NOW, k=5, min_similarity=0.35)
    assert [r.row.id for r in out] == ["related"] and out[0].recency == 1.0
    assert rank_active([], q, now=NOW, k=3) == []


def test_decay_factor():
    assert decay_factor(NOW, NOW) == 1.0
    assert decay_factor(NOW, NOW - 10 * DAY) == pytest.approx(0.5)
    assert decay_factor(NOW, NOW + DAY) == 1.0  # future use clamps to now
    # NOTE: 1/(1+0.1 d) < 0.3  <=>  d > 23.33 days.
    assert decay_factor(NOW, NOW - 23 * DAY) > 0.3 > decay_factor(NOW, NOW - 24 * DAY)


def test_demotions_by_decay_window_and_capacity():
    # 002: the 30-day window counts from the record's time; decay below 0.3 only makes a candidate,
    # demoted first when the scope is over capacity.
    rows = [row("fresh1", used_days_ago=0, vec=[1, 0]), row("fresh2", used_days_ago=1, vec=[1, 0]),
            row("fresh3", used_days_ago=2, vec=[1, 0]), row("stale", used_days_ago=25, created_days_ago=25, vec=[1, 0])]
    assert demotions(rows, now=NOW, capacity=2, window_days=30) == {"stale": "decay", "fresh3": "capacity"}
    # Under capacity a stale record stays active until its 30 days are up ...
    assert demotions(rows, now=NOW, capacity=10, window_days=30) == {}
    rows.append(row("ancient", used_days_ago=0, created_days_ago=31, vec=[1, 0]))
    # ... and a record older than 30 days sinks however recently it was used.
    assert demotions(rows, now=NOW, capacity=10, window_days=30) == {"ancient": "window"}


def test_conflicts_prefer_newer_archival_not_wrong_same_topic():
    active = [row("a_old", used_days_ago=0, vec=[1, 0], created_days_ago=10),
              row("a_new", used_days_ago=0, vec=[1, 0], created_days_ago=1, topic="units")]
    archival = [row("arch_newer", used_days_ago=5, vec=[1, 0], created_days_ago=5, tier="archival"),
                row("arch_wrong", used_days_ago=5, vec=[1, 0], created_days_ago=2, tier="archival", label="wrong"),
                row("arch_units_older", used_days_ago=5, vec=[1, 0], created_days_ago=3, topic="units",
                    tier="archival")]
    got = [(c.active.id, c.newer.id) for c in find_conflicts(active, archival)]
    assert got == [("a_old", "arch_newer")]


@pytest.mark.parametrize(
    ("name", "family"),
    [("models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", "qwen2.5-coder"),
     ("qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2.5-coder"),
     ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
     ("llama-3.1-8b-instruct", "llama-3.1")],
)
def test_model_family(name, family):
    assert model_family(name) == family
