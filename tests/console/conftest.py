"""The console's browser rig: the ingress app on a real HTTP server, headless Chromium driving it.

The app is :func:`loadtests._console_app.build_console_app` (real memory service on two hybrid
shards, experience service, session store, turn-trace store, agent with the demo tools, the
console's routes); the model is a stand-in that follows the agent's JSON protocol (route ->
order_status -> final), so a turn has a route, steps and a tool call to show. uvicorn serves the
app on 127.0.0.1 on a free port in a thread; one browser per module.

The browser is Debian's ``chromium`` (``apt-get install -y chromium``; the README's test command
installs it), driven by playwright with ``executable_path``. Without it the tests skip, naming
the reason, except on CI (``CI`` set), where a missing browser is a failure: the console must be
tested there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from recallserve.client import RecallServe, RecallServeError
from loadtests._console_app import ANSWER, CHROMIUM_ARGS, build_console_app, chromium_path, serve_in_thread
from tests.unit.experience._records import speed_record

KEYS = {"sk-acme": "acme", "sk-globex": "globex", "sk-initech": "initech"}
SECRET = "The Zephyr-9 printer jams when the thermal fuse trips; replace fuse F2 (ticket T-1042)."
QUESTION = "Where is order 104208? Mail me at jane.doe@example.com"
ORDER_NOTE = "Order 104208: the customer asked for delivery to the back door; courier DPD."


@dataclass
class Console:
    """The running server and what was seeded into it."""

    url: str
    memory_id: str
    turn_id: str
    experience_id: str
    clients: dict[str, RecallServe]

    def api(self, tenant: str = "acme") -> RecallServe:
        """The typed client of ``tenant``'s key (one per tenant, kept for the module)."""
        if tenant not in self.clients:
            self.clients[tenant] = RecallServe(self.url, f"sk-{tenant}", timeout=30)
        return self.clients[tenant]


def _trace_stored(c: Console) -> bool:
    try:
        c.api().turns.get(c.turn_id)
    except RecallServeError as exc:
        assert exc.status == 404, exc
        return False
    return True


def _seed(c: Console) -> Console:
    """acme's data: a memory, an agent turn in a session (a trace), an experience in review."""
    rs = c.api()
    c.memory_id = rs.memories.add([{"text": SECRET, "source_id": "manual:zephyr-9", "topic": "printers/jams"},
                                   {"text": ORDER_NOTE, "source_id": "ticket:T-2001", "kind": "tool_result"}]).ids[0]
    for text in ("My name is Jane and my order is 104208.", QUESTION):
        answer = rs.chat([{"role": "user", "content": text}], user="jane", metadata={"session_id": "s-jane"})
    c.turn_id = answer.recallserve["request_id"]
    assert rs.sessions.refresh_summary("s-jane", user="jane").refreshed
    review = rs.experiences.create(speed_record(answer="95 km/h", model="qwen2.5-7b"))
    assert review.tier == "review", review
    c.experience_id = review.record.metadata.id
    deadline = time.monotonic() + 30
    while not _trace_stored(c):  # NOTE: traces are written off the request path
        assert time.monotonic() < deadline, "the turn's trace was not stored"
        time.sleep(0.05)
    return c


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    app, coord, _engine = build_console_app(tmp_path_factory.mktemp("console"), KEYS)
    with serve_in_thread(app) as url:
        c = Console(url, "", "", "", {})
        try:
            yield _seed(c)
        finally:
            for client in c.clients.values():
                client.close()
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
