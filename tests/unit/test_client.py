"""``recallserve.client``: typed answers and the API's errors from the real app (in process, over
``httpx.ASGITransport``), and the retry rules (429/503, ``Retry-After``, which methods) against a
scripted transport, the only way to make a server answer 429 on cue."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from recallserve.client import AsyncRecallServe, ConnectionFailed, RecallServe, RecallServeError, RetryPolicy
from recallserve.serve.memory_api import AddMemoriesResponse, MemoryOut, SearchResponse
from tests.unit.edge.conftest import build_app


def test_typed_answers_and_api_errors_from_the_real_app(tmp_path: Path) -> None:
    app, memory = build_app(tmp_path)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with AsyncRecallServe("http://rs", "sk-acme", transport=transport) as rs:
                added = await rs.memories.add([{"text": "The gate code is 4471.", "source_id": "gate"}])
                assert isinstance(added, AddMemoriesResponse) and len(added.ids) == 1
                found = await rs.memories.search("gate code", k=2, filters={"kinds": ["text"]})
                assert isinstance(found, SearchResponse) and found.data[0].id == added.ids[0]
                got = await rs.memories.get(added.ids[0])
                assert isinstance(got, MemoryOut) and got.text == "The gate code is 4471."
                assert [m.id for m in (await rs.memories.list("gate")).data] == added.ids
                with pytest.raises(RecallServeError) as bad:
                    await rs.memories.search("gate", k=1000)
                assert (bad.value.status, bad.value.param, bad.value.type) == (400, "k", "invalid_request_error")
                assert bad.value.message == "k: Input should be less than or equal to 200" and bad.value.request_id
                assert (await rs.memories.delete(added.ids[0])).deleted
                with pytest.raises(RecallServeError) as gone:
                    await rs.memories.get(added.ids[0])
                assert gone.value.status == 404
                assert (await rs.health())["status"] == "ok"
                answer = await rs.ask("Hello?", session_id="s1")
                assert answer.choices[0].message.content
                assert (await rs.sessions.get("s1")).message_count == 2
                assert (await rs.turns.list(limit=5)).data
            async with AsyncRecallServe("http://rs", "sk-nope", transport=transport) as stranger:
                with pytest.raises(RecallServeError) as denied:
                    await stranger.memories.search("gate")
                assert (denied.value.status, denied.value.code) == (401, "invalid_api_key")

    try:
        asyncio.run(main())
    finally:
        for shard_client in memory.coordinator.shards:
            shard_client.shard.close()


def _scripted(answers: list[httpx.Response | Exception], seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    return httpx.MockTransport(handle)


OK_SEARCH = httpx.Response(200, json={"object": "list", "data": []})
BUSY = {"error": {"message": "memory search overloaded: queue full; retry after 2 s", "type": "service_unavailable",
                  "param": None, "code": "overloaded"}}


def test_429_and_503_are_retried_after_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr("recallserve.client._client.time.sleep", waits.append)
    seen: list[httpx.Request] = []
    answers: list[httpx.Response | Exception] = [httpx.Response(429, json=BUSY, headers={"retry-after": "3"}),
                                                 httpx.Response(503, json=BUSY), OK_SEARCH]
    with RecallServe("http://rs", "k", transport=_scripted(answers, seen), retry=RetryPolicy(backoff_s=0.25)) as rs:
        assert rs.memories.search("x").data == []
    # NOTE: the first wait is the server's Retry-After; the second (none sent) the backoff 0.25 x 2^1.
    assert waits == [3.0, 0.5] and len(seen) == 3 and seen[0].headers["authorization"] == "Bearer k"


def test_the_last_refusal_is_raised_with_its_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("recallserve.client._client.time.sleep", lambda s: None)
    answers: list[httpx.Response | Exception] = [httpx.Response(503, json=BUSY, headers={"retry-after": "2"})] * 3
    with RecallServe("http://rs", transport=_scripted(answers, []), retry=RetryPolicy(max_retries=2)) as rs:
        with pytest.raises(RecallServeError) as refused:
            rs.memories.add([{"text": "a"}])
    assert (refused.value.status, refused.value.code, refused.value.retry_after_s) == (503, "overloaded", 2.0)
    assert refused.value.message == BUSY["error"]["message"]


def test_a_failed_connection_is_retried_for_reads_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("recallserve.client._client.time.sleep", lambda s: None)
    seen: list[httpx.Request] = []
    down = httpx.ConnectError("refused")
    with RecallServe("http://rs", transport=_scripted([down, httpx.Response(200, json={"status": "ok"})], seen)) as rs:
        assert rs.health() == {"status": "ok"}
    seen.clear()
    # NOTE: a POST that got no answer may have been applied: raised at once, not repeated.
    with RecallServe("http://rs", transport=_scripted([down, OK_SEARCH], seen)) as rs:
        with pytest.raises(ConnectionFailed, match="POST /v1/memories: no answer"):
            rs.memories.add([{"text": "a"}])
    assert len(seen) == 1


def test_streaming_is_left_to_the_openai_sdk() -> None:
    with RecallServe("http://rs") as rs:
        assert rs.openai_base_url == "http://rs/v1"
        with pytest.raises(ValueError, match="stream: use the OpenAI SDK"):
            rs.chat([{"role": "user", "content": "hi"}], stream=True)


def test_a_refusal_keeps_what_a_load_test_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Status, code, message, Retry-After, request id, and whether the answer was the API's envelope:
    a proxy's plain-text 503 is not, and its text is the message (``refusal_kind`` reads it)."""
    monkeypatch.setattr("recallserve.client._client.time.sleep", lambda s: None)
    proxy = httpx.Response(503, text="Request dropped due to backpressure (num_queued_requests=9).",
                           headers={"x-request-id": "r-1"})
    answers: list[httpx.Response | Exception] = [
        httpx.Response(503, json=BUSY, headers={"retry-after": "2", "x-request-id": "r-0"}), proxy,
        httpx.ReadTimeout("slow")]
    with RecallServe("http://rs", transport=_scripted(answers, []), retry=RetryPolicy(max_retries=0)) as rs:
        with pytest.raises(RecallServeError) as api:
            rs.memories.search("x")
        with pytest.raises(RecallServeError) as other:
            rs.memories.search("x")
        with pytest.raises(ConnectionFailed) as none:
            rs.memories.search("x")
    assert (api.value.status, api.value.code, api.value.retry_after_s, api.value.request_id, api.value.enveloped) == \
        (503, "overloaded", 2.0, "r-0", True)
    assert (other.value.status, other.value.retry_after_s, other.value.request_id, other.value.enveloped) == \
        (503, None, "r-1", False)
    assert other.value.message.startswith("HTTP 503: Request dropped due to backpressure")
    assert (none.value.status, none.value.reason, none.value.enveloped) == (0, "ReadTimeout", False)


def test_models_lists_the_chat_models_of_the_real_app(tmp_path: Path) -> None:
    app, memory = build_app(tmp_path)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            async with AsyncRecallServe("http://rs", "sk-acme", transport=httpx.ASGITransport(app=app)) as rs:
                listed = await rs.models()
                assert listed["object"] == "list" and listed["data"] and listed["data"][0]["object"] == "model"
            async with AsyncRecallServe("http://rs", "sk-nope", transport=httpx.ASGITransport(app=app)) as stranger:
                with pytest.raises(RecallServeError) as denied:
                    await stranger.models()
                assert (denied.value.status, denied.value.code, denied.value.enveloped) == (401, "invalid_api_key", True)

    try:
        asyncio.run(main())
    finally:
        for shard_client in memory.coordinator.shards:
            shard_client.shard.close()
