"""The security suite's rig: the whole ingress app in-process, two tenants on the default PII
policy (acme and its neighbour globex), driven through HTTP only.

The app is the one the edge tests build (``tests/unit/edge/conftest.py``: real memory service on
two hybrid shards, experience service, session store and context manager; the hashing embedder
and a recording engine are the only doubles), so the routers are those ``deployments/ingress.py``
binds, and a route added there shows up in the OpenAPI document these tests enumerate.

The kill -9 durability check through HTTP is ``test_kill9.py`` (8 writers, SIGKILL of the server
process holding the shards, every acknowledged id read back after the WAL replay). Beside the code
they kill: ``tests/unit/memory/test_memory_durability.py::test_kill_9_loses_no_acknowledged_write``
(one shard process) and ``tests/integration/test_memory_deployments.py`` (a shard replica killed
under a writer in Ray, and another tenant's reads during a shard's SIGKILL).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.conftest import STATE_BACKENDS, open_state_db
from tests.unit.edge.conftest import FixedEngine, assert_envelope, build_app, headers

A, B = "acme", "globex"
# Routes that hold no tenant data (and so need no cross-tenant check); every other route does.
NO_TENANT_DATA = {("GET", "/healthz"), ("GET", "/metrics"), ("GET", "/v1/models")}
# The test-only route of the edge rig (an unexpected exception); not part of the product.
TEST_ONLY = {("GET", "/v1/boom")}


@dataclass
class Rig:
    client: TestClient
    app: FastAPI
    engine: FixedEngine

    def prompts(self) -> list[str]:
        """Every prompt the engine received, each as one text."""
        return ["\n".join(m.content for m in messages) for messages, _ in self.engine.calls]


@contextmanager
def serving(root: Path, **options: Any) -> Iterator[Rig]:
    """The rig with its stores under ``root``, its shards closed on exit; ``options`` go to
    :func:`~tests.unit.edge.conftest.build_app` (a config section with a small bound to reach)."""
    engine = FixedEngine()
    app, memory = build_app(root, engine=engine, **options)
    try:
        # NOTE: raise_server_exceptions=False: a bug must show as the 500 a real client gets.
        with TestClient(app, raise_server_exceptions=False) as c:
            yield Rig(c, app, engine)
    finally:
        for shard_client in memory.coordinator.shards:
            shard_client.shard.close()


@contextmanager
def serving_on(request: pytest.FixtureRequest, backend: str, root: Path, **options: Any) -> Iterator[Rig]:
    """:func:`serving` with its session, experience and trace stores on ``backend`` (``sqlite`` or
    ``postgres``: a fresh schema of the session's real server), the database closed on exit."""
    db = open_state_db(request, backend)
    try:
        with serving(root, db=db, **options) as r:
            yield r
    finally:
        if db is not None:
            db.close()


@pytest.fixture(params=STATE_BACKENDS)
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    """A fresh rig per test (the tests that count what a tenant holds), on each state backend."""
    with serving_on(request, request.param, tmp_path) as r:
        yield r


@pytest.fixture(scope="module", params=STATE_BACKENDS)
def shared_rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One rig for a module whose tests hold whatever state the others left (as a server does), on
    each state backend."""
    with serving_on(request, request.param, tmp_path_factory.mktemp("rig")) as r:
        yield r


def routes(app: FastAPI) -> set[tuple[str, str]]:
    """(METHOD, path template) of every operation in the app's OpenAPI document."""
    return {(method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops}


def normalised(r: Any, *ids: str) -> tuple[int, Any]:
    """Status and JSON body of ``r`` with the request id and each of ``ids`` blanked out, so two
    answers about different ids compare equal when they differ in nothing else."""
    text = r.text.replace(r.headers.get("x-request-id", "\0"), "<request-id>")
    for i in ids:
        text = re.sub(re.escape(i), "<id>", text)
    return r.status_code, text


#: A question for the chat tests that need any.
ASK = {"role": "user", "content": "Weather in Paris?"}


def chat_with_agent_off(rig: Rig, messages: list[dict[str, Any]] | None = None, *, stream: bool = False, **extra: Any) -> Any:
    """POST one chat turn with ``metadata.agent: off`` (``extra`` merged into the body)."""
    body = {"model": "recallserve", "metadata": {"agent": "off"}, "messages": messages or [ASK], "stream": stream}
    return rig.client.post("/v1/chat/completions", json={**body, **extra}, headers=headers(A))


def refused(rig: Rig, r: Any, param: str) -> dict[str, Any]:
    """``r`` is a 400 naming ``param`` (first in its message too) and no engine call was made."""
    error = assert_envelope(r, 400, param)
    assert error["message"].startswith(f"{param}: "), error
    return error
