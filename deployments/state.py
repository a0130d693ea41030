"""The state deployment: the one owner of the ingress's embedded stores (sessions, experiences,
turn traces).

Why a deployment: every ingress replica used to open its own SQLite files under ``state_dir``.
Replicas on one machine shared the files, but on a cluster (``gpu-cluster`` runs 2-8 ingress
replicas on different pods) each one had its own, in its container: a chat session's turns
landed on whichever replica served them, so its history, rolling summary and entity table were
split between replicas, and an experience written through one replica was invisible to the
others and gone with its pod. Now one replica of this deployment opens both files (on the Helm
chart's volume; ``serve-config --target kubernetes`` moves ``state_dir`` there) and every ingress
replica reaches them through :class:`RemoteStore`, which has the same async methods as the
local store it stands for.

Exactly one replica (SQLite has one writer per file and its WAL needs the files on one host), and
no surge on a roll-out. Ray Serve still starts the successor while the old replica drains (a
stopping replica does not count against the target), so the replica also holds an exclusive
``flock`` on ``state_dir/LOCK`` for its life: a successor waits until the old one has exited
(draining takes milliseconds: every call is a short SQLite transaction), and calls made in that
gap wait in the handle's queue. The stores are plain Python (``recallserve.serve.context.SessionStore``,
``recallserve.serve.experience.ExperienceStore``); this module only carries their calls.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path
from typing import Any, Literal, NamedTuple, cast

from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError, RayServeException
from ray.serve.handle import DeploymentHandle

from recallserve.deployments._placement import PlacementInfo
from recallserve.serve.api.errors import APIError
from recallserve.serve.api.metrics import STATE_CALL
from recallserve.serve.context import SessionStore
from recallserve.serve.erasure import ErasureLog
from recallserve.serve.experience import ExperienceStore
from recallserve.serve.statedb import PostgresDatabase
from recallserve.serve.traces import TraceConfig, TraceStore

__all__ = ["LOCK_WAIT_S", "STORE_METHODS", "RemoteStore", "StateStore", "StateStores", "StoreName", "open_state_stores",
           "remote_state_stores"]

log = logging.getLogger(__name__)

StoreName = Literal["sessions", "experiences", "turns", "erasures"]
_UNAVAILABLE = (RayError, RayServeException, BackPressureError)
# NOTE: the public async methods of each store; tests check these against the classes, so a new
# store method cannot be forgotten here (it would fail as an AttributeError on the ingress).
STORE_METHODS: dict[str, frozenset[str]] = {
    "sessions": frozenset({"get", "open", "set_mode", "delete", "append", "messages", "entities", "snapshot",
                           "long_sessions", "user_memory", "save_summary", "erase_user", "export_user",
                           "expire_before"}),
    "experiences": frozenset({"put", "get", "query", "set_tier", "touch", "archive_expired", "tenants",
                              "active_freshness", "active_domains", "erase_user", "export_user"}),
    "turns": frozenset({"put", "recent", "get", "sessions", "count", "erase_user", "export_user", "expire_before"}),
    "erasures": frozenset({"begin", "claim", "erased_since", "finish", "fail", "exported", "get", "unfinished", "recent"}),
}


class StateStore(PlacementInfo):
    """Body of the ``state`` deployment: the session, experience and turn-trace stores in ``state_dir``.

    Args:
        state_dir: absolute folder of ``sessions.sqlite3``, ``experiences/experiences.sqlite3``
            (the same files the ingress opened before this deployment existed), ``turns.sqlite3``
            and ``erasures.sqlite3`` (the erasure and export log, ``recallserve.serve.erasure``).
        traces: the ``traces`` config section as plain data (retention days, per-tenant cap).
    """

    def __init__(self, state_dir: str, traces: dict[str, Any] | None = None) -> None:
        root = Path(state_dir)
        self._stores: dict[str, Any] = {}
        self._lock_fd = _hold_folder_lock(root, LOCK_WAIT_S)
        self._stores = {
            "sessions": SessionStore(root / "sessions.sqlite3"),
            "experiences": ExperienceStore(root / "experiences"),
            "turns": TraceStore(root / "turns.sqlite3", TraceConfig.model_validate(traces or {})),
            "erasures": ErasureLog(root / "erasures.sqlite3"),
        }
        log.info("state stores open in %s", root)

    def close(self) -> None:
        """Close both stores, then let the next replica have the folder."""
        for store in self._stores.values():
            store.close()
        self._stores = {}
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # NOTE: closing the descriptor releases the flock
            self._lock_fd = None

    async def call(self, store: StoreName, method: str, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """Run ``store.method(*args, **kwargs)``; returns ``(True, result)`` or ``(False, exception)``.

        The exception travels back as a value so that the caller re-raises the store's own type
        (``SessionNotFoundError`` becomes a 404 on the ingress), not Ray's wrapper of it.
        """
        if method not in STORE_METHODS.get(store, frozenset()):
            return False, AttributeError(f"state store {store!r} has no method {method!r}")
        try:
            return True, await getattr(self._stores[store], method)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - handed back to the caller, who raises it
            return False, exc

    def __del__(self) -> None:
        if getattr(self, "_lock_fd", None) is not None:
            self.close()


# NOTE: a successor waits this long for the draining replica to exit before it fails (and Serve
# starts another); graceful_shutdown_timeout_s of the deployment (state_store) bounds the drain.
LOCK_WAIT_S = 120.0


def _hold_folder_lock(root: Path, wait_s: float) -> int:
    """An fd holding an exclusive flock on ``root/LOCK``, waiting up to ``wait_s`` for the holder."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "LOCK", os.O_CREAT | os.O_RDWR, 0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise RuntimeError(f"state_dir: {root} is still held by another state replica after {wait_s:.0f} s "
                                   "(one writer per folder)") from None
            time.sleep(0.2)


