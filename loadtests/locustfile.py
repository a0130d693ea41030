"""Locust users for recallserve: chat, memory writes and memory searches.

Run through ``python -m loadtests.run_headless`` (bounded, writes a report) or directly::

    RECALLSERVE_LOAD_USERS=chat,memory_search locust -f loadtests/locustfile.py \
        --headless -u 4 -r 1 -t 60s --host http://127.0.0.1:8000

Environment (read here only; the load test is not part of the package):
    RECALLSERVE_LOAD_USERS: comma list of user classes to run: ``chat``, ``memory_write``,
        ``memory_search`` (default ``chat``: the memory endpoints 404 until the memory API lands).
    RECALLSERVE_LOAD_API_KEY: bearer key (default ``sk-local``, the cpu-local profile's key).
    RECALLSERVE_LOAD_MODEL: ``model`` field of chat requests (default ``recallserve``).
    RECALLSERVE_LOAD_MAX_TOKENS: ``max_tokens`` of chat requests (default 16).
    RECALLSERVE_LOAD_SEED: seed of the request mix (default 0).

The host must be this machine (127.0.0.1 / localhost); anything else stops the run at start.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from locust import HttpUser, between, events, tag, task

sys.path.append(str(Path(__file__).resolve().parents[1]))

from loadtests._guard import HostRefused, check_host  # noqa: E402
from loadtests._payloads import (  # noqa: E402
    agent_chat_body,
    agent_prompts,
    chat_body,
    memory_search_body,
    memory_write_body,
)

USER_KINDS = ("chat", "agent", "memory_write", "memory_search")


def _enabled_kinds() -> set[str]:
    raw = os.environ.get("RECALLSERVE_LOAD_USERS", "chat")
    kinds = {k.strip() for k in raw.split(",") if k.strip()}
    unknown = kinds - set(USER_KINDS)
    if unknown or not kinds:
        raise SystemExit(f"RECALLSERVE_LOAD_USERS: unknown kinds {sorted(unknown)}; choose from {', '.join(USER_KINDS)}")
    return kinds


_API_KEY = os.environ.get("RECALLSERVE_LOAD_API_KEY", "sk-local")
_MODEL = os.environ.get("RECALLSERVE_LOAD_MODEL", "recallserve")
_MAX_TOKENS = int(os.environ.get("RECALLSERVE_LOAD_MAX_TOKENS", "16"))
_SEED = int(os.environ.get("RECALLSERVE_LOAD_SEED", "0"))


@events.test_start.add_listener
def _refuse_remote_hosts(environment, **_kwargs) -> None:  # type: ignore[no-untyped-def]
    try:
        check_host(environment.host or "")
    except HostRefused as exc:
        print(f"locustfile: {exc}", file=sys.stderr)
        environment.process_exit_code = 2
        if environment.runner is not None:
            environment.runner.quit()
        raise SystemExit(2) from None


class _RecallUser(HttpUser):
    """Shared setup: auth header, a per-user seeded RNG, host re-checked per user."""

    abstract = True
    host = "http://127.0.0.1:8000"
    _count = 0

    def on_start(self) -> None:
        check_host(self.host)
        _RecallUser._count += 1
        self.rng = random.Random(_SEED * 1_000_003 + _RecallUser._count)
        self.client.headers.update({"Authorization": f"Bearer {_API_KEY}", "Content-Type": "application/json"})

    def _post(self, path: str, body: dict) -> None:
        # NOTE: catch_response so that a 200 with an error body, or any non-2xx, counts as failure
        # under the route's name (not per distinct URL).
        with self.client.post(path, json=body, name=path, catch_response=True) as resp:
            if resp.status_code // 100 != 2:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:120]}")
            else:
                resp.success()


class ChatUser(_RecallUser):
    """A chat user: conversations of short turns in server-side sessions, thinking time between them."""

    weight = 3
    # NOTE: 1-3 s between turns: people read the answer; keeps the offered load per user modest.
    wait_time = between(1.0, 3.0)
    # NOTE: a conversation of this many turns, then a new session (history, summary and entity
    # table of each session live in the state deployment, whichever ingress replica serves a turn).
    turns_per_session = 6

    def on_start(self) -> None:
        super().on_start()
        self.user_id = f"lt-user-{_RecallUser._count}-{self.rng.randrange(1 << 30):x}"
        self.turn = 0

    @tag("chat")
    @task
    def chat(self) -> None:
        session = (self.user_id, f"{self.user_id}-s{self.turn // self.turns_per_session}")
        self.turn += 1
        self._post("/v1/chat/completions", chat_body(self.rng, _MODEL, _MAX_TOKENS, session=session))


class AgentUser(_RecallUser):
    """A customer-service user: questions that need a look-up (orders, batches, tickets, stock,
    arithmetic) or none, answered by the agent loop with tools."""

    weight = 3
    wait_time = between(1.0, 3.0)
    _prompts: list[str] = []

    @tag("agent")
    @task
    def ask(self) -> None:
        if not AgentUser._prompts:
            AgentUser._prompts = agent_prompts()
        self._post("/v1/chat/completions", agent_chat_body(self.rng, _MODEL, _MAX_TOKENS, AgentUser._prompts))


class MemoryWriteUser(_RecallUser):
    """Background ingestion: documents and facts written as memories."""

    weight = 1
    wait_time = between(0.5, 1.5)

    @tag("memory_write")
    @task
    def write(self) -> None:
        self._post("/v1/memories", memory_write_body(self.rng))


class MemorySearchUser(_RecallUser):
    """Tools and dashboards searching memory directly (reads outnumber writes)."""

    weight = 2
    wait_time = between(0.2, 1.0)

    @tag("memory_search")
    @task
    def search(self) -> None:
        self._post("/v1/memories/search", memory_search_body(self.rng))


def _select_users() -> None:
    # NOTE: locust only runs classes with abstract False: this is the selection switch. A function,
    # not a module-level loop, so no loop variable leaves a second name for a class in the module
    # (locust would see it as a duplicate user class).
    enabled = _enabled_kinds()
    users = {"chat": ChatUser, "agent": AgentUser, "memory_write": MemoryWriteUser, "memory_search": MemorySearchUser}
    for kind, cls in users.items():
        cls.abstract = kind not in enabled


_select_users()
