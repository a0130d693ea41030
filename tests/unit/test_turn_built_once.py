"""The turn is built once: images analysed and memories recalled once, the budget measured on the
prompt the engine receives, and the in-process callers (eval agent, demo) sending the HTTP prompt.

A recording engine stands in for the model (it isolates the pipeline); every assertion is on the
HTTP answer, on the prompt the engine received, or on the calls the memory tier and the image
describer received.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recallserve.serve.agent import Agent, AgentConfig, default_registry
from recallserve.serve.agent.demo import demo_photo_data_url
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import READ_ONLY_SCOPES, Authenticator
from recallserve.serve.engine import ChatMessage
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings, agent_turn
from recallserve.serve.tokens import count_tokens
from recallserve.serve.turn import RecallConfig
from tests.unit.test_turn_prompt import KEYS, MEMORY, OneMemory, RecordingEngine

HEADERS = {"Authorization": "Bearer sk-acme"}


class CountingDescriber:
    """An image describer that counts its calls (the vision model of GPU profiles)."""

    def __init__(self) -> None:
        self.calls = 0

    async def describe(self, image_bytes: bytes, mime: str) -> str:
        self.calls += 1
        return "A coffee machine panel whose display reads E42"


class WideEngine(RecordingEngine):
    """The recording engine with an 8k window (room for the default reserves: 1200 agent + 750 memory)."""

    @property
    def context_window(self) -> int:
        return 8192


def _tokens(prompt: list[ChatMessage]) -> int:
    """The prompt's tokens as context-mode counts them: content + 4 per message (MESSAGE_OVERHEAD)."""
    return sum(count_tokens(m.content) + 4 for m in prompt)


def _agent(engine: RecordingEngine, memory: OneMemory, describer: CountingDescriber | None = None) -> Agent:
    return Agent(engine, default_registry(demo=True), memory=memory, describer=describer,
                 config=AgentConfig(max_steps=2, use_router=False))


@pytest.fixture
def rig() -> Iterator[tuple[TestClient, RecordingEngine, OneMemory, CountingDescriber]]:
    engine, memory, describer = RecordingEngine(), OneMemory(), CountingDescriber()
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), memory=memory,
                            agent=_agent(engine, memory, describer))
    with TestClient(create_app(pipeline, Authenticator(KEYS))) as c:
        yield c, engine, memory, describer


def _question(text: str = "Has this fault happened before?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": demo_photo_data_url()}}]}]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("agent", ["auto", "on", "off"])
def test_images_and_recall_run_once_per_turn(rig: Any, agent: str, stream: bool) -> None:
    c, engine, memory, describer = rig
    body = {"model": "recallserve", "max_tokens": 64, "stream": stream, "metadata": {"agent": agent},
            "messages": _question()}
    r = c.post("/v1/chat/completions", headers=HEADERS, json=body)
    assert r.status_code == 200, r.text
    assert engine.calls, "no engine call"
    # one recall (the question plus the photo's OCR text) and one description of the one photo
    assert len(memory.searches) == 1 and memory.searches[0][1].startswith("Has this fault happened before?")
    assert describer.calls == 1
    # what they found reached every prompt the engine received
    for prompt in engine.prompts:
        assert MEMORY in prompt[-1].content and "Attached image: A coffee machine panel" in prompt[-1].content


def test_a_bad_image_is_a_400_before_any_recall(rig: Any) -> None:
    c, engine, memory, describer = rig
    bad = [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}]
    r = c.post("/v1/chat/completions", headers=HEADERS, json={"model": "recallserve", "messages": bad})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image"
    assert memory.searches == [] and engine.calls == []


def _long_history(turns: int) -> list[dict[str, Any]]:
    filler = "The espresso shot from my machine tastes a bit sour; is grind size, dose or water temperature to blame? "
    msgs: list[dict[str, Any]] = []
    for i in range(turns):
        msgs += [{"role": "user", "content": f"Question {i}: {filler * 3}"}, {"role": "assistant", "content": "Noted."}]
    return msgs + [{"role": "user", "content": "Which grind size should I try?"}]


@pytest.mark.parametrize("agent", [None, "on"])
def test_the_budget_is_measured_on_the_prompt_the_engine_receives(agent: str | None) -> None:
    """The reported total is the received prompt's tokens; when the reserve for the fixed parts is
    too small (400 tokens for a ~1,100-token agent head), the history is fitted again on the measured
    prompt, so the prompt and max_tokens still fit the engine's 2048-token window."""
    engine, memory = RecordingEngine(), OneMemory()
    settings = PipelineSettings(write_back=False, agent_overhead_tokens=400, recall=RecallConfig(prompt_chars=800))
    pipeline = ChatPipeline(engine, settings, memory=memory, agent=_agent(engine, memory) if agent else None)
    with TestClient(create_app(pipeline, Authenticator(KEYS))) as c:
        body = {"model": "recallserve", "max_tokens": 200, "messages": _long_history(24),
                **({"metadata": {"agent": agent}} if agent else {})}
        r = c.post("/v1/chat/completions", headers=HEADERS, json=body)
        assert r.status_code == 200, r.text
        first = engine.prompts[0]
        context = r.json()["recallserve"]["context"]
        assert context["breakdown"]["total"] == _tokens(first)
        assert _tokens(first) + 200 <= engine.context_window
        assert context["dropped_messages"] > 0 and MEMORY in first[-1].content
        # a question that cannot fit beside max_tokens is the client's 400, and no engine call
        engine.calls.clear()
        huge = [{"role": "user", "content": "espresso " * 1800 + "why?"}]
        r = c.post("/v1/chat/completions", headers=HEADERS,
                   json={**body, "messages": huge, "max_tokens": 200})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_budget_exceeded", r.text
        assert engine.calls == []


def test_the_in_process_agent_sends_the_http_prompt() -> None:
    """``recallserve eval agent`` and ``recallserve demo`` run the agent on :func:`agent_turn`: the
    engine receives the same prompt as for the same request over HTTP."""
    messages = [{"role": "system", "content": "Sign with -- Acme."}, {"role": "user", "content": "Earlier question"},
                {"role": "assistant", "content": "Earlier answer"}, *_question()]
    engine, memory = WideEngine(), OneMemory()
    agent = _agent(engine, memory, CountingDescriber())
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), memory=memory, agent=agent)
    with TestClient(create_app(pipeline, Authenticator(KEYS))) as c:
        r = c.post("/v1/chat/completions", headers=HEADERS,
                   json={"model": "recallserve", "messages": messages, "metadata": {"agent": "on"}})
        assert r.status_code == 200, r.text
    over_http = list(engine.prompts)
    engine.calls.clear()

    async def in_process() -> None:
        # NOTE: the scopes an API key gets by default (the HTTP request above had them)
        request, turn = await agent_turn(agent, messages, tenant="acme", scopes=list(READ_ONLY_SCOPES), mode="on")
        await agent.run(request, turn)

    asyncio.run(in_process())
    assert engine.prompts and engine.prompts == over_http
    assert MEMORY in over_http[0][-1].content and "Sign with -- Acme." in over_http[0][0].content
