"""The ingress HTTP app in-process, answering with the real tiny model (SmolLM2-135M on llama.cpp)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from recallserve.deployments.engines import LlamaCppConfig, LlamaCppEngine
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings

AUTH = {"Authorization": "Bearer sk-test"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    engine = LlamaCppEngine(LlamaCppConfig(model="smollm2-135m-instruct-q4_1", n_ctx=1024, n_threads=1))
    pipeline = ChatPipeline(engine, PipelineSettings(model_name="recallserve", max_request_tokens=64))
    app = create_app(pipeline, Authenticator({"sk-test": "acme"}))
    with TestClient(app) as c:
        yield c


def _body(**kw: object) -> dict[str, object]:
    body: dict[str, object] = {"model": "recallserve", "messages": [{"role": "user", "content": "Say hello."}],
                               "max_tokens": 8}
    body.update(kw)
    return body


def test_health_and_models(client: TestClient) -> None:
    assert client.get("/healthz").json()["status"] == "ok"
    r = client.get("/v1/models", headers=AUTH)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["recallserve"]


@pytest.mark.parametrize("headers, code", [({}, "missing_api_key"), ({"Authorization": "Bearer nope"}, "invalid_api_key")])
def test_missing_or_unknown_key_is_401(client: TestClient, headers: dict[str, str], code: str) -> None:
    r = client.post("/v1/chat/completions", json=_body(), headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == code


@pytest.mark.parametrize(
    "body, param",
    [
        (_body(messages=[]), "messages"),
        (_body(messages=[{"role": "robot", "content": "x"}]), "messages.0.role"),
        (_body(n=2), "n"),
        (_body(temperature=5), "temperature"),
        (_body(max_tokens=0), "max_tokens"),
        (_body(surprise=True), "surprise"),
        (_body(logprobs=True), "logprobs"),
        (_body(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}] * 9}]), "messages.0.content"),
        (_body(messages=[{"role": "user", "content": "x" * 150_000}] * 7), "messages"),
    ],
)
def test_bad_requests_get_400_naming_the_field(client: TestClient, body: dict[str, object], param: str) -> None:
    r = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert param in (err["param"] or "") + err["message"]


def test_over_limit_max_tokens_and_unknown_model(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json=_body(max_tokens=100000), headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = client.post("/v1/chat/completions", json=_body(model="gpt-9"), headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_not_json_is_400(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", content=b"{not json", headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 400


def test_completion_has_openai_shape(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json=_body(), headers=AUTH)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion"
    assert data["choices"][0]["message"]["content"].strip()
    assert data["choices"][0]["finish_reason"] in ("stop", "length")
    assert data["usage"]["completion_tokens"] >= 1
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + data["usage"]["completion_tokens"]
    assert 0 <= data["usage"]["prompt_tokens_details"]["cached_tokens"] <= data["usage"]["prompt_tokens"]
    assert r.headers["x-request-id"]


def test_streaming_sends_chunks_then_done(client: TestClient) -> None:
    body = _body(stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.strip()
    assert chunks[-1]["usage"]["completion_tokens"] >= 1
    assert any(c["choices"] and c["choices"][0].get("finish_reason") for c in chunks)


def test_metrics_count_requests_and_tokens(client: TestClient) -> None:
    client.post("/v1/chat/completions", json=_body(), headers=AUTH)
    text = client.get("/metrics").text
    assert 'recallserve_http_requests_total{method="POST",route="/v1/chat/completions",status="200"}' in text
    assert 'recallserve_tokens_total{direction="completion",role="reasoner"}' in text


def test_reserved_tenant_names_are_refused() -> None:
    """No key may map to a ``__`` tenant: the ingress's start-up recall runs as ``__warm_up__``."""
    from recallserve.deployments.ingress import WARM_UP_TENANT
    from recallserve.serve.api.auth import RESERVED_TENANT_PREFIX, Authenticator

    assert WARM_UP_TENANT.startswith(RESERVED_TENANT_PREFIX)
    with pytest.raises(ValueError, match="reserved for the server's own use"):
        Authenticator({"sk-a": "acme", "sk-w": WARM_UP_TENANT})
    assert Authenticator({"sk-a": "acme_corp"}).tenant_for("sk-a") == "acme_corp"
