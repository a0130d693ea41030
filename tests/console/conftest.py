"""The console's browser rig: the ingress app on a real HTTP server, headless Chromium driving it.

The app is the edge rig's (``tests/unit/edge/conftest.py``: real memory service on two hybrid
shards, experience service, session store, turn-trace store, the console's routes) plus the
agent, so a turn has a route, steps and a tool call to show. The model is a scripted engine
(it follows the agent's JSON protocol: route -> order_status -> final); everything else is real.
uvicorn serves the app on 127.0.0.1 on a free port in a thread; one browser per module.

The browser is Debian's ``chromium`` (``apt-get install -y chromium``; the README's test command
installs it), driven by playwright with ``executable_path``. Without it the tests skip, naming
the reason, except on CI (``CI`` set), where a missing browser is a failure: the console must be
tested there.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from memory_shards import HashingEmbedder
from memory_shards.retrieval import local_hybrid_coordinator
from serve.agent import Agent, AgentConfig, default_registry
from serve.api.app import create_app
from serve.api.auth import Authenticator
from serve.console import build_console_router
from serve.context import ContextConfig, ContextManager, SessionStore
from serve.context import build_router as build_session_router
from serve.engine import ChatMessage, GenerationParams
from serve.experience import ExperienceConfig, ExperienceService
from serve.experience import build_router as build_experience_router
from serve.memory_api import MemoryService, build_router
from serve.pipeline import ChatPipeline, PipelineSettings
from serve.traces import TraceRecorder, TraceStore
from serve.traces import build_router as build_turn_router
from tests.unit.agent.conftest import ScriptedEngine
from tests.unit.experience._records import speed_record

KEYS = {"sk-acme": "acme", "sk-globex": "globex"}
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
SECRET = "The Zephyr-9 printer jams when the thermal fuse trips; replace fuse F2 (ticket T-1042)."
QUESTION = "Where is order 104208? Mail me at jane.doe@example.com"
ORDER_NOTE = "Order 104208: the customer asked for delivery to the back door; courier DPD."
ANSWER = "Order 104208 was delivered on 2024-03-02 (see [1])."


def chromium_path() -> str | None:
    """The system Chromium (``$RECALLSERVE_CHROMIUM`` overrides), or None."""
    return os.environ.get("RECALLSERVE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class AgentEngine(ScriptedEngine):
    """Follows the agent's protocol: routes to order_status, calls it for order 104208, then answers."""

    def __init__(self) -> None:
        super().__init__([])

    def _next(self, messages: Sequence[ChatMessage], params: GenerationParams) -> str:
        self.calls.append((list(messages), params))
        schema = params.json_schema or {}
        if "tools" in schema.get("properties", {}):
            return json.dumps({"tools": ["order_status"]})
        if "Observation(order_status)" in messages[-1].content:
            return json.dumps({"thought": "the tool answered", "type": "final", "answer": ANSWER})
        if schema:
            return json.dumps({"thought": "look the order up", "type": "tool_call", "name": "order_status",
                               "args": {"order_id": "104208"}})
        return ANSWER


@dataclass
class Console:
    """The running server and what was seeded into it."""

    url: str
    memory_id: str
    turn_id: str
    experience_id: str
    api: httpx.Client

    def get(self, path: str, tenant: str = "acme", **kw: Any) -> httpx.Response:
        return self.api.get(self.url + path, headers={"Authorization": f"Bearer sk-{tenant}"}, **kw)

    def post(self, path: str, body: Any, tenant: str = "acme") -> httpx.Response:
        return self.api.post(self.url + path, json=body, headers={"Authorization": f"Bearer sk-{tenant}"})


