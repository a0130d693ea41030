"""``GET /v1/console/health`` shows each tenant its own figures.

It showed every tenant the whole process's figures: all tenants' request counts by status,
latency, experience cache lookups and verification items, and the memory records of every shard.
Polling it, a tenant watched another's traffic and errors and counted its memory writes one by
one. Each tenant now sees only its own figures (its requests, its memories without the shared
collection); the per-tenant counters are kept off the keyless ``/metrics``.
"""

from __future__ import annotations

from typing import Any

from tests.security.conftest import A, B, Rig
from tests.unit.edge.conftest import headers
from tests.unit.experience._records import speed_record


def _json(rig: Rig, method: str, url: str, body: Any = None, tenant: str = A, **kw: Any) -> Any:
    return rig.client.request(method, url, json=body, headers=headers(tenant), **kw)


def _health(rig: Rig, tenant: str) -> dict[str, Any]:
    r = rig.client.get("/v1/console/health", headers=headers(tenant))
    assert r.status_code == 200, r.text
    return r.json()


def _experience(exp_id: str | None = None) -> dict[str, Any]:
    rec = speed_record(timestamp=1.7e9)
    if exp_id is not None:
        rec["metadata"]["id"] = exp_id
    return rec


# ---- the console's Health page shows a tenant its own figures ----------------------------------------

def test_another_tenants_activity_changes_nothing_on_my_health_page(rig: Rig) -> None:
    before = _health(rig, B)
    mine = _health(rig, A)
    assert _json(rig, "POST", "/v1/memories", {"memories": [{"text": "PELICAN one"}, {"text": "PELICAN two"}]}).status_code == 200
    assert _json(rig, "GET", "/v1/memories/" + "0" * 32).status_code == 404
    assert _health(rig, A)["memory_records"] == mine["memory_records"] + 2
    # NOTE: an experience also writes its segments to the memory tier (more of acme's memories).
    assert _json(rig, "POST", "/v1/experiences", _experience("exp-health-1")).status_code == 201
    assert _json(rig, "POST", "/v1/experiences/search", {"query": "speed", "source_model": "m"}).status_code == 200

    after = _health(rig, A)
    assert after["memory_records"] > mine["memory_records"] + 2, after
    assert after["requests"] >= mine["requests"] + 4, after
    assert after["requests_by_class"]["4xx"] == mine["requests_by_class"].get("4xx", 0) + 1, after
    assert after["verification_items"] > mine["verification_items"], after
    assert after["cache_lookups"] == mine["cache_lookups"] + 1, after
    # NOTE: globex sent nothing but these reads (which its figures leave out): not one figure moved.
    assert _health(rig, B) == before


def test_the_health_page_counts_only_my_memories(rig: Rig) -> None:
    assert _json(rig, "POST", "/v1/memories", {"memories": [{"text": "acme note"}] * 3}).status_code == 200
    assert _json(rig, "POST", "/v1/memories", {"memories": [{"text": "globex note"}]}, tenant=B).status_code == 200
    assert _health(rig, A)["memory_records"] == 3
    assert _health(rig, B)["memory_records"] == 1


def test_the_per_tenant_figures_stay_off_the_keyless_metrics(rig: Rig) -> None:
    assert _json(rig, "POST", "/v1/memories", {"memories": [{"text": "acme note"}]}).status_code == 200
    assert _health(rig, A)["requests"] >= 1
    text = rig.client.get("/metrics").text
    assert "recallserve_http_requests_total" in text  # the operator's figures are still there
    assert "recallserve_tenant_" not in text and f'"{A}"' not in text and f'"{B}"' not in text
