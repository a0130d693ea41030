"""What a chat request asks for is done on every path (plain and agent), or refused naming the field.

* a non-zero ``presence_penalty`` / ``frequency_penalty`` was accepted and applied by no engine
  (now passed to llama.cpp and vLLM, which define them as OpenAI does, on the plain and agent paths);
* the client's sampling options were dropped on the agent path: its steps and direct answers
  sampled at the agent's temperature and seed, whatever the request said; ``stop`` sequences and
  a ``response_format`` were dropped with ``metadata.agent: on`` or segmented reasoning (now a
  400 naming the field), and ``stop`` with the agent on auto (now a plain answer, as a
  ``response_format`` already was);
* ``metadata.agent: on`` on a server without the agent loop was a plain answer, in silence;
* ``tool_choice: "none"`` was accepted and ignored: the server's tools still ran (now the agent is
  off for the request, and ``none`` with ``metadata.agent: on`` is a 400);
* the agent path's ``finish_reason`` was always "stop": a direct answer cut at ``max_tokens``
  told the client it was complete (now "length", plain and streamed);
* ``response_format: {"type": "text"}`` (the default, no constraint) turned the agent off;
* a failure mid-stream on the agent path is an error event, then ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recallserve.serve.agent import Agent, AgentConfig, default_registry
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.context import ContextManager, SessionStore
from recallserve.serve.engine import ChatDelta, ChatMessage, ChatResult, GenerationParams
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings
from tests.security.conftest import Rig, serving
from tests.security.conftest import chat_with_agent_off as _chat
from tests.security.conftest import refused as _refused
from tests.unit.test_turn_prompt import OneMemory, RecordingEngine


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One rig for the module (no case reads another's state)."""
    with serving(tmp_path_factory.mktemp("rig")) as r:
        yield r


# ---- options no path applies ----------------------------------------------------------------------

@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_a_penalty_reaches_the_engine_and_out_of_range_is_400(rig: Rig, field: str) -> None:
    assert _chat(rig, **{field: 0.5}).status_code == 200
    assert getattr(rig.engine.calls[-1][1], field) == 0.5
    assert _chat(rig, **{field: None}).status_code == 200
    assert getattr(rig.engine.calls[-1][1], field) == 0.0
    _refused(rig, _chat(rig, **{field: 2.5}), field)


@pytest.mark.parametrize("extra", [{"stop": ["END"]}, {"response_format": {"type": "json_object"}}], ids=["stop", "format"])
@pytest.mark.parametrize("meta", [{"agent": "on"}, {"reasoning": "segmented"}], ids=["agent on", "segmented"])
def test_a_client_protocol_the_path_would_drop_is_400(rig: Rig, meta: dict[str, str], extra: dict[str, Any]) -> None:
    calls = len(rig.engine.calls)
    _refused(rig, _chat(rig, metadata=meta, **extra), next(iter(extra)))
    assert len(rig.engine.calls) == calls


def test_agent_on_without_an_agent_loop_is_400(rig: Rig) -> None:
    """The rig runs no agent: ``agent: on`` was answered by the plain path, tools never offered."""
    calls = len(rig.engine.calls)
    _refused(rig, _chat(rig, metadata={"agent": "on"}), "metadata.agent")
    assert len(rig.engine.calls) == calls


# ---- the agent path samples as the client asked ---------------------------------------------------

class WordEngine(RecordingEngine):
    """The recording engine with a budget: one word a token, cut at ``max_tokens`` ("length")."""

    async def chat(self, messages: Sequence[ChatMessage], params: GenerationParams) -> ChatResult:
        text, finish = self._cut(self._next(messages, params), params)
        return ChatResult(text=text, prompt_tokens=10, completion_tokens=len(text.split()), finish_reason=finish,
                          model="scripted")

    async def stream(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatDelta]:
        text, finish = self._cut(self._next(messages, params), params)
        for word in text.split(" "):
            yield ChatDelta(text=word + " ")
        yield ChatDelta(text="", finish_reason=finish, prompt_tokens=10, completion_tokens=len(text.split()))

    def _cut(self, text: str, params: GenerationParams) -> tuple[str, str]:
        if params.json_schema is not None or len(text.split()) <= params.max_tokens:
            return text, "stop"
        return " ".join(text.split()[: params.max_tokens]), "length"


@pytest.fixture
def agent_app(tmp_path: Path) -> Iterator[tuple[TestClient, RecordingEngine]]:
    """A pipeline with the agent loop (router, JSON steps, direct answers) over a recording engine."""
    engine = WordEngine()
    agent = Agent(engine, default_registry(demo=True), memory=OneMemory(),
                  config=AgentConfig(max_steps=2, temperature=0.1, seed=11))
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False, agent_overhead_tokens=400), memory=OneMemory(),
                            context=ContextManager(SessionStore(tmp_path / "s.sqlite3")), agent=agent)
    with TestClient(create_app(pipeline, Authenticator({"sk-acme": "acme"}))) as c:
        yield c, engine


def _agent_chat(c: TestClient, stream: bool, **extra: Any) -> Any:
    body = {"model": engine_model(c), "messages": [{"role": "user", "content": "Is order 104208 delivered?"}],
            "stream": stream, **extra}
    return c.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-acme"})