def _build(tmp: Path) -> tuple[Any, Any]:
    emb = HashingEmbedder(384)
    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=tmp / "memory")

    async def embed(texts: list[str]):  # type: ignore[no-untyped-def]
        import asyncio

        return await asyncio.to_thread(emb.embed, texts)

    auth = Authenticator(KEYS)
    memory = MemoryService(coord, embed, top_k=8, threshold=0.0, pii_for=auth.pii_for)
    context = ContextManager(SessionStore(tmp / "sessions.sqlite3"), ContextConfig(summary_keep_recent=1),
                             pii_for=auth.pii_for)
    experiences = ExperienceService(ExperienceConfig(data_dir=tmp / "exp"), emb.embed, memory=memory,
                                    pii_for=auth.pii_for)
    engine = AgentEngine()
    agent = Agent(engine, default_registry(demo=True), memory=memory, config=AgentConfig(max_steps=3))
    traces = TraceRecorder(TraceStore(tmp / "turns.sqlite3"))
    pipeline = ChatPipeline(engine, PipelineSettings(), memory=memory, context=context, agent=agent,
                            experiences=experiences, traces=traces)
    routers = [build_router(memory, auth), build_experience_router(experiences, auth),
               build_session_router(context, auth), build_turn_router(traces.store, auth),
               build_console_router(auth, coord.stats)]
    return create_app(pipeline, auth, routers=routers), coord


def _seed(c: Console) -> Console:
    """acme's data: a memory, an agent turn in a session (a trace), an experience in review."""
    r = c.post("/v1/memories", {"memories": [{"text": SECRET, "source_id": "manual:zephyr-9", "topic": "printers/jams"},
                                             {"text": ORDER_NOTE, "source_id": "ticket:T-2001", "kind": "tool_result"}]})
    assert r.status_code == 200, r.text
    c.memory_id = r.json()["ids"][0]
    for text in ("My name is Jane and my order is 104208.", QUESTION):
        r = c.post("/v1/chat/completions", {"model": "recallserve", "user": "jane", "metadata": {"session_id": "s-jane"},
                                            "messages": [{"role": "user", "content": text}]})
        assert r.status_code == 200, r.text
    c.turn_id = r.json()["recallserve"]["request_id"]
    r = c.post("/v1/sessions/s-jane/summary?user=jane", None)
    assert r.status_code == 200 and r.json()["refreshed"], r.text
    r = c.post("/v1/experiences", speed_record(answer="95 km/h", model="qwen2.5-7b"))
    assert r.status_code == 201 and r.json()["tier"] == "review", r.text
    c.experience_id = r.json()["record"]["metadata"]["id"]
    deadline = time.monotonic() + 30
    while c.get(f"/v1/turns/{c.turn_id}").status_code != 200:  # NOTE: traces are written off the request path
        assert time.monotonic() < deadline, "the turn's trace was not stored"
        time.sleep(0.05)
    return c


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    app, coord = _build(tmp_path_factory.mktemp("console"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    with httpx.Client(timeout=30) as api:
        yield _seed(Console(f"http://127.0.0.1:{port}", "", "", "", api))
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()
    for shard_client in coord.shards:
        shard_client.shard.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    exe = chromium_path()
    missing = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "playwright is not installed (pip install -e '.[test]')"
    if missing is None and exe is None:
        missing = "Debian's chromium is not installed (apt-get install -y chromium)"
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"console browser tests cannot run on CI: {missing}")
        pytest.skip(missing)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, console: Console) -> Iterator[Any]:
    """A fresh browser context (no saved key) on the console, errors of the page collected."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    pg.page_errors = []  # type: ignore[attr-defined]
    pg.on("pageerror", lambda exc: pg.page_errors.append(str(exc)))  # type: ignore[attr-defined]
    pg.goto(console.url + "/console")
    yield pg
    assert not pg.page_errors, pg.page_errors  # type: ignore[attr-defined]
    context.close()


def shot(page: Any, name: str) -> None:
    """Save a screenshot under ``$RECALLSERVE_CONSOLE_SHOTS`` when set (docs/console is made so)."""
    folder = os.environ.get("RECALLSERVE_CONSOLE_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def sign_in(page: Any, key: str) -> None:
    page.fill("#api-key", key)
    page.click("#signin button[type=submit]")
