"""The PII policy on every write path, through HTTP: masked by default, 400 under ``reject``,
kept under ``allow``; the ids the agent needs stay on every path; logs are masked always."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from recallserve.serve.pii import mask_pii, pii_kinds
from tests.unit.edge.conftest import IDS, IDS_TEXT, PII_TEXT, RAW, assert_envelope, headers, wait_for_source

TEXT = f"{PII_TEXT} {IDS_TEXT}"


def _raw_in(text: str) -> list[str]:
    return [r for r in RAW if r in text]


def _experience(text: str) -> dict:
    return {"metadata": {"source_model": "qwen2.5-7b", "topic": "support/refunds"},
            "context": {"raw_text": text, "constraints": ["reach me at jane.doe@example.com"]},
            "reasoning": [{"step_id": 1, "text": "look up order 104208", "evidence": "card 4111 1111 1111 1111"}],
            "outcome": {"answer": "refund order 104208"}}


@pytest.mark.parametrize("variant", [
    "card 4111-1111-1111-1111", "card 4111111111111111", "phone (415) 555-0100", "phone 415.555.0100",
    "mobile 13812345678", "手机13812345678", "tel: 020 7946 0958", "SSN 123-45-6789", "national id 110105194912310021",
    "NI number QQ123456C", "passport no. X1234567", "e-mail JANE.DOE+x@Example.co.uk",
    "IBAN GB82WEST12345698765432", "my PIN is 4821", "passcode: s3cr3t", "password = 'hunter 2'", "密码是abc123",
])
def test_masker_covers_each_variant_and_keeps_ids(variant: str) -> None:
    masked = mask_pii(f"{variant}; {IDS_TEXT}")
    assert pii_kinds(variant), variant
    assert masked.endswith(IDS_TEXT) and not pii_kinds(masked), masked


def test_card_without_luhn_and_business_ids_are_not_personal() -> None:
    # a hex id whose tail reads like a mobile number (an erasure id in a log line) stays in the clear
    for text in ["tracking 4111 1111 1111 1112", IDS_TEXT, "on 2024-05-06 at 10:30 paid $249.99", "model AB-1234X",
                 "erasure er_e2648879a1ae4912a76aa13501748329 done"]:
        assert pii_kinds(text) == [], text


def test_direct_memory_write_masked_by_default(client: TestClient) -> None:
    r = client.post("/v1/memories", headers=headers("acme"), json={"memories": [{
        "text": TEXT, "source_id": "note:1", "metadata": {"email": "jane.doe@example.com", "phone": 14155550100,
                                                           "order": "104208"},
        "parts": [{"name": "photo", "text": "receipt for card 4111 1111 1111 1111"}], "ocr_text": "SSN 123-45-6789"}]})
    assert r.status_code == 200, r.text
    got = client.get(f"/v1/memories/{r.json()['ids'][0]}", headers=headers("acme")).json()
    stored = str(got)
    assert _raw_in(stored) == [] and "14155550100" not in stored, stored
    assert all(i in got["text"] for i in IDS) and got["metadata"]["order"] == "104208"
    assert "[CARD_NUMBER]" in got["text"] and got["metadata"]["email"] == "[EMAIL]"


def test_direct_memory_write_rejected_naming_the_field(client: TestClient) -> None:
    r = client.post("/v1/memories", headers=headers("strict"), json={"memories": [{"text": IDS_TEXT}, {"text": TEXT}]})
    err = assert_envelope(r, 400, "memories.1.text")
    assert err["code"] == "personal_data" and "card_number" in err["message"]
    r = client.post("/v1/memories", headers=headers("strict"),
                    json={"memories": [{"text": IDS_TEXT, "metadata": {"contact": "jane.doe@example.com"}}]})
    assert_envelope(r, 400, "memories.0.metadata.contact")
    # Business ids alone are not personal data, even under reject.
    assert client.post("/v1/memories", headers=headers("strict"),
                       json={"memories": [{"text": IDS_TEXT}]}).status_code == 200


def test_direct_memory_write_kept_under_allow(client: TestClient) -> None:
    r = client.post("/v1/memories", headers=headers("lab"), json={"memories": [{"text": TEXT}]})
    got = client.get(f"/v1/memories/{r.json()['ids'][0]}", headers=headers("lab")).json()
    assert got["text"] == TEXT


def test_experience_record_and_its_memories_masked(client: TestClient) -> None:
    r = client.post("/v1/experiences", headers=headers("acme"), json=_experience(TEXT))
    assert r.status_code == 201, r.text
    exp_id = r.json()["record"]["metadata"]["id"]
    record = client.get(f"/v1/experiences/{exp_id}", headers=headers("acme")).json()["record"]
    assert _raw_in(str(record)) == [] and all(i in record["context"]["raw_text"] for i in IDS), record
    segments = wait_for_source(client, "acme", f"experience:{exp_id}:context")
    assert segments and _raw_in(str(segments)) == [] and "104208" in segments[0]["text"]


def test_experience_rejected_and_allowed(client: TestClient) -> None:
    assert_envelope(client.post("/v1/experiences", headers=headers("strict"), json=_experience(TEXT)), 400,
                    "context.raw_text")
    r = client.post("/v1/experiences", headers=headers("lab"), json=_experience(TEXT))
    assert r.status_code == 201 and r.json()["record"]["context"]["raw_text"] == TEXT


def test_experience_label_note_masked(client: TestClient) -> None:
    exp_id = client.post("/v1/experiences", headers=headers("acme"), json=_experience(IDS_TEXT)).json()["record"][
        "metadata"]["id"]
    r = client.post(f"/v1/experiences/{exp_id}/label", headers=headers("acme"),
                    json={"label": "wrong", "note": "customer phone +1 415 555 0100"})
    assert r.status_code == 200 and r.json()["record"]["evaluation"]["review_note"] == "customer phone [PHONE]"


def _chat(client: TestClient, tenant: str, request_id: str, text: str = TEXT):  # type: ignore[no-untyped-def]
    return client.post("/v1/chat/completions", headers=headers(tenant, **{"x-request-id": request_id}),
                       json={"model": "recallserve", "user": "u1", "metadata": {"session_id": "s1"},
                             "messages": [{"role": "user", "content": text}]})


def test_chat_session_entities_summary_and_write_back_masked(client: TestClient) -> None:
    assert _chat(client, "acme", "req-1").status_code == 200
    written = wait_for_source(client, "acme", "chat:u1:req-1")
    assert written and _raw_in(written[0]["text"]) == [] and "104208" in written[0]["text"]
    r = client.post("/v1/sessions/s1/summary", params={"user": "u1"}, headers=headers("acme"))
    assert r.status_code == 200 and r.json()["refreshed"], r.text
    session = client.get("/v1/sessions/s1", params={"user": "u1"}, headers=headers("acme")).json()
    assert session["summary"]["text"] and _raw_in(str(session)) == [], session
    assert "LC-448812" in {e["value"] for e in session["entities"]}, session["entities"]


def test_chat_rejected_before_anything_is_stored(client: TestClient) -> None:
    err = assert_envelope(_chat(client, "strict", "req-2"), 400, "messages.0.content")
    assert err["code"] == "personal_data"
    assert client.get("/v1/sessions/s1", params={"user": "u1"}, headers=headers("strict")).status_code == 404
    assert _chat(client, "strict", "req-3", IDS_TEXT).status_code == 200


def test_chat_write_back_kept_under_allow(client: TestClient) -> None:
    assert _chat(client, "lab", "req-4").status_code == 200
    written = wait_for_source(client, "lab", "chat:u1:req-4")
    assert written and "hunter2" in written[0]["text"] and "4111 1111 1111 1111" in written[0]["text"]


def test_unexpected_error_logged_masked_with_request_id(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        r = client.get("/v1/boom", headers={"x-request-id": "boom-1"})
        logging.getLogger("recallserve.test").info("user said %s", PII_TEXT)
    err = assert_envelope(r, 500)
    assert "boom-1" in err["message"] and r.headers["x-request-id"] == "boom-1"
    assert "boom-1" in caplog.text and "[CARD_NUMBER]" in caplog.text
    assert _raw_in(caplog.text) == [], caplog.text
