"""Finite and bounded input through HTTP: NaN/Infinity and oversized fields are 400s naming the
field, a body over the cap is a 413, a malformed request id a 400, all in the error envelope."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from recallserve.serve.agent.images import MAX_IMAGE_BYTES
from recallserve.serve.api.chat_protocol import MAX_IMAGE_URL_CHARS
from tests.unit.edge.conftest import assert_envelope, build_app, headers

MB = "x" * 2**20


def _post(client: TestClient, path: str, raw: str):  # type: ignore[no-untyped-def]
    """POST a raw JSON text (NaN / Infinity are literals Python's JSON parser accepts)."""
    return client.post(path, content=raw, headers={**headers("acme"), "content-type": "application/json"})


_EXP = ('{"metadata": {"source_model": "m", "timestamp": %s}, "context": {"raw_text": "q", '
        '"quantities": [{"name": "d", "value": %s}]}, "outcome": {"answer": "a"}}')


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/memories", '{"memories": [{"text": "a", "created_at": NaN}]}', "memories.0.created_at"),
    ("/v1/memories", '{"memories": [{"text": "a", "expires_at": Infinity}]}', "memories.0.expires_at"),
    ("/v1/memories", '{"memories": [{"text": "a", "metadata": {"w": -Infinity}}]}', "memories.0.metadata"),
    ("/v1/memories", '{"memories": [{"text": "a", "retention_weight": NaN}]}', "memories.0.retention_weight"),
    ("/v1/memories/search", '{"query": "a", "threshold": NaN}', "threshold"),
    ("/v1/memories/search", '{"query": "a", "decay": {"decay_lambda": Infinity}}', "decay.decay_lambda"),
    ("/v1/memories/search", '{"query": "a", "filters": {"created_after": NaN}}', "filters.created_after"),
    ("/v1/experiences", _EXP % ("1.0", "NaN"), "context.quantities.0.value"),
    ("/v1/experiences", _EXP % ("Infinity", "1.0"), "metadata.timestamp"),
    ("/v1/experiences", _EXP % ("1e300", "1.0"), "metadata.timestamp"),
    ("/v1/chat/completions", '{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}',
     "temperature"),
])
def test_non_finite_numbers_are_400_naming_the_field(client: TestClient, path: str, raw: str, param: str) -> None:
    assert_envelope(_post(client, path, raw), 400, param)


def test_non_finite_inside_free_form_values(client: TestClient) -> None:
    raw = ('{"metadata": {"source_model": "m"}, "context": {"raw_text": "q"}, "outcome": {"answer": "a"}, '
           '"verification": [{"type": "recomputation", "target": "1+1", "input": {"x": NaN}}]}')
    err = assert_envelope(_post(client, "/v1/experiences", raw), 400, "verification.0.input")
    assert "input.x" in err["message"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/memories", {"memories": [{"text": "a", "metadata": {"k": MB}}]}, "memories.0.metadata"),
    ("/v1/memories", {"memories": [{"text": "a", "metadata": {f"k{i}": i for i in range(65)}}]}, "memories.0.metadata"),
    ("/v1/memories", {"memories": [{"text": "a", "metadata": {"k" * 129: 1}}]}, "memories.0.metadata"),
    ("/v1/memories", {"memories": [{"text": "a", "error_tags": [MB]}]}, "memories.0.error_tags.0"),
    ("/v1/memories", {"memories": [{"text": "a", "error_tags": ["t"] * 33}]}, "memories.0.error_tags"),
    ("/v1/memories/search", {"query": "a", "filters": {"kinds": ["text"] * 17}}, "filters.kinds"),
    ("/v1/experiences", {"metadata": {"source_model": "m"}, "context": {"raw_text": "q", "constraints": [MB]},
                         "outcome": {"answer": "a"}}, "context.constraints.0"),
    ("/v1/experiences", {"metadata": {"source_model": "m"}, "context": {"raw_text": "q"}, "outcome": {"answer": "a"},
                         "verification": [{"type": "recomputation", "target": "1", "expected": MB}]},
     "verification.0.expected"),
    ("/v1/experiences/search", {"source_model": "m", "error_tags": [MB]}, "error_tags"),
    ("/v1/chat/completions", {"model": "m", "metadata": {"session_id": MB}, "messages": [{"role": "user", "content": "hi"}]},
     "metadata.session_id"),
    ("/v1/chat/completions", {"model": "m", "stop": [MB], "messages": [{"role": "user", "content": "hi"}]}, None),
])
def test_oversized_fields_are_400(client: TestClient, path: str, body: dict, param: str | None) -> None:
    err = assert_envelope(client.post(path, json=body, headers=headers("acme")), 400)
    if param is not None:
        assert err["param"] == param, err


def test_image_url_bounded_by_the_largest_image() -> None:
    assert MAX_IMAGE_URL_CHARS >= MAX_IMAGE_BYTES * 4 // 3 + 64


def test_image_url_over_the_bound_is_400(client: TestClient) -> None:
    url = "data:image/png;base64," + "A" * MAX_IMAGE_URL_CHARS
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
    assert_envelope(client.post("/v1/chat/completions", json=body, headers=headers("acme")), 400,
                    "messages.0.content.0.image_url.url")


def test_request_id_bounded(client: TestClient) -> None:
    err = assert_envelope(client.get("/v1/models", headers=headers("acme", **{"x-request-id": "r" * 129})), 400,
                          "x-request-id")
    assert "x-request-id" in err["message"]
    assert_envelope(client.get("/v1/models", headers=headers("acme", **{"x-request-id": "a b\tc"})), 400, "x-request-id")
    ok = client.get("/v1/models", headers=headers("acme", **{"x-request-id": "trace-1:a.b_c"}))
    assert ok.status_code == 200 and ok.headers["x-request-id"] == "trace-1:a.b_c"


def test_body_over_the_cap_is_413(tmp_path: Path) -> None:
    app, memory = build_app(tmp_path, max_body_bytes=4096)
    body = {"memories": [{"text": "x" * 8000}]}
    with TestClient(app, raise_server_exceptions=False) as c:
        err = assert_envelope(c.post("/v1/memories", json=body, headers=headers("acme")), 413)
        assert err["code"] == "request_too_large"

        def chunks():  # no content-length: counted as it streams in
            yield b'{"memories": [{"text": "'
            for _ in range(10):
                yield b"x" * 1000
            yield b'"}]}'

        err = assert_envelope(c.post("/v1/memories", content=chunks(), headers=headers("acme")), 413)
        assert err["code"] == "request_too_large"
        assert c.post("/v1/memories", json={"memories": [{"text": "small"}]}, headers=headers("acme")).status_code == 200
    for shard_client in memory.coordinator.shards:
        shard_client.shard.close()


def test_errors_all_in_the_envelope(client: TestClient) -> None:
    assert_envelope(client.get("/v1/nowhere", headers=headers("acme")), 404)
    assert_envelope(client.get("/v1/experiences/nope", headers=headers("acme")), 404)
    assert_envelope(client.post("/v1/memories", content="{not json", headers={**headers("acme"),
                                                                              "content-type": "application/json"}), 400)
    assert_envelope(client.get("/v1/models"), 401)
