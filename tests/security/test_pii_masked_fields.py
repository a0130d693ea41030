"""Masked values stay valid, distinct and findable: what the masker does to a field under the
default policy (mask) must leave a record its own checks accept, two values two values, and a
filter written with what the client sent still finding it.

* masking can lengthen a value (``pin:1`` -> ``pin:[PASSWORD]``) or change its shape (an SSN is a
  valid error tag, ``[ID_NUMBER]`` is not): the masked value failed its field's own check, a 500 on
  ``POST /v1/memories`` and ``POST /v1/experiences``, and a label stored (unvalidated) a record that
  the label itself and every later read of it answered 500;
* an experience's free-text metadata (reviewer, task domain, topic, model name), a label's error
  tags and a memory's image hash were stored as sent, personal data included;
* two metadata keys holding personal data were masked to one key (``{"a@x.io": 1, "b@y.io": 2}``
  became ``{"[EMAIL]": 2}``); a search filter naming a stored metadata value or topic as the
  client sent it matched nothing (the stored one is masked, the filter was not), nor did an
  experience search's ``domain``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import assert_envelope, headers
from tests.unit.experience._records import speed_record

CHAT: dict[str, Any] = {"model": "recallserve", "metadata": {"agent": "off"},
                        "messages": [{"role": "user", "content": "hi"}]}
# NOTE: 6 characters that mask to 15 ("pin:[PASSWORD] "): 2.5x longer once masked.
PIN = "pin:1 "


def _json(rig: Rig, method: str, url: str, body: Any = None, tenant: str = A, **kw: Any) -> Any:
    return rig.client.request(method, url, json=body, headers=headers(tenant), **kw)


# ---- masking that lengthens or reshapes a value ------------------------------------------------

LONG_WHEN_MASKED = {
    "text": ({"text": PIN * 5_000}, "memories.0.text"),
    "metadata value": ({"text": "x", "metadata": {"note": PIN * 170}}, "memories.0.metadata"),
    "image description": ({"text": "x", "image_description": PIN * 5_000}, "memories.0.image_description"),
    "topic": ({"text": "x", "topic": PIN * 85}, "memories.0.topic"),
}


@pytest.mark.parametrize("case", LONG_WHEN_MASKED)
def test_a_memory_too_long_once_masked_is_400_naming_the_field(rig: Rig, case: str) -> None:
    memory, field = LONG_WHEN_MASKED[case]
    r = _json(rig, "POST", "/v1/memories", {"memories": [{"source_id": "masked-long", **memory}]})
    error = assert_envelope(r, 400, field)
    assert error["message"].startswith(f"{field}: ") and "masked" in error["message"], error
    listed = _json(rig, "GET", "/v1/memories", params={"source_id": "masked-long"})
    assert listed.status_code == 200 and listed.json()["data"] == [], listed.text


def test_a_memory_that_fits_once_masked_is_stored_masked(rig: Rig) -> None:
    r = _json(rig, "POST", "/v1/memories", {"memories": [{"text": PIN * 2_000, "source_id": "masked-ok"}]})
    assert r.status_code == 200, r.text
    got = _json(rig, "GET", f"/v1/memories/{r.json()['ids'][0]}").json()
    assert got["text"].startswith("pin:[PASSWORD] pin:[PASSWORD]"), got["text"][:80]


def test_an_experience_whose_masked_error_tag_is_no_tag_is_400(rig: Rig) -> None:
    record = speed_record(exp_id="exp-ssn-tag") | {"evaluation": {"error_tags": ["123-45-6789"]}}
    error = assert_envelope(_json(rig, "POST", "/v1/experiences", record), 400, "evaluation.error_tags")
    assert "masked" in error["message"] and "123-45-6789" not in error["message"], error
    assert _json(rig, "GET", "/v1/experiences/exp-ssn-tag").status_code == 404


def test_an_experience_too_long_once_masked_is_400(rig: Rig) -> None:
    record = speed_record(exp_id="exp-long", text=PIN * 1_000)
    assert_envelope(_json(rig, "POST", "/v1/experiences", record), 400, "context.raw_text")
    assert _json(rig, "GET", "/v1/experiences/exp-long").status_code == 404


def test_a_label_too_long_once_masked_is_400_and_the_record_stays_readable(rig: Rig) -> None:
    assert _json(rig, "POST", "/v1/experiences", speed_record(exp_id="exp-label")).status_code == 201
    r = _json(rig, "POST", "/v1/experiences/exp-label/label", {"label": "wrong", "note": PIN * 333})
    assert_envelope(r, 400, "note")
    # NOTE: before, the label stored a note of 4,995 characters (the bound is 2,000) and answered 500,
    # as every later read of the record did.
    got = _json(rig, "GET", "/v1/experiences/exp-label")
    assert got.status_code == 200 and got.json()["record"]["evaluation"]["human_label"] is None, got.text
    assert _json(rig, "GET", "/v1/experiences/review").status_code == 200
    r = _json(rig, "POST", "/v1/experiences/exp-label/label", {"label": "wrong", "note": PIN * 100})
    assert r.status_code == 200 and r.json()["record"]["evaluation"]["review_note"].startswith("pin:[PASSWORD]"), r.text


def test_a_label_error_tag_holding_personal_data_is_not_stored(rig: Rig) -> None:
    assert _json(rig, "POST", "/v1/experiences", speed_record(exp_id="exp-tag")).status_code == 201
    r = _json(rig, "POST", "/v1/experiences/exp-tag/label", {"label": "wrong", "error_tags": ["123-45-6789"]})
    assert_envelope(r, 400, "error_tags")
    assert "123-45-6789" not in _json(rig, "GET", "/v1/experiences/exp-tag").text
    strict = _json(rig, "POST", "/v1/experiences", speed_record(exp_id="exp-tag"), tenant="strict")
    assert strict.status_code == 201, strict.text
    r = _json(rig, "POST", "/v1/experiences/exp-tag/label", {"label": "wrong", "error_tags": ["123-45-6789"]},
              tenant="strict")
    assert assert_envelope(r, 400, "error_tags.0")["code"] == "personal_data"


# ---- personal data in fields that were stored as sent ------------------------------------------

@pytest.mark.parametrize("field", ["reviewer", "task_domain", "source_model"])
def test_an_experience_metadata_label_is_masked(rig: Rig, field: str) -> None:
    record = speed_record(exp_id=f"exp-md-{field}")
    record["metadata"][field] = "jane.doe@example.com"
    r = _json(rig, "POST", "/v1/experiences", record)
    assert r.status_code == 201, r.text
    for read in (r, _json(rig, "GET", f"/v1/experiences/exp-md-{field}"),
                 _json(rig, "GET", f"/v1/experiences/exp-md-{field}", params={"format": "v1.2"})):
        assert read.status_code in (200, 201) and "jane.doe@example.com" not in read.text, read.text
    assert r.json()["record"]["metadata"][field] == "[EMAIL]", r.json()["record"]["metadata"]


def test_an_experience_metadata_label_is_refused_under_reject(rig: Rig) -> None:
    record = speed_record(exp_id="exp-md-reject")
    record["metadata"]["reviewer"] = "jane.doe@example.com"
    r = _json(rig, "POST", "/v1/experiences", record, tenant="strict")
    assert assert_envelope(r, 400, "metadata.reviewer")["code"] == "personal_data"


def test_a_segmented_turn_files_its_task_domain_masked(rig: Rig) -> None:
    body = CHAT | {"metadata": {"reasoning": "segmented", "task_domain": "jane.doe@example.com"}}
    r = _json(rig, "POST", "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    exp_id = r.json()["recallserve"]["experience"]["id"]
    got = _json(rig, "GET", f"/v1/experiences/{exp_id}")
    assert got.status_code == 200 and "jane.doe@example.com" not in got.text, got.text


def test_a_memory_image_hash_is_masked_on_disk(rig: Rig, tmp_path: Path) -> None:
    r = _json(rig, "POST", "/v1/memories", {"memories": [{"text": "photo of the kettle", "source_id": "img-1",
                                                           "image_hash": "jane.doe@example.com"}]})
    assert r.status_code == 200, r.text
    on_disk = [p for p in tmp_path.rglob("*") if p.is_file() and b"jane.doe@example.com" in p.read_bytes()]
    assert on_disk == [], on_disk


# ---- masking keeps what was acknowledged, and finds it as it was sent ---------------------------

def test_two_metadata_keys_with_personal_data_stay_two_keys(rig: Rig) -> None:
    sent = {"jane.doe@example.com": "first", "john.roe@example.org": "second", "plain": "third"}
    r = _json(rig, "POST", "/v1/memories", {"memories": [{"text": "contacts", "metadata": sent}]})
    assert r.status_code == 200, r.text
    got = _json(rig, "GET", f"/v1/memories/{r.json()['ids'][0]}").json()["metadata"]
    assert sorted(got.values()) == ["first", "second", "third"], got
    assert "example" not in json.dumps(got), got


@pytest.mark.parametrize("filters", [{"metadata": {"owner": "jane.doe@example.com"}},
                                     {"metadata": {"jane.doe@example.com": "yes"}},
                                     {"topic_prefix": "crm/jane.doe@example.com"}], ids=["value", "key", "topic"])
def test_a_filter_finds_a_memory_by_the_personal_data_it_was_sent_with(rig: Rig, filters: dict[str, Any]) -> None:
    memory = {"text": "the renewal call went well", "topic": "crm/jane.doe@example.com/calls",
              "metadata": {"owner": "jane.doe@example.com", "jane.doe@example.com": "yes"}}
    assert _json(rig, "POST", "/v1/memories", {"memories": [memory]}).status_code == 200
    r = _json(rig, "POST", "/v1/memories/search", {"query": "renewal call", "filters": filters})
    assert r.status_code == 200, r.text
    assert [h["text"] for h in r.json()["data"]] == [memory["text"]], r.text


def test_an_experience_search_finds_a_domain_by_the_personal_data_it_was_sent_with(rig: Rig) -> None:
    domain = "units-jane.doe@example.com"
    created = _json(rig, "POST", "/v1/experiences", speed_record(domain=domain))
    assert created.status_code == 201, created.text
    assert "example.com" not in created.text
    body = {"query": "car speed", "source_model": "Qwen2.5-Coder-1.5B-Instruct", "domain": domain}
    r = _json(rig, "POST", "/v1/experiences/search", body)
    assert r.status_code == 200, r.text
    assert [h["experience"]["record"]["metadata"]["id"] for h in r.json()["hits"]] == \
        [created.json()["record"]["metadata"]["id"]], r.text
