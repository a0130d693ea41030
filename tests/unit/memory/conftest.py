"""Helpers for the memory tests: seeded random records with unit vectors."""

from __future__ import annotations

import numpy as np
import pytest

from recallserve.memory_shards import EmbeddedRecord, MemoryRecord

DIM = 16
MODEL = "test-model"
NOW = 1_700_000_000.0


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_items(rng: np.random.Generator, n: int, tenants: list[str], dim: int = DIM, prefix: str = "s", **fields) -> list[EmbeddedRecord]:
    """n records with random tenants, ages and unit vectors (one row each)."""
    items = []
    for i in range(n):
        rec = MemoryRecord(
            tenant=tenants[int(rng.integers(len(tenants)))],
            source_id=f"{prefix}{i}",
            text=f"memory {i}",
            created_at=NOW - 86_400 * 60,
            last_access_at=NOW - 86_400 * float(rng.uniform(0, 60)),
            **fields,
        )
        items.append(EmbeddedRecord(rec, unit(rng, 1, dim)))
    return items


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
