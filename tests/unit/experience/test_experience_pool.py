"""Verification in worker processes: same results as in process, a timeout recycles the worker.

Issue 14: a thread keeps a hostile record off the event loop but not off the GIL, so the pool
runs :func:`verify_record` in spawned processes. These start real processes (about a second
each on a shared 2-core machine), so one module-scoped pool serves the tests that need no
recycling.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from recallserve.serve.experience import ExperienceConfig, ExperienceRecord, RuleTable, build_router, verify_record
from recallserve.serve.experience import _pool
from recallserve.serve.experience._pool import VerifyPool

from ._records import speed_record

STEPS, SECONDS = 20_000, 0.1


def _hostile() -> ExperienceRecord:
    from recallserve.serve.bench import hostile_record

    return ExperienceRecord.model_validate(hostile_record())


def _verify(pool: VerifyPool, record: ExperienceRecord, required: tuple[str, ...] = (),
            seconds: float = SECONDS) -> ExperienceRecord:
    return asyncio.run(pool.verify(record, RuleTable(), required=required, max_steps=STEPS, seconds=seconds))


@pytest.fixture(scope="module")
def pool():
    p = VerifyPool(size=1, queue=4, timeout_s=30.0)
    yield p
    p.close()


@pytest.fixture
def fresh():
    """A pool of its own, for the tests that kill or recycle its worker."""
    p = VerifyPool(size=1, queue=4, timeout_s=30.0)
    yield p
    p.close()


def _worker_pid(pool: VerifyPool) -> int:
    [worker] = pool._workers
    return worker.proc.pid


def test_results_are_those_of_verify_record(pool: VerifyPool) -> None:
    honest = ExperienceRecord.model_validate(speed_record())
    assert _verify(pool, honest, ("boundary_test",)) == verify_record(honest, RuleTable(), required=("boundary_test",))
    out = _verify(pool, _hostile())
    assert out.outcome.confidence == "low"
    assert [(v.status, v.notes) for v in out.verification[:9]] == \
        [(v.status, v.notes) for v in verify_record(_hostile(), RuleTable()).verification[:9]]
    assert _worker_pid(pool) != os.getpid() and not pool.fallback


def test_queue_bound_fails_the_checks_unrun_and_no_tenant_takes_more_than_half() -> None:
    """4 places (1 worker + 3 waiting), at most 2 per tenant: acme's 5 records get 2 places (a first-come
    queue gave it all 4), globex's 3 get the other 2, and then the queue is full; refused checks fail unrun."""
    p = VerifyPool(size=1, queue=3, timeout_s=30.0)
    assert p.per_tenant == 2
    try:
        async def flood() -> dict[str, list[ExperienceRecord]]:
            rec = _hostile()
            tasks = {t: [asyncio.ensure_future(p.verify(rec, RuleTable(), required=(), max_steps=STEPS, seconds=SECONDS,
                                                        tenant=t)) for _ in range(n)]
                     for t, n in (("acme", 5), ("globex", 3), ("initech", 1))}
            return {t: list(await asyncio.gather(*fs)) for t, fs in tasks.items()}

        outs = asyncio.run(flood())

        def notes(tenant: str, text: str) -> list[ExperienceRecord]:
            return [o for o in outs[tenant] if text in (o.verification[0].notes or "")]

        assert len(notes("acme", "this tenant already has 2")) == 3  # acme holds 2 of the 4 places, not all
        assert len(notes("globex", "queue full")) == 1 and len(notes("initech", "queue full")) == 1
        assert len([o for o in outs["globex"] if "not run:" not in (o.verification[0].notes or "")]) == 2
        refused = [o for t in outs for o in notes(t, "not run:")]
        assert len(refused) == 5 and all(v.status == "fail" for o in refused for v in o.verification)
        assert p.pending_for("acme") == 0 and p._pending == 0
    finally:
        p.close()


