"""Start-up warm-up: the ingress reports ready only after its warm-up, so the first user turn finds
the agent's prompt prefix already in the reasoner's cache (issue 17: a cold first answer queued
behind a warm-up that ran after "ready")."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest
from fastapi.testclient import TestClient

from recallserve.deployments.engines import LlamaCppConfig, LlamaCppEngine
from recallserve.serve.agent import Agent, AgentConfig, default_registry
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.engine import ChatMessage, ChatResult, GenerationParams
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings

AUTH = {"Authorization": "Bearer sk-acme"}


class _Recording:
    """The real engine, with each call's result kept (the test reads the first turn's first call)."""

    def __init__(self, engine: LlamaCppEngine) -> None:
        self.engine = engine
        self.results: list[ChatResult] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)

    async def chat(self, messages: Sequence[ChatMessage], params: GenerationParams) -> ChatResult:
        out = await self.engine.chat(messages, params)
        self.results.append(out)
        return out


@pytest.mark.slow
def test_first_turn_after_ready_reuses_the_warmed_agent_prefix() -> None:
    engine = _Recording(LlamaCppEngine(LlamaCppConfig(model="smollm2-135m-instruct-q4_1", n_ctx=2048, n_threads=1)))
    agent = Agent(engine, default_registry(demo=True),  # type: ignore[arg-type]
                  config=AgentConfig(max_steps=1, step_max_tokens=32))
    pipeline = ChatPipeline(engine, PipelineSettings(max_request_tokens=32, agent_overhead_tokens=900),  # type: ignore[arg-type]
                            agent=agent)
    scopes = ["orders:read"]

    async def warm_up() -> None:
        await agent.warm_up(scopes)

    app = create_app(pipeline, Authenticator({"sk-acme": "acme"}, default_scopes=scopes), on_startup=[warm_up],
                     startup_wait_s=300)
    with TestClient(app) as c:
        # NOTE: entering the client ran the lifespan: the warm-up is done before any request. It
        # evaluates the direct prompt, then the tool prompt (last, so the live cache holds it).
        assert len(engine.results) == 2
        assert c.get("/healthz").json()["warm"] is True
        r = c.post("/v1/chat/completions", headers=AUTH, json={
            "model": "recallserve", "max_tokens": 16,
            "messages": [{"role": "user", "content": "What is the status of order 104333?"}]})
        assert r.status_code == 200, r.text
    warm, first = engine.results[1], engine.results[2]
    prefix = warm.prompt_tokens - 20  # the warm-up's own question ("hello") and the template's tail
    assert first.cached_tokens >= prefix > 500
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= first.cached_tokens
    asyncio.run(engine.engine.close())


def test_a_slow_warm_up_is_bounded_and_reported_on_healthz() -> None:
    release = threading.Event()

    async def slow() -> None:
        await asyncio.to_thread(release.wait, 60)

    app = create_app(ChatPipeline(object(), PipelineSettings(model_name="m")), Authenticator({"k": "t"}),  # type: ignore[arg-type]
                     on_startup=[slow], startup_wait_s=0.2)
    with TestClient(app) as c:
        # NOTE: the hook is still blocked, so the app became ready by the bound, not by the hook.
        assert c.get("/healthz").json()["warm"] is False
        release.set()
        for _ in range(100):
            if c.get("/healthz").json()["warm"]:
                break
            time.sleep(0.05)
        assert c.get("/healthz").json()["warm"] is True
