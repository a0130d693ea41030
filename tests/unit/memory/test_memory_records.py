"""Records: validation errors name the field; keys are stable; parts become rows."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from recallserve.memory_shards import EmbeddedRecord, MemoryPart, MemoryRecord, source_key, tenant_key


def test_tenant_and_source_keys_are_stable_int64() -> None:
    assert tenant_key("shared") == 0
    a = tenant_key("acme")
    assert a == tenant_key("acme") and a != 0
    assert -(2**63) <= a < 2**63
    assert tenant_key("acme") != tenant_key("acme2")
    assert source_key("ticket-1") == source_key("ticket-1") != tenant_key("ticket-1")
    with pytest.raises(ValueError, match="tenant"):
        tenant_key("")


def test_keys_are_pinned() -> None:
    # NOTE: pinned values: a change of hash function or byte order would silently orphan every
    # row already stored in snapshots (their columns hold these keys).
    assert tenant_key("acme") == -4543886195129349884
    assert source_key("ticket-1") == -8707081303334893624


def test_defaults_and_embedding_texts_order() -> None:
    rec = MemoryRecord(
        tenant="t", source_id="ticket-9", kind="image", text="printer jams", image_description="photo of tray",
        ocr_text="ERR 42", parts=[MemoryPart(name="resolution", text="replaced roller")], created_at=100.0,
    )
    assert rec.last_access_at == 100.0
    assert rec.embedding_texts() == ["printer jams", "photo of tray", "ERR 42", "replaced roller"]
    assert len(rec.id) == 32


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kind": "video"}, "kind"),
        ({"text": ""}, "text"),
        ({"source_id": ""}, "source_id"),
        ({"created_at": 10.0, "expires_at": 5.0}, "expires_at"),
        ({"metadata": {"a": [1, 2]}}, "metadata"),
        ({"metadata": {"a": float("nan")}}, "metadata"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_bad_input_names_the_field(kwargs: dict, field: str) -> None:
    base = {"tenant": "t", "source_id": "s", "text": "x"}
    with pytest.raises(ValidationError, match=field):
        MemoryRecord(**{**base, **kwargs})


def test_embedded_record_checks_rows_and_norms() -> None:
    rec = MemoryRecord(tenant="t", source_id="s", text="a", ocr_text="b")
    ok = np.eye(2, 4, dtype=np.float32)
    assert EmbeddedRecord(rec, ok).vectors.shape == (2, 4)
    with pytest.raises(ValueError, match="2 embedding texts"):
        EmbeddedRecord(rec, ok[:1])
    with pytest.raises(ValueError, match="L2-normalised"):
        EmbeddedRecord(rec, ok * 2)
