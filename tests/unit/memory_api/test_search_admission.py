"""Admission of API searches (``serve.memory_api.admission``): slots, a bounded wait, a fast 503 with Retry-After.

No timings are asserted: a held slot is an unset event, so who waits and who is refused is decided
by the counts alone; the one timeout used (a wait that can never get a slot) only ends the test.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from serve.memory_api import MemoryOverloaded, SearchAdmission, SearchAdmissionConfig
from serve.memory_api.admission import AdmissionRefused
from tests.unit.memory_api.conftest import auth, close_service, make_app, make_service


async def _hold(admission: SearchAdmission, entered: asyncio.Event, release: asyncio.Event) -> str:
    async with admission.slot():
        entered.set()
        await release.wait()
    return "done"


def test_no_bound_admits_everything() -> None:
    admission = SearchAdmission(SearchAdmissionConfig())

    async def go() -> list[str]:
        release = asyncio.Event()
        tasks = [asyncio.create_task(_hold(admission, asyncio.Event(), release)) for _ in range(50)]
        await asyncio.sleep(0)
        release.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(go()) == ["done"] * 50 and admission.refused == 0


def test_running_waiting_and_refused_follow_the_counts() -> None:
    admission = SearchAdmission(SearchAdmissionConfig(max_in_flight=2, max_waiting=1, max_wait_s=60, retry_after_s=3))

    async def go() -> None:
        release = asyncio.Event()
        entered = [asyncio.Event() for _ in range(3)]
        running = [asyncio.create_task(_hold(admission, entered[i], release)) for i in range(2)]
        await asyncio.gather(entered[0].wait(), entered[1].wait())
        waiter = asyncio.create_task(_hold(admission, entered[2], release))
        while admission.waiting == 0:
            await asyncio.sleep(0)
        assert not entered[2].is_set()
        with pytest.raises(AdmissionRefused) as err:  # 2 running + 1 waiting: the next is refused at once
            async with admission.slot():
                pass
        assert err.value.retry_after_s == 3 and admission.refused == 1
        release.set()
        assert await asyncio.gather(*running, waiter) == ["done"] * 3
        assert admission.waiting == 0
        async with admission.slot():  # every slot was given back
            async with admission.slot():
                pass

    asyncio.run(go())


def test_a_wait_without_a_free_slot_ends_in_a_refusal_and_leaks_nothing() -> None:
    admission = SearchAdmission(SearchAdmissionConfig(max_in_flight=1, max_waiting=4, max_wait_s=0.02))

    async def go() -> None:
        release, entered = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold(admission, entered, release))
        await entered.wait()
        with pytest.raises(AdmissionRefused, match="no free slot"):
            async with admission.slot():
                pass
        assert admission.waiting == 0 and admission.refused == 1
        release.set()
        await holder
        async with admission.slot():
            pass

    asyncio.run(go())


def test_http_search_over_the_bound_is_a_503_with_retry_after_and_chat_recall_still_runs(tmp_path: Path) -> None:
    service = make_service(tmp_path / "memory")
    service.admission = SearchAdmission(SearchAdmissionConfig(max_in_flight=1, max_waiting=0, retry_after_s=2))
    inner = service.retriever.embed
    gate, entered = asyncio.Event(), asyncio.Event()

    async def gated(texts: list[str]) -> np.ndarray:
        if texts == ["printer jams"]:  # NOTE: only the first search's query waits at the gate
            entered.set()
            await gate.wait()
        return await inner(texts)

    service.retriever.embed = gated

    async def go() -> None:
        transport = httpx.ASGITransport(app=make_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            ok = await http.post("/v1/memories", json={"memories": [{"text": "printer jams on tray 2"}]},
                                 headers=auth("sk-acme"))
            assert ok.status_code == 200, ok.text
            first = asyncio.create_task(http.post("/v1/memories/search", json={"query": "printer jams"},
                                                  headers=auth("sk-acme")))
            await entered.wait()
            r = await http.post("/v1/memories/search", json={"query": "tray"}, headers=auth("sk-acme"))
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "2"
            err = r.json()["error"]
            assert err["type"] == "service_unavailable" and err["code"] == "memory_overloaded"
            # the chat recall is not refused while the API search holds the slot
            hits = await service.search("acme", "tray")
            assert [h.text for h in hits] == ["printer jams on tray 2"]
            gate.set()
            r = await first
            assert r.status_code == 200 and r.json()["data"][0]["text"] == "printer jams on tray 2"
            r = await http.post("/v1/memories/search", json={"query": "tray"}, headers=auth("sk-acme"))
            assert r.status_code == 200

    try:
        asyncio.run(go())
    finally:
        close_service(service)


def test_overloaded_is_the_memory_api_503() -> None:
    err = MemoryOverloaded(AdmissionRefused("busy", 1.0))
    assert (err.status, err.code, err.retry_after_s) == (503, "memory_overloaded", 1.0)
