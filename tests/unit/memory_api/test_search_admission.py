"""Admission of API searches (``recallserve.serve.memory_api.admission``): slots, a bounded wait, a fast 503 with Retry-After.

No timings are asserted: a held slot is an unset event, so who waits and who is refused is decided
by the counts alone; the one timeout used (a wait that can never get a slot) only ends the test.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from recallserve.serve.memory_api import MemoryOverloaded, SearchAdmission, SearchAdmissionConfig
from recallserve.serve.memory_api.admission import AdmissionRefused
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


def _gated_service(path: Path, config: SearchAdmissionConfig) -> tuple[Any, asyncio.Event, asyncio.Event]:
    """A memory service whose search for "printer jams" waits at ``gate`` once it has ``entered``
    (only that query: the others run through), under ``config``'s admission."""
    service = make_service(path)
    service.admission = SearchAdmission(config)
    inner = service.retriever.embed
    gate, entered = asyncio.Event(), asyncio.Event()

    async def gated(texts: list[str]) -> np.ndarray:
        if texts == ["printer jams"]:
            entered.set()
            await gate.wait()
        return await inner(texts)

    service.retriever.embed = gated
    return service, gate, entered


def test_http_search_over_the_bound_is_a_503_with_retry_after_and_chat_recall_still_runs(tmp_path: Path) -> None:
    service, gate, entered = _gated_service(tmp_path / "memory",
                                            SearchAdmissionConfig(max_in_flight=1, max_waiting=0, retry_after_s=2))

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


async def _hold_as(admission: SearchAdmission, tenant: str, order: list[str],
                   release: asyncio.Event | list[asyncio.Event]) -> str:
    """Hold a slot for ``tenant`` until ``release`` (or, given a list, the event of its place in ``order``)."""
    async with admission.slot(tenant):
        order.append(tenant)
        await (release[len(order) - 1] if isinstance(release, list) else release).wait()
    return "done"


def test_a_freed_slot_goes_to_the_waiting_tenants_in_turn() -> None:
    """One slot; acme waits with 3 searches, then globex with 1: globex is served second, not fourth."""
    admission = SearchAdmission(SearchAdmissionConfig(max_in_flight=1, max_waiting=10, max_wait_s=60))

    async def go() -> list[str]:
        order: list[str] = []
        gates = [asyncio.Event() for _ in range(5)]
        tasks = [asyncio.create_task(_hold_as(admission, "acme", order, gates))]
        while not order:
            await asyncio.sleep(0)
        for tenant in ["acme", "acme", "acme", "globex"]:
            tasks.append(asyncio.create_task(_hold_as(admission, tenant, order, gates)))
            await asyncio.sleep(0)
        assert admission.waiting_for("acme") == 3 and admission.waiting_for("globex") == 1
        for i, gate in enumerate(gates):  # NOTE: the holders end one by one, each letting the next in
            gate.set()
            while len(order) < min(i + 2, 5):
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert admission.running == 0 and admission.waiting == 0
        return order

    assert asyncio.run(go()) == ["acme", "acme", "globex", "acme", "acme"]


def test_a_tenant_that_waits_less_takes_the_waiting_place_of_the_one_that_waits_most() -> None:
    admission = SearchAdmission(SearchAdmissionConfig(max_in_flight=1, max_waiting=3, max_wait_s=60, retry_after_s=2))

    async def go() -> None:
        release, order = asyncio.Event(), []
        holder = asyncio.create_task(_hold_as(admission, "acme", order, release))
        while not order:
            await asyncio.sleep(0)
        acme = [asyncio.create_task(_hold_as(admission, "acme", order, release)) for _ in range(3)]
        await asyncio.sleep(0)
        assert admission.waiting == 3  # full
        globex = [asyncio.create_task(_hold_as(admission, "globex", order, release)) for _ in range(2)]
        await asyncio.sleep(0)
        # each globex search took the place of acme's newest waiter: acme 1, globex 2
        assert admission.waiting_for("acme") == 1 and admission.waiting_for("globex") == 2
        for pushed in acme[1:]:
            with pytest.raises(AdmissionRefused, match="took its waiting place") as err:
                await pushed
            assert err.value.retry_after_s == 2
        # globex now waits most: its next search is refused (full, and no tenant waits more than globex)
        with pytest.raises(AdmissionRefused, match="running"):
            async with admission.slot("globex"):
                pass
        # initech waits less than globex: it takes the place of globex's newest
        initech = asyncio.create_task(_hold_as(admission, "initech", order, release))
        with pytest.raises(AdmissionRefused, match="took its waiting place"):
            await globex[1]
        assert admission.refused == 4
        assert [admission.waiting_for(t) for t in ("acme", "globex", "initech")] == [1, 1, 1]
        release.set()
        assert await asyncio.gather(holder, acme[0], globex[0], initech) == ["done"] * 4
        assert order == ["acme", "acme", "globex", "initech"] and admission.running == 0

    asyncio.run(go())


def test_http_one_tenants_flood_of_searches_does_not_shut_another_tenant_out(tmp_path: Path) -> None:
    """One slot, two waiting places: acme holds the slot and both places; globex's search still gets a place
    (acme's newest is refused with the 503) and is answered 200 once the slot frees."""
    service, gate, entered = _gated_service(tmp_path / "memory",
                                            SearchAdmissionConfig(max_in_flight=1, max_waiting=2, max_wait_s=30))

    async def go() -> None:
        transport = httpx.ASGITransport(app=make_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            for key in ("sk-acme", "sk-globex"):
                ok = await http.post("/v1/memories", json={"memories": [{"text": "printer jams on tray 2"}]},
                                     headers=auth(key))
                assert ok.status_code == 200, ok.text
            first = asyncio.create_task(http.post("/v1/memories/search", json={"query": "printer jams"},
                                                  headers=auth("sk-acme")))
            await entered.wait()
            flood = [asyncio.create_task(http.post("/v1/memories/search", json={"query": "tray"}, headers=auth("sk-acme")))
                     for _ in range(2)]
            while service.admission.waiting < 2:
                await asyncio.sleep(0.01)
            other = asyncio.create_task(http.post("/v1/memories/search", json={"query": "tray"},
                                                  headers=auth("sk-globex")))
            while service.admission.waiting_for("globex") == 0:
                await asyncio.sleep(0.01)
            gate.set()
            r = await other
            assert r.status_code == 200, r.text
            assert r.json()["data"][0]["text"] == "printer jams on tray 2"
            statuses = sorted([(await t).status_code for t in flood] + [(await first).status_code])
            assert statuses == [200, 200, 503]

    try:
        asyncio.run(go())
    finally:
        close_service(service)
