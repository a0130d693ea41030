"""What a tenant's traffic can make the server hold is capped.

* a session's entity table grew with every distinct id, amount or date a client sent, read back
  on every turn (``context.max_entities_per_session`` now keeps the most recently seen);
* every new ``task_domain`` a tenant's records named opened another active cache of up to
  ``active_capacity`` records, which searches without a domain, the review queue and maintenance
  scan (``experience.max_active_domains`` now demotes the least recently used domain's records).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recallserve.serve.context import ContextConfig
from tests.conftest import STATE_BACKENDS
from tests.security.conftest import A, B, Rig, serving, serving_on
from tests.unit.edge.conftest import headers
from tests.unit.experience._records import speed_record

CHAT: dict[str, Any] = {"model": "recallserve", "metadata": {"agent": "off"}}


def _chat(rig: Rig, messages: list[dict[str, Any]], tenant: str = A, **extra: Any) -> Any:
    return rig.client.post("/v1/chat/completions", json={**CHAT, **extra, "messages": messages}, headers=headers(tenant))


@pytest.fixture(params=STATE_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The state backend of the bound tests (``sqlite`` or ``postgres``): the caps hold on both."""
    return str(request.param)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One rig for the module (the chat cases hold no state the others read)."""
    with serving(tmp_path_factory.mktemp("rig")) as r:
        yield r


# ---- a session's entity table is bounded ---------------------------------------------------------

ENTITY_CAP = 50


def _orders(start: int, n: int) -> str:
    return "Please check " + ", ".join(f"order {i}" for i in range(start, start + n)) + "."


def test_a_sessions_entity_table_keeps_the_most_recently_seen_up_to_its_cap(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> None:
    with serving_on(request, backend, tmp_path, context_config=ContextConfig(summary_keep_recent=1, max_entities_per_session=ENTITY_CAP)) as r:
        meta = {"agent": "off", "session_id": "many-ids", "context_mode": "summary"}
        for start in (100_000, 200_000, 300_000):
            reply = _chat(r, [{"role": "user", "content": _orders(start, 40)}], metadata=meta)
            assert reply.status_code == 200, reply.text
        got = r.client.get("/v1/sessions/many-ids", headers=headers(A))
        assert got.status_code == 200, got.text
        values = {e["value"] for e in got.json()["entities"]}
        assert len(got.json()["entities"]) == ENTITY_CAP, len(got.json()["entities"])
        # the newest turn's ids and the answer's (seen in every turn) stay; the first turn's are gone
        assert {str(i) for i in range(300_000, 300_040)} <= values, sorted(values)
        assert "104208" in values, sorted(values)
        assert not values & {str(i) for i in range(100_000, 100_040)}, sorted(values)
        # an id seen again is the most recent again: it comes back, and the table stays at its cap
        assert _chat(r, [{"role": "user", "content": "About order 100000 again."}], metadata=meta).status_code == 200
        after = r.client.get("/v1/sessions/many-ids", headers=headers(A)).json()["entities"]
        assert len(after) == ENTITY_CAP and "100000" in {e["value"] for e in after}


def test_one_request_with_more_entities_than_the_cap_stores_the_last_ones(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> None:
    with serving_on(request, backend, tmp_path, context_config=ContextConfig(summary_keep_recent=1, max_entities_per_session=ENTITY_CAP)) as r:
        # NOTE: 200 ids, under the 256 spans one text is read for (serve.context._entities.MAX_ENTITY_SPANS).
        reply = _chat(r, [{"role": "user", "content": _orders(500_000, 200)}],
                      metadata={"agent": "off", "session_id": "one-big"})
        assert reply.status_code == 200, reply.text
        values = {e["value"] for e in r.client.get("/v1/sessions/one-big", headers=headers(A)).json()["entities"]}
        assert len(values) == ENTITY_CAP and "500199" in values and "500000" not in values


# ---- the active experience caches of a tenant are bounded in domains -----------------------------

DOMAIN_CAP = 2


def _tier(rig: Rig, exp_id: str, tenant: str = A) -> str:
    r = rig.client.get(f"/v1/experiences/{exp_id}", headers=headers(tenant))
    assert r.status_code == 200, r.text
    return str(r.json()["tier"])


def _active(rig: Rig, exp_id: str, domain: str, when: float, tenant: str = A) -> None:
    record = speed_record(exp_id=exp_id, domain=domain, timestamp=when, label="correct")
    r = rig.client.post("/v1/experiences", json=record, headers=headers(tenant))
    assert r.status_code == 201 and r.json()["tier"] == "active", r.text


def test_a_new_task_domain_past_the_cap_demotes_the_least_recently_used_domain(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> None:
    # NOTE: minutes ago, so no record is demoted for its decay or window instead.
    t0 = time.time() - 3600
    with serving_on(request, backend, tmp_path, experience_config={"max_active_domains": DOMAIN_CAP}) as r:
        _active(r, "exp-b", "globex-only", t0, tenant=B)
        _active(r, "exp-1", "units", t0 + 100)
        _active(r, "exp-2", "tax", t0 + 200)
        _active(r, "exp-3", "units", t0 + 300)  # units used again: tax is now the least recent
        # a third domain: the least recently used one (tax) leaves the active cache, kept as archival
        _active(r, "exp-4", "geometry", t0 + 50)  # NOTE: an older timestamp: the new domain still stays
        assert [_tier(r, i) for i in ("exp-1", "exp-2", "exp-3", "exp-4")] == ["active", "archival", "active", "active"]
        found = r.client.post("/v1/experiences/search", headers=headers(A),
                              json={"query": "", "source_model": "Qwen2.5-Coder-1.5B-Instruct", "k": 10})
        assert found.status_code == 200, found.text
        assert {h["experience"]["record"]["metadata"]["task_domain"] for h in found.json()["hits"]} == {"units", "geometry"}
        # another tenant's domains neither count nor move
        assert _tier(r, "exp-b", tenant=B) == "active"
        # a reviewer's "correct" brings a record (and its domain) back, demoting the now least recent
        label = r.client.post("/v1/experiences/exp-2/label", json={"label": "correct"}, headers=headers(A))
        assert label.status_code == 200 and label.json()["tier"] == "active", label.text
        assert [_tier(r, i) for i in ("exp-1", "exp-2", "exp-3", "exp-4")] == ["active", "active", "active", "archival"]