def test_a_free_worker_takes_the_waiting_tenants_in_turn() -> None:
    """One worker: acme queues 3 records, then globex 1; globex's is verified second among the waiting,
    not after all of acme's (a first-come queue made it wait behind the whole flood)."""
    p = VerifyPool(size=1, queue=8, timeout_s=30.0)
    done: list[str] = []
    try:
        async def run() -> None:
            async def one(tenant: str, rec: ExperienceRecord) -> None:
                await p.verify(rec, RuleTable(), required=(), max_steps=STEPS, seconds=SECONDS, tenant=tenant)
                done.append(tenant)

            tasks = [asyncio.ensure_future(one("acme", _hostile())) for _ in range(4)]
            await asyncio.sleep(0)
            tasks.append(asyncio.ensure_future(one("globex", ExperienceRecord.model_validate(speed_record()))))
            await asyncio.gather(*tasks)

        asyncio.run(run())
        # the first acme record was running (or taken) when globex came; then acme and globex alternate
        assert done.index("globex") <= 2 and done.count("acme") == 4
    finally:
        p.close()


def test_close_ends_every_wait() -> None:
    p = VerifyPool(size=1, queue=8, timeout_s=30.0)

    async def run() -> list[object]:
        rec = _hostile()
        futs = [asyncio.ensure_future(p.verify(rec, RuleTable(), required=(), max_steps=STEPS, seconds=SECONDS,
                                               tenant="acme")) for _ in range(3)]
        await asyncio.sleep(0)
        p.close()
        return await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 60)

    outs = asyncio.run(run())
    assert len(outs) == 3 and any(isinstance(o, RuntimeError) and "closed" in str(o) for o in outs)


def test_timeout_kills_and_replaces_the_worker(fresh: VerifyPool) -> None:
    p = fresh
    _verify(p, ExperienceRecord.model_validate(speed_record()))
    first = p._workers[0].proc
    # NOTE: a 1 ms timeout against a record whose budget is 5 s: the worker cannot answer in time
    p.timeout_s = 0.001
    out = _verify(p, _hostile(), seconds=5.0)
    assert all(v.status == "fail" and "timed out" in v.notes for v in out.verification)
    assert out.outcome.confidence == "low" and p.recycled == 1
    first.join(5)
    assert not first.is_alive() and p._workers == []
    p.timeout_s = 30.0
    again = _verify(p, ExperienceRecord.model_validate(speed_record()))
    assert again.outcome.confidence == "high" and p._workers[0].proc.pid != first.pid


def test_a_dead_worker_fails_the_record_and_is_replaced(fresh: VerifyPool) -> None:
    p = fresh
    _verify(p, ExperienceRecord.model_validate(speed_record()))
    p._workers[0].proc.kill()
    p._workers[0].proc.join(5)
    out = _verify(p, ExperienceRecord.model_validate(speed_record()))
    assert out.verification[0].status == "fail" and "worker exited" in out.verification[0].notes
    assert _verify(p, ExperienceRecord.model_validate(speed_record())).outcome.confidence == "high"


def test_falls_back_to_a_thread_when_no_worker_starts(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    def no_process() -> Any:
        raise OSError("no processes here")

    monkeypatch.setattr(_pool, "_Worker", no_process)
    p = VerifyPool(size=1, queue=4, timeout_s=30.0)
    honest = ExperienceRecord.model_validate(speed_record())
    with caplog.at_level(logging.WARNING, logger="recallserve.serve.experience._pool"):
        assert _verify(p, honest) == verify_record(honest, RuleTable())
        assert _verify(p, honest) == verify_record(honest, RuleTable())
    assert p.fallback
    assert [r.getMessage() for r in caplog.records if "could not start" in r.getMessage()] == [
        "verification worker process could not start (OSError: no processes here); verifying in a thread "
        "of the ingress instead"]
    p.close()


def test_a_timeout_through_http_is_a_failed_check_not_a_500(make_service) -> None:
    svc = make_service()
    app = FastAPI()

    async def tenant() -> str:
        return "acme"

    app.include_router(build_router(svc, tenant))
    client = TestClient(app)
    assert client.post("/v1/experiences", json=speed_record()).status_code == 201  # starts the worker
    # NOTE: 1 ms against a 32-check record that spends its 100 ms budget: it cannot answer in time
    svc._pool.timeout_s = 0.001
    r = client.post("/v1/experiences", json=_hostile().model_dump(mode="json"))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["tier"] == "review" and body["record"]["outcome"]["confidence"] == "low"
    assert all("timed out" in v["notes"] for v in body["record"]["verification"])


def test_config_timeout_must_exceed_the_budget(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"verify_timeout_ms \(50.0\) must exceed verify_budget_ms \(100.0\)"):
        ExperienceConfig(data_dir=tmp_path, verify_timeout_ms=50)