class StateStores(NamedTuple):
    """The three stores an ingress replica uses (local, remote or on PostgreSQL)."""

    sessions: SessionStore
    experiences: ExperienceStore
    turns: TraceStore


def open_state_stores(dsn: str, traces: TraceConfig, *, pool_size: int = 8,
                      acquire_timeout_s: float = 10.0) -> tuple[StateStores, PostgresDatabase]:
    """The stores of one ingress replica on PostgreSQL: one pool for all three, schema migrated
    (once, under the advisory lock) before the first call. The caller closes the database."""
    db = PostgresDatabase(dsn, pool_size=pool_size, acquire_timeout_s=acquire_timeout_s)
    stores = StateStores(SessionStore(db=db), ExperienceStore(db=db), TraceStore(config=traces, db=db))
    return stores, db


def remote_state_stores(handle: DeploymentHandle) -> StateStores:
    """The stores of the ``state`` deployment, as seen from an ingress replica."""
    return StateStores(cast(SessionStore, RemoteStore(handle, "sessions")),
                       cast(ExperienceStore, RemoteStore(handle, "experiences")),
                       cast(TraceStore, RemoteStore(handle, "turns")))


class RemoteStore:
    """The ingress's view of one store of the ``state`` deployment: the same async methods.

    ``RemoteStore(handle, "sessions").get(tenant, user, sid)`` is one handle call that runs
    ``SessionStore.get`` on the state replica and returns its result or raises its exception.
    """

    def __init__(self, handle: DeploymentHandle, store: StoreName) -> None:
        self._handle = handle
        self._store = store
        self._methods = STORE_METHODS[store]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._methods:
            raise AttributeError(f"{type(self).__name__}({self._store!r}) has no method {name!r}")

        async def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                ok, value = await self._handle.call.remote(self._store, name, args, kwargs)
            except _UNAVAILABLE as exc:
                # NOTE: the replica is down, restarting or overloaded: the client may retry (503),
                # nothing was half-done (each store call is one transaction).
                STATE_CALL.labels(self._store, name, "unavailable").observe(time.perf_counter() - start)
                raise APIError(503, f"{self._store}: the state store is unavailable ({type(exc).__name__}); retry",
                               type="service_unavailable", code="state_unavailable") from exc
            STATE_CALL.labels(self._store, name, "ok" if ok else "error").observe(time.perf_counter() - start)
            if not ok:
                raise value
            return value

        call.__name__ = name
        return call

    def close(self) -> None:
        """Nothing to close here: the state replica owns the files."""
