"""The state deployment's body and the ingress's proxy of it, wired in process (no Ray).

The proxy's handle is the one test double here: ``call.remote(...)`` runs ``StateStore.call`` on
the same event loop, which is what a Ray handle does on another process.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recallserve.deployments.config import ConfigError, load_config
from recallserve.deployments.state import STORE_METHODS, RemoteStore, StateStore
from recallserve.serve.context import ContextManager, SessionNotFoundError, SessionStore
from recallserve.serve.context._types import Message
from recallserve.serve.experience import ExperienceRecord, ExperienceStore
from recallserve.serve.traces import TraceNotFoundError, TraceStore, TurnTrace
from tests.unit.experience._records import speed_record


class _InProcessHandle:
    """``handle.call.remote(*args)`` -> awaitable result of ``StateStore.call(*args)``, with the
    arguments and the result serialised as a Ray handle does (so an unpicklable value fails here)."""

    def __init__(self, body: StateStore) -> None:
        from ray import cloudpickle

        self.calls = 0

        async def call(*args: Any) -> Any:
            self.calls += 1
            result = await body.call(*cloudpickle.loads(cloudpickle.dumps(args)))
            return cloudpickle.loads(cloudpickle.dumps(result))

        class _Method:
            @staticmethod
            def remote(*args: Any) -> Any:
                return call(*args)

        self.call = _Method()


@pytest.mark.parametrize("store, cls", [("sessions", SessionStore), ("experiences", ExperienceStore),
                                        ("turns", TraceStore)])
def test_the_proxy_carries_every_public_async_method(store: str, cls: type) -> None:
    public = {n for n, f in inspect.getmembers(cls, inspect.iscoroutinefunction) if not n.startswith("_")}
    assert STORE_METHODS[store] == public


def _stores(tmp_path: Path) -> tuple[StateStore, Any, Any, _InProcessHandle]:
    body = StateStore(str(tmp_path / "state"))
    handle = _InProcessHandle(body)
    return body, RemoteStore(handle, "sessions"), RemoteStore(handle, "experiences"), handle  # type: ignore[arg-type]


def test_two_ingress_replicas_share_one_session(tmp_path: Path) -> None:
    _body, sessions, _exp, handle = _stores(tmp_path)

    async def scenario() -> None:
        # Two context managers = two ingress replicas, each with its own proxy over one state replica.
        a = ContextManager(sessions)
        b = ContextManager(RemoteStore(handle, "sessions"))  # type: ignore[arg-type]
        s = await a.store.open("acme", "u1", "s1")
        await a.store.append(s, [Message(role="user", content="My order 104208 is late")], [[]])
        s_b = await b.store.get("acme", "u1", "s1")
        assert s_b.message_count == 1
        assert [m.content for m in await b.store.messages("acme", "u1", "s1")] == ["My order 104208 is late"]
        with pytest.raises(SessionNotFoundError):  # the store's own error type, so the API answers 404
            await b.store.get("other-tenant", "u1", "s1")

    asyncio.run(scenario())
    assert (tmp_path / "state" / "sessions.sqlite3").is_file()  # the file the ingress used to open
    assert handle.calls == 5


def test_two_ingress_replicas_read_one_trace_store(tmp_path: Path) -> None:
    """A turn traced through one replica is read through another (the trace file is the state
    replica's), within the state deployment's retention config, and only by its tenant."""
    body = StateStore(str(tmp_path / "state"), {"retention_days": 2, "max_per_tenant": 10})
    handle = _InProcessHandle(body)
    a, b = RemoteStore(handle, "turns"), RemoteStore(handle, "turns")  # type: ignore[arg-type]
    trace = TurnTrace(id="r1", created_at=time.time(), user="u1", session_id="s1", path="plain", question="q",
                      answer="a", finish_reason="stop")

    async def scenario() -> None:
        await a.put("acme", trace)
        assert await b.get("acme", "r1") == trace
        assert [t.id for t in await b.recent("acme")] == ["r1"]
        with pytest.raises(TraceNotFoundError):  # the store's own error type, so the API answers 404
            await b.get("globex", "r1")

    asyncio.run(scenario())
    assert body._stores["turns"].config.retention_days == 2
    assert (tmp_path / "state" / "turns.sqlite3").is_file()


def test_experience_rows_round_trip(tmp_path: Path) -> None:
    _body, _sessions, experiences, _handle = _stores(tmp_path)
    record = ExperienceRecord.model_validate(speed_record(timestamp=1.0))

    async def scenario() -> None:
        emb = np.arange(4, dtype=np.float32)
        await experiences.put("acme", record, tier="active", family="qwen", embedding=emb, last_used_at=1.0)
        row = await experiences.get("acme", record.metadata.id)
        assert row is not None and row.record == record and np.array_equal(row.embedding, emb)
        assert await experiences.get("other", record.metadata.id) is None
        assert await experiences.tenants() == ["acme"]

    asyncio.run(scenario())


def test_unknown_methods_are_refused_on_both_sides(tmp_path: Path) -> None:
    body, sessions, _exp, _handle = _stores(tmp_path)
    with pytest.raises(AttributeError, match="no method 'close_all'"):
        sessions.close_all
    ok, err = asyncio.run(body.call("sessions", "_run", (), {}))
    assert not ok and isinstance(err, AttributeError)
    sessions.close()  # a no-op: the state replica owns the files


def test_one_state_replica_per_folder_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A successor started while the old replica drains waits for its folder lock (Ray Serve starts
    it before the old one has stopped), so SQLite never has two writing processes."""
    from recallserve.deployments import state

    monkeypatch.setattr(state, "LOCK_WAIT_S", 0.3)
    old = StateStore(str(tmp_path / "state"))
    with pytest.raises(RuntimeError, match="state_dir: .* still held by another state replica"):
        StateStore(str(tmp_path / "state"))
    old.close()  # what Serve's shutdown of the old replica does (its __del__)
    successor = StateStore(str(tmp_path / "state"))
    ok, session = asyncio.run(successor.call("sessions", "open", ("acme", "u1", "s1"), {}))
    assert ok and session.tenant == "acme"
    successor.close()


def test_an_unreachable_state_replica_is_a_503(tmp_path: Path) -> None:
    from ray.serve.exceptions import BackPressureError

    from recallserve.serve.api.errors import APIError

    class _Overloaded:
        class call:  # noqa: N801 - the handle's method name
            @staticmethod
            def remote(*_args: Any) -> Any:
                raise BackPressureError(num_queued_requests=300, max_queued_requests=256)

    with pytest.raises(APIError) as err:
        asyncio.run(RemoteStore(_Overloaded(), "sessions").get("acme", "u1", "s1"))  # type: ignore[arg-type]
    assert err.value.status == 503 and err.value.code == "state_unavailable" and "sessions" in err.value.message


@pytest.mark.parametrize("override", [{"num_replicas": 2}, {"max_surge_percent": 100},
                                      {"autoscaling": {"min_replicas": 1, "max_replicas": 2}}])
def test_the_state_deployment_keeps_one_writer(override: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="state_store: must run exactly one replica"):
        load_config("cpu-local", overrides={"state_store": override})
