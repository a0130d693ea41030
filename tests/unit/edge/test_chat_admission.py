"""Concurrent chat turns on one key (issue 37, Deliver 5): every turn that can be served in time is
answered; one that cannot is refused in the API's JSON envelope with ``Retry-After``.

The whole ingress app in-process (``build_app``: real memory, session, trace stores) with the
cpu-local profile's ``chat.admission`` and a scripted engine that takes ``DELAY_S`` per call, so the
reasoner's slots (``max_in_flight``) are the bottleneck, as on a real node.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from recallserve.deployments.config import load_config
from recallserve.serve.memory_api.admission import SearchAdmissionConfig
from recallserve.serve.pipeline import PipelineSettings
from tests.unit.edge.conftest import FixedEngine, build_app, headers

DELAY_S = 0.2


def _body(i: int) -> dict[str, object]:
    return {"model": "recallserve", "max_tokens": 16,
            "messages": [{"role": "user", "content": f"Where is my order 1042{i:02d}?"}]}


async def _gather(app, n: int, tenants: list[str]) -> list[httpx.Response]:  # type: ignore[no-untyped-def]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as client:
        return await asyncio.gather(*(client.post("/v1/chat/completions", json=_body(i),
                                                  headers=headers(tenants[i % len(tenants)])) for i in range(n)))


def _engine(delay_s: float = DELAY_S) -> FixedEngine:
    engine = FixedEngine()
    engine.delay_s = delay_s
    return engine


@pytest.mark.parametrize("clients", [8, 32])
def test_concurrent_chats_on_one_key_are_all_answered(tmp_path: Path, clients: int) -> None:
    chat = load_config("cpu-local").chat
    assert 0 < chat.admission.max_in_flight <= clients <= chat.admission.max_in_flight + chat.admission.max_waiting
    engine = _engine()
    app, memory = build_app(tmp_path, engine=engine, settings=chat.model_copy(update={"write_back": False}))
    try:
        answers = asyncio.run(_gather(app, clients, ["acme"]))
    finally:
        for shard in memory.coordinator.shards:
            shard.shard.close()
    assert [r.status_code for r in answers] == [200] * clients, [r.text for r in answers if r.status_code != 200][:2]
    assert all(r.json()["choices"][0]["message"]["content"] for r in answers)
    assert len(engine.calls) >= clients  # every turn reached the engine


def test_a_turn_that_cannot_be_served_in_time_gets_the_envelope_with_retry_after(tmp_path: Path) -> None:
    # NOTE: one slot, one waiting place: of 4 turns at once, one runs, one waits and is answered, and two
    # are refused (queue full at once, or pushed out) in the API's envelope, never a bare 503.
    admission = SearchAdmissionConfig(max_in_flight=1, max_waiting=1, max_wait_s=30, retry_after_s=3)
    app, memory = build_app(tmp_path, engine=_engine(),
                            settings=PipelineSettings(admission=admission, write_back=False))
    try:
        answers = asyncio.run(_gather(app, 4, ["acme"]))
    finally:
        for shard in memory.coordinator.shards:
            shard.shard.close()
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 200, 503, 503], [r.text for r in answers]
    for r in answers:
        if r.status_code == 503:
            err = r.json()["error"]
            assert set(r.json()) == {"error"} and err["code"] == "chat_overloaded" and err["type"] == "service_unavailable"
            assert r.headers["retry-after"] == "3" and r.headers.get("x-request-id")


def test_a_waiting_turn_past_its_deadline_is_refused_and_another_tenant_is_served_in_turn(tmp_path: Path) -> None:
    # NOTE: one slot, turns of 0.5 s, a deadline of 2.5 turns: acme's first turn runs, its second and
    # globex's wait; the slot goes to the tenants in turn (acme's 2nd at ~0.5 s, globex at ~1.0 s, both in
    # time), and acme's fourth, which would start at ~1.5 s, could not be served in time: 503 + Retry-After.
    admission = SearchAdmissionConfig(max_in_flight=1, max_waiting=8, max_wait_s=1.25, retry_after_s=1)
    app, memory = build_app(tmp_path, engine=_engine(0.5),
                            settings=PipelineSettings(admission=admission, write_back=False))
    try:
        answers = asyncio.run(_gather(app, 4, ["acme", "acme", "globex", "acme"]))
    finally:
        for shard in memory.coordinator.shards:
            shard.shard.close()
    assert [r.status_code for r in answers] == [200, 200, 200, 503], [r.text for r in answers]
    assert answers[3].headers["retry-after"] == "1" and answers[3].json()["error"]["code"] == "chat_overloaded"


def test_a_streamed_turn_gives_its_slot_back_when_the_stream_ends(tmp_path: Path) -> None:
    # NOTE: one slot and no waiting place: the second stream is answered only once the first one's slot is back.
    admission = SearchAdmissionConfig(max_in_flight=1, max_waiting=0, max_wait_s=1, retry_after_s=1)
    app, memory = build_app(tmp_path, engine=_engine(0.0), settings=PipelineSettings(admission=admission, write_back=False))

    async def two_streams() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
            return [await client.post("/v1/chat/completions", json={**_body(i), "stream": True},
                                      headers=headers("acme")) for i in range(2)]
    try:
        answers = asyncio.run(two_streams())
    finally:
        for shard in memory.coordinator.shards:
            shard.shard.close()
    assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
    assert all("data: [DONE]" in r.text for r in answers)
