"""A memory's times: a number in a time field is epoch seconds, as the API documents.

* a memory sent as created at the epoch (``created_at: 0``) was stored as created now;
* a number above 2e10 (``created_at: 1e11``, year 5138) was read by pydantic as epoch
  *milliseconds*: stored as 1973-03-03, and a search filter ``created_after: 1e11`` matched every
  memory; an epoch in milliseconds was taken silently rather than named (now a 400 naming it).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import assert_envelope, headers


def _json(rig: Rig, method: str, url: str, body: Any = None, tenant: str = A, **kw: Any) -> Any:
    return rig.client.request(method, url, json=body, headers=headers(tenant), **kw)


# ---- numbers at their bounds --------------------------------------------------------------------

@pytest.mark.parametrize("created_at", [0, 0.0, "1970-01-01T00:00:00Z"])
def test_a_memory_created_at_the_epoch_keeps_its_time(rig: Rig, created_at: Any) -> None:
    r = _json(rig, "POST", "/v1/memories", {"memories": [{"text": "an old note", "created_at": created_at}]})
    assert r.status_code == 200, r.text
    got = _json(rig, "GET", f"/v1/memories/{r.json()['ids'][0]}").json()
    assert got["created_at"] == 0.0, got  # NOTE: it was stored as created now (the "or now" of a falsy 0)


YEAR_5138 = 1e11
"""Epoch seconds past 2e10, where pydantic switches to reading milliseconds."""


# ---- a number in a time field is epoch seconds ---------------------------------------------------

@pytest.mark.parametrize("value", [YEAR_5138, int(YEAR_5138), "100000000000"], ids=["float", "int", "string"])
@pytest.mark.parametrize("field", ["created_at", "expires_at"])
def test_a_memory_time_past_2e10_is_kept_as_seconds(rig: Rig, field: str, value: Any) -> None:
    r = _json(rig, "POST", "/v1/memories", {"memories": [{"text": "far future note", field: value}]})
    assert r.status_code == 200, r.text
    got = _json(rig, "GET", f"/v1/memories/{r.json()['ids'][0]}").json()
    assert got[field] == YEAR_5138, got


@pytest.mark.parametrize(("field", "keeps"), [("created_after", False), ("created_before", True)])
def test_a_filter_time_past_2e10_is_seconds(rig: Rig, field: str, keeps: bool) -> None:
    assert _json(rig, "POST", "/v1/memories", {"memories": [{"text": "the cat sat on the mat"}]}).status_code == 200
    r = _json(rig, "POST", "/v1/memories/search", {"query": "cat", "filters": {field: YEAR_5138}})
    assert r.status_code == 200, r.text
    assert bool(r.json()["data"]) is keeps, r.text


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/memories", {"memories": [{"text": "x", "created_at": 1.7e12}]}, "memories.0.created_at"),
    ("/v1/memories", {"memories": [{"text": "x", "expires_at": 1_900_000_000_000}]}, "memories.0.expires_at"),
    ("/v1/memories/search", {"query": "x", "filters": {"created_after": 1.7e12}}, "filters.created_after"),
    ("/v1/memories/search", {"query": "x", "filters": {"created_before": "1700000000000"}}, "filters.created_before"),
], ids=["created_at", "expires_at", "created_after", "created_before"])
def test_an_epoch_in_milliseconds_is_400_naming_the_field(rig: Rig, path: str, body: dict[str, Any], param: str) -> None:
    error = assert_envelope(_json(rig, "POST", path, body), 400, param)
    assert "milliseconds" in error["message"], error


def test_iso_times_and_seconds_still_work(rig: Rig) -> None:
    r = _json(rig, "POST", "/v1/memories", {"memories": [
        {"text": "a", "created_at": "2026-01-01T00:00:00Z"}, {"text": "b", "created_at": 1_767_225_600}]})
    assert r.status_code == 200, r.text
    times = [_json(rig, "GET", f"/v1/memories/{i}").json()["created_at"] for i in r.json()["ids"]]
    assert times == [1_767_225_600.0, 1_767_225_600.0]
