"""Fixtures of the experience-memory unit tests: a deterministic embedder and a settable clock."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
import pytest

from recallserve.serve.experience import ExperienceConfig, ExperienceService

DIM = 64
DAY = 86400.0


def bag_of_words_embed(texts: Sequence[str]) -> np.ndarray:
    """Hashed bag of words, L2-normalised: shared words -> higher cosine (test double only)."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, t in enumerate(texts):
        for tok in re.findall(r"[a-z]+", t.lower()):
            h = int(hashlib.md5(tok.encode()).hexdigest(), 16)
            out[i, h % DIM] += 1.0
        n = np.linalg.norm(out[i])
        if n > 0:
            out[i] /= n
    return out


class Clock:
    """A settable clock (epoch seconds)."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, days: float) -> None:
        self.t += days * DAY


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_service(tmp_path, clock):
    """Factory of services over one data dir (call twice to simulate a restart)."""
    made: list[ExperienceService] = []

    def make(**overrides) -> ExperienceService:
        cfg = ExperienceConfig(**{"data_dir": tmp_path / "exp", "min_similarity": 0.1, **overrides})
        svc = ExperienceService(cfg, embed=bag_of_words_embed, clock=clock)
        made.append(svc)
        return svc

    yield make
    for s in made:
        s.close()
