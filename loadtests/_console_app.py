"""The whole ingress app in one process for the console's browser tests and its page benchmark.

Real memory service (two hybrid shards; the hashing embedder stands in for MiniLM), experience
service, session store, turn-trace store, agent with the demo world's tools and the console's
routes. The model is :class:`ProtocolEngine`, a stand-in that follows the agent's JSON protocol
(route to ``order_status``, call it for order 104208, answer), so a turn has a route, steps and a
tool call to show; these measure and test the console, not a model.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["ANSWER", "CHROMIUM_ARGS", "ProtocolEngine", "build_console_app", "chromium_path", "serve_in_thread"]

#: Flags for Debian's chromium run headless as root with no network but 127.0.0.1.
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
ANSWER = "Order 104208 was delivered on 2024-03-02 (see [1])."


def chromium_path() -> str | None:
    """The system Chromium (``$RECALLSERVE_CHROMIUM`` overrides), or None."""
    return os.environ.get("RECALLSERVE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class ProtocolEngine:
    """An ``LLMEngine`` stand-in: router -> ``order_status`` for order 104208 -> final answer."""

    model_name = "protocol-stand-in"
    context_window = 8192

    def __init__(self) -> None:
        self.calls: list[tuple[list[Any], Any]] = []

    def _reply(self, messages: Sequence[Any], params: Any) -> str:
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

    async def chat(self, messages: Sequence[Any], params: Any) -> Any:
        from recallserve.serve.engine import ChatResult

        text = self._reply(messages, params)
        return ChatResult(text=text, prompt_tokens=10, completion_tokens=len(text) // 4, finish_reason="stop",
                          model=self.model_name)

    async def stream(self, messages: Sequence[Any], params: Any) -> AsyncIterator[Any]:
        from recallserve.serve.engine import ChatDelta

        text = self._reply(messages, params)
        yield ChatDelta(text=text)
        yield ChatDelta(text="", finish_reason="stop", prompt_tokens=10, completion_tokens=len(text) // 4)

    async def count_tokens(self, text: str) -> int:
        return len(text) // 4

    async def close(self) -> None:
        return None


def build_console_app(root: Path, keys: Mapping[str, str], admins: Sequence[str] = ()) -> tuple[Any, Any, ProtocolEngine]:
    """(the FastAPI app, its memory coordinator, its engine) with every store under ``root``."""
    from recallserve.memory_shards import HashingEmbedder
    from recallserve.memory_shards.retrieval import local_hybrid_coordinator
    from recallserve.serve.agent import Agent, AgentConfig, default_registry
    from recallserve.serve.api.app import create_app
    from recallserve.serve.api.auth import Authenticator
    from recallserve.serve.console import build_console_router, tenant_records
    from recallserve.serve.context import ContextConfig, ContextManager, SessionStore
    from recallserve.serve.context import build_router as build_session_router
    from recallserve.serve.experience import ExperienceConfig, ExperienceService
    from recallserve.serve.erasure import ErasureLog, ErasureService
    from recallserve.serve.erasure import build_router as build_erasure_router
    from recallserve.serve.experience import build_router as build_experience_router
    from recallserve.serve.memory_api import MemoryService, build_router
    from recallserve.serve.pipeline import ChatPipeline, PipelineSettings
    from recallserve.serve.traces import TraceRecorder, TraceStore
    from recallserve.serve.traces import build_router as build_turn_router

    emb = HashingEmbedder(384)
    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=root / "memory")

    async def embed(texts: list[str]) -> Any:
        return await asyncio.to_thread(emb.embed, texts)

    auth = Authenticator(dict(keys), admins=admins)
    memory = MemoryService(coord, embed, top_k=8, threshold=0.0, pii_for=auth.pii_for)
    context = ContextManager(SessionStore(root / "sessions.sqlite3"), ContextConfig(summary_keep_recent=1),
                             pii_for=auth.pii_for)
    experiences = ExperienceService(ExperienceConfig(data_dir=root / "exp"), emb.embed, memory=memory,
                                    pii_for=auth.pii_for)
    engine = ProtocolEngine()
    agent = Agent(engine, default_registry(demo=True), memory=memory, config=AgentConfig(max_steps=3))
    traces = TraceRecorder(TraceStore(root / "turns.sqlite3"))
    erasure = ErasureService(ErasureLog(root / "erasures.sqlite3"), memory.coordinators(), {
        "sessions": context.store, "experiences": experiences.store, "turns": traces.store})
    pipeline = ChatPipeline(engine, PipelineSettings(), memory=memory, context=context, agent=agent,  # type: ignore[arg-type]
                            experiences=experiences, traces=traces, erased=erasure.erased_since)
    routers = [build_router(memory, auth), build_experience_router(experiences, auth),
               build_session_router(context, auth), build_turn_router(traces.store, auth),
               build_console_router(auth, tenant_records(coord.stats)), build_erasure_router(erasure, auth)]
    return create_app(pipeline, auth, routers=routers), coord, engine


@contextmanager
def serve_in_thread(app: Any, start_timeout_s: float = 30.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 on a free port in a thread; yields its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    try:
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
