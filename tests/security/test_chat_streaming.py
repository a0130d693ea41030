"""A streamed chat turn the client leaves is still a whole turn.

A client that closed a stream mid-answer lost the turn: the server abandoned the stream's
generator at the next chunk, before the session append, the trace and the write-back (a plain
request whose client left was stored in full); under ASGI spec 2.4 the disconnect was also logged
as an unhandled server error with its traceback. A stream read to the end is unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest

from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import ANSWER, headers

CHAT: dict[str, Any] = {"model": "recallserve", "metadata": {"agent": "off"},
                        "messages": [{"role": "user", "content": "hi"}]}


def _json(rig: Rig, method: str, url: str, body: Any = None, tenant: str = A, **kw: Any) -> Any:
    return rig.client.request(method, url, json=body, headers=headers(tenant), **kw)


def _until(check: Any, timeout_s: float = 10.0) -> Any:
    """``check()`` once truthy (polled), else its last value."""
    deadline = time.monotonic() + timeout_s
    while not (got := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


# ---- a client that leaves mid-stream -------------------------------------------------------------

async def _leave_after_first_chunk(rig: Rig, session_id: str, spec_version: str) -> list[dict[str, Any]]:
    """POST a streamed chat turn straight to the ASGI app, and close the connection once the first
    chunk arrived: ASGI 2.0-2.3 servers say so with ``http.disconnect`` (uvicorn), 2.4 ones make the
    next send fail with ``OSError``."""
    body = json.dumps(CHAT | {"stream": True, "metadata": {"agent": "off", "session_id": session_id}}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": spec_version}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
             "headers": [(b"authorization", b"Bearer sk-acme"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()), (b"host", b"testserver")]}
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()
    request = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if request:
            return request.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if gone.is_set() and spec_version >= "2.4":
            raise OSError("connection closed by the client")
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            gone.set()
            await asyncio.sleep(0.05)  # NOTE: the server notices the disconnect before the next chunk

    await rig.app(scope, receive, send)
    return sent


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
def test_a_client_leaving_mid_stream_keeps_its_turn(rig: Rig, spec_version: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    sid = f"left-{spec_version}"
    with caplog.at_level(logging.INFO, logger="recallserve.api"):
        sent = rig.client.portal.call(_leave_after_first_chunk, rig, sid, spec_version)
    assert sent[0]["status"] == 200
    chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
    assert len(chunks) == 1 and b"[DONE]" not in chunks[0]["body"], chunks

    def stored() -> bool:
        r = _json(rig, "GET", f"/v1/sessions/{sid}")
        return r.status_code == 200 and r.json()["message_count"] == 2

    assert _until(stored), _json(rig, "GET", f"/v1/sessions/{sid}").text
    turns = _until(lambda: _json(rig, "GET", "/v1/turns", params={"session_id": sid}).json()["data"])
    assert [t["session_id"] for t in turns] == [sid], turns
    assert not [r for r in caplog.records if "unhandled error" in r.getMessage()], caplog.text


def test_a_stream_read_to_the_end_is_unchanged(rig: Rig) -> None:
    body = CHAT | {"stream": True, "stream_options": {"include_usage": True},
                   "metadata": {"agent": "off", "session_id": "whole"}}
    r = _json(rig, "POST", "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == ANSWER
    assert chunks[-1]["usage"]["total_tokens"] > 0, chunks[-1]
    assert _json(rig, "GET", "/v1/sessions/whole").json()["message_count"] == 2
