"""The state deployment: the one owner of the ingress's embedded stores (sessions, experiences).

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
no surge on a roll-out (the old replica stops before the new one opens the files); calls made in
that gap wait in the handle's queue. The stores are plain Python (``serve.context.SessionStore``,
``serve.experience.ExperienceStore``); this module only carries their calls.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Literal

from ray.serve.handle import DeploymentHandle

from deployments._placement import PlacementInfo
from serve.api.metrics import STATE_CALL
from serve.context import SessionStore
from serve.experience import ExperienceStore

__all__ = ["STORE_METHODS", "RemoteStore", "StateStore", "StoreName"]

log = logging.getLogger(__name__)

StoreName = Literal["sessions", "experiences"]
# NOTE: the public async methods of each store; tests check these against the classes, so a new
# store method cannot be forgotten here (it would fail as an AttributeError on the ingress).
STORE_METHODS: dict[str, frozenset[str]] = {
    "sessions": frozenset({"get", "open", "set_mode", "delete", "append", "messages", "entities", "snapshot",
                           "user_memory", "save_summary"}),
    "experiences": frozenset({"put", "get", "query", "set_tier", "touch", "delete_expired", "tenants",
                              "active_freshness"}),
}


class StateStore(PlacementInfo):
    """Body of the ``state`` deployment: the session and experience stores in ``state_dir``.

    Args:
        state_dir: absolute folder of ``sessions.sqlite3`` and ``experiences/experiences.sqlite3``
            (the same files the ingress opened before this deployment existed).
    """

    def __init__(self, state_dir: str) -> None:
        root = Path(state_dir)
        self._stores: dict[str, Any] = {
            "sessions": SessionStore(root / "sessions.sqlite3"),
            "experiences": ExperienceStore(root / "experiences"),
        }
        log.info("state stores open in %s", root)

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
        for store in getattr(self, "_stores", {}).values():
            store.close()


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
            ok, value = await self._handle.call.remote(self._store, name, args, kwargs)
            STATE_CALL.labels(self._store, name, "ok" if ok else "error").observe(time.perf_counter() - start)
            if not ok:
                raise value
            return value

        call.__name__ = name
        return call

    def close(self) -> None:
        """Nothing to close here: the state replica owns the files."""