def engine_model(c: TestClient) -> str:
    return c.get("/v1/models", headers={"Authorization": "Bearer sk-acme"}).json()["data"][0]["id"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("mode", ["auto", "on", "off"])
def test_the_agent_answers_with_the_clients_sampling(agent_app: tuple[TestClient, RecordingEngine], mode: str,
                                                     stream: bool) -> None:
    c, engine = agent_app
    r = _agent_chat(c, stream, temperature=1.3, top_p=0.5, seed=7, presence_penalty=0.4, frequency_penalty=-0.3,
                    metadata={"agent": mode})
    assert r.status_code == 200, r.text
    answering = [p for _, p in engine.calls if not (p.json_schema and "tools" in p.json_schema.get("properties", {}))]
    assert answering, engine.calls
    for params in answering:  # steps and direct answers: the client's
        assert (params.temperature, params.top_p, params.seed) == (1.3, 0.5, 7), params
        assert (params.presence_penalty, params.frequency_penalty) == (0.4, -0.3), params
    for _, params in engine.calls:
        if params not in answering:  # the router, a classification: the agent's own
            assert (params.temperature, params.seed) == (0.1, 11), params


def test_the_agent_keeps_its_own_sampling_when_the_client_sets_none(agent_app: tuple[TestClient, RecordingEngine]) -> None:
    c, engine = agent_app
    assert _agent_chat(c, False, metadata={"agent": "on"}).status_code == 200
    assert engine.calls and all((p.temperature, p.seed) == (0.1, 11) for _, p in engine.calls), engine.calls


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_stop_sequences_on_auto_are_a_plain_answer_that_applies_them(agent_app: tuple[TestClient, RecordingEngine],
                                                                     stream: bool) -> None:
    """The agent's JSON steps cannot take the client's stop sequences: with ``agent: auto`` the
    request is answered as a plain one, which passes them to the engine (they were dropped)."""
    c, engine = agent_app
    r = _agent_chat(c, stream, stop=["END"])
    assert r.status_code == 200, r.text
    assert engine.calls and all(p.stop == ["END"] and p.json_schema is None for _, p in engine.calls), engine.calls


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_tool_choice_none_runs_no_tool(agent_app: tuple[TestClient, RecordingEngine], stream: bool) -> None:
    """``tool_choice: "none"`` was accepted and ignored: the router and the tool loop still ran."""
    c, engine = agent_app
    r = _agent_chat(c, stream, tool_choice="none")
    assert r.status_code == 200, r.text
    assert engine.calls and all(p.json_schema is None for _, p in engine.calls), engine.calls  # one direct answer


def test_tool_choice_none_with_agent_on_is_400(rig: Rig) -> None:
    _refused(rig, _chat(rig, metadata={"agent": "on"}, tool_choice="none"), "tool_choice")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_direct_answer_cut_at_max_tokens_finishes_with_length(agent_app: tuple[TestClient, RecordingEngine],
                                                               stream: bool) -> None:
    """The agent path's finish_reason was "stop" whatever happened; an SDK client asks for more on "length"."""
    c, _ = agent_app
    finishes = {}
    for max_tokens in (2, 64):  # NOTE: the engine's answer to this question is five words
        r = c.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-acme"}, json={
            "model": engine_model(c), "metadata": {"agent": "off"}, "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": "What is my loyalty card number?"}]})
        assert r.status_code == 200, r.text
        if stream:
            events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            finishes[max_tokens] = [e["choices"][0].get("finish_reason") for e in events if e.get("choices")][-1]
        else:
            finishes[max_tokens] = r.json()["choices"][0]["finish_reason"]
    assert finishes == {2: "length", 64: "stop"}, finishes


def test_a_text_response_format_keeps_the_agent(agent_app: tuple[TestClient, RecordingEngine]) -> None:
    """``{"type": "text"}`` is the default (no constraint); it turned the agent off, in silence."""
    c, engine = agent_app
    assert _agent_chat(c, False, response_format={"type": "text"}).status_code == 200
    assert any(p.json_schema is not None for _, p in engine.calls), engine.calls  # the router or a step ran
    engine.calls.clear()
    assert _agent_chat(c, False, response_format={"type": "json_object"}).status_code == 200
    assert [p.json_schema for _, p in engine.calls] == [{"type": "object"}], engine.calls  # one plain, constrained call


@pytest.mark.parametrize("exc", [RuntimeError("bug"), ValueError("bug"), KeyError("bug")], ids=lambda e: type(e).__name__)
def test_a_failure_mid_stream_on_the_agent_path_is_an_error_event_then_done(
        agent_app: tuple[TestClient, RecordingEngine], exc: Exception) -> None:
    """test_http_shapes' ``agent: on`` case ran on a rig without the agent loop, so it checked the
    plain path twice (``on`` was dropped in silence there; now a 400): the agent path's stream here."""
    c, engine = agent_app

    def fail(*_: Any) -> str:
        raise exc

    engine._next = fail  # type: ignore[method-assign]
    r = _agent_chat(c, True, metadata={"agent": "on"})
    assert r.status_code == 200, r.text
    events = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", r.text
    errors = [json.loads(e)["error"] for e in events[:-1] if "error" in json.loads(e)]
    assert len(errors) == 1 and set(errors[0]) == {"message", "type", "param", "code"}, r.text
    assert "bug" not in errors[0]["message"]
