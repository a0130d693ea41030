"""A sixth adversarial pass over ``/v1/chat/completions`` (plain and streaming): what OpenAI's API
validates, or what a request asks for, that this one accepted and then did not do.

* an assistant message's ``tool_calls`` need not be answered: a call with no tool message after it
  (the history's last message, or followed by the next user message), or only some of parallel
  calls answered, was answered 200 where OpenAI refuses ("an assistant message with 'tool_calls'
  must be followed by tool messages responding to each 'tool_call_id'"); ``tool_calls: []``
  ("empty array") and one call answered twice were accepted too, and an assistant message with
  a null content and no calls (OpenAI: content "required unless tool_calls") was rendered as
  nothing. Each is a 400 naming ``messages.<i>.tool_calls`` / ``.tool_call_id`` / ``.content``;
  the openai SDK's own tool-calling history still passes;
* ``response_format.json_schema`` was free-form: a schema of the wrong shape (``"type":
  "nope"``, ``"properties": [...]``, ``"minLength": "3"``, a ``$ref`` to nothing) reached the
  engine, whose grammar compiler failed on it (an engine error for the client's mistake, or an
  error event mid-stream); a missing or malformed ``name``, an unknown key and ``strict: "yes"``
  were ignored. Each is a 400 naming its path; the schema openai-python builds from a pydantic
  model (``$defs`` / ``$ref``, ``anyOf``) still passes and reaches the engine;
* a schema's repetition counts were unbounded: llama.cpp's grammar compiler writes each
  repetition out, so ``"minLength": 1e8`` built a 500 MB grammar in 5 s on the engine's thread
  (a pattern ``^a{100000000}$`` 100 MB); a count past 16,384, or counts adding up past 65,536,
  are a 400 naming the schema;
* a non-zero ``presence_penalty`` / ``frequency_penalty`` was accepted and applied by no engine
  (now passed to llama.cpp and vLLM, which define them as OpenAI does, on the plain and agent paths);
* the client's sampling options were dropped on the agent path: its steps and direct answers
  sampled at the agent's temperature and seed, whatever the request said; ``stop`` sequences and
  a ``response_format`` were dropped with ``metadata.agent: on`` or segmented reasoning (now a
  400 naming the field), and ``stop`` with the agent on auto (now a plain answer, as a
  ``response_format`` already was);
* ``metadata.agent: on`` on a server without the agent loop was a plain answer, in silence;
* an assistant message's calls never reached the model (only its text did, none for a call-only
  message): of two tool answers ("18 C", "24 C") it could not tell which call each answered. The
  history now renders each call (``[call <id>] <name>(<arguments>)``) and heads each answer with
  its call's id, and the reject PII policy checks the arguments as it checks the content;
* an empty user message was rendered as "(no text; see the attached image)" with no image;
* ``tool_choice: "none"`` was accepted and ignored: the server's tools still ran (now the agent is
  off for the request, and ``none`` with ``metadata.agent: on`` is a 400);
* the agent path's ``finish_reason`` was always "stop": a direct answer cut at ``max_tokens``
  told the client it was complete (now "length", plain and streamed);
* ``response_format: {"type": "text"}`` (the default, no constraint) turned the agent off;
* an assistant's ``{"type": "refusal"}`` content part (which openai-python's types allow) was a 400.
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
from tests.security.conftest import A, Rig, serving
from tests.unit.edge.conftest import assert_envelope, headers
from tests.unit.test_turn_prompt import OneMemory, RecordingEngine

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
ASK = {"role": "user", "content": "Weather in Paris?"}


def _answer(call_id: str, text: str = "18 C") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _calls(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One rig for the module (no case reads another's state)."""
    with serving(tmp_path_factory.mktemp("rig")) as r:
        yield r


def _chat(rig: Rig, messages: list[dict[str, Any]] | None = None, *, stream: bool = False, **extra: Any) -> Any:
    body = {"model": "recallserve", "metadata": {"agent": "off"}, "messages": messages or [ASK], "stream": stream}
    return rig.client.post("/v1/chat/completions", json={**body, **extra}, headers=headers(A))


def _refused(rig: Rig, r: Any, param: str) -> dict[str, Any]:
    """``r`` is a 400 naming ``param`` (first in its message too) and no engine call was made."""
    error = assert_envelope(r, 400, param)
    assert error["message"].startswith(f"{param}: "), error
    return error


# ---- every tool call answered, once ---------------------------------------------------------------

BAD_HISTORIES: dict[str, tuple[list[dict[str, Any]], str]] = {
    "a call left unanswered at the end": ([ASK, _calls(CALL)], "messages.1.tool_calls"),
    "a call left unanswered before the next question": (
        [ASK, _calls(CALL), {"role": "user", "content": "never mind"}], "messages.1.tool_calls"),
    "one of two parallel calls answered": (
        [ASK, _calls(CALL, CALL2), _answer("call_2"), {"role": "user", "content": "and?"}], "messages.1.tool_calls"),
    "an unanswered call in an earlier turn": (
        [ASK, _calls(CALL), {"role": "assistant", "content": "18 C"}, {"role": "user", "content": "ok"}],
        "messages.1.tool_calls"),
    "an empty tool_calls": ([ASK, {"role": "assistant", "content": "hm", "tool_calls": []}, {"role": "user", "content": "?"}],
                            "messages.1.tool_calls"),
    "one call answered twice": ([ASK, _calls(CALL), _answer("call_1"), _answer("call_1", "19 C"),
                                 {"role": "user", "content": "which?"}], "messages.3.tool_call_id"),
    "a null assistant content without calls": ([ASK, {"role": "assistant", "content": None},
                                                {"role": "user", "content": "?"}], "messages.1.content"),
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", BAD_HISTORIES)
def test_a_tool_history_openai_refuses_is_400_naming_the_message(rig: Rig, case: str, stream: bool) -> None:
    messages, param = BAD_HISTORIES[case]
    calls = len(rig.engine.calls)
    _refused(rig, _chat(rig, messages, stream=stream), param)
    assert len(rig.engine.calls) == calls  # refused before any model call


def test_the_unanswered_call_is_named_in_the_message(rig: Rig) -> None:
    error = _refused(rig, _chat(rig, [ASK, _calls(CALL, CALL2), _answer("call_1")]), "messages.1.tool_calls")
    assert "'call_2' has no answer" in error["message"], error


WELL_FORMED: dict[str, list[dict[str, Any]]] = {
    "answers in any order, then a question": [ASK, _calls(CALL, CALL2), _answer("call_2", "Rome: 24 C"),
                                              _answer("call_1"), {"role": "user", "content": "warmer?"}],
    "answered calls as the history's end": [ASK, _calls(CALL, content="Looking."), _answer("call_1")],
    "a refusal echoed with a null content": [ASK, {"role": "assistant", "content": None, "refusal": "I can't."},
                                             {"role": "user", "content": "why?"}],
}


def test_an_assistant_refusal_part_is_history_and_only_an_assistants(rig: Rig) -> None:
    """openai-python's assistant message takes ``{"type": "refusal"}`` parts: they were a 400."""
    parts = [{"type": "text", "text": "Let me see."}, {"type": "refusal", "refusal": "I cannot share that code."}]
    r = _chat(rig, [ASK, {"role": "assistant", "content": parts}, {"role": "user", "content": "why not?"}])
    assert r.status_code == 200, r.text
    assert "Let me see.\nI cannot share that code." in rig.prompts()[-1]
    _refused(rig, _chat(rig, [{"role": "user", "content": parts}]), "messages.0.content")


@pytest.mark.parametrize("case", WELL_FORMED)
def test_a_tool_history_openai_accepts_is_answered(rig: Rig, case: str) -> None:
    r = _chat(rig, WELL_FORMED[case])
    assert r.status_code == 200, r.text


def test_the_sdk_reports_an_unanswered_call_as_a_bad_request(rig: Rig) -> None:
    """Through openai-python: the 400 is its ``BadRequestError`` with the param; the same history
    with every call answered is answered, and its answers reach the prompt."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{rig.client.base_url}/v1", api_key="sk-acme", http_client=rig.client,
                           max_retries=0)
    history: list[Any] = [ASK, _calls(CALL, CALL2), _answer("call_1", "Paris: 18 C")]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="recallserve", messages=history, metadata={"agent": "off"})
    assert caught.value.param == "messages.1.tool_calls", caught.value.body  # type: ignore[attr-defined]
    ok = client.chat.completions.create(model="recallserve", metadata={"agent": "off"},
                                        messages=[*history, _answer("call_2", "Rome: 24 C")])
    assert ok.choices[0].message.content
    prompt = rig.prompts()[-1]
    assert "Paris: 18 C" in prompt and "Rome: 24 C" in prompt, prompt


@pytest.mark.parametrize("session", [False, True], ids=["sessionless", "session"])
def test_each_tool_answer_reaches_the_model_beside_its_call(rig: Rig, session: bool) -> None:
    """The calls (function and arguments) were never rendered: the model read two bare answers."""
    messages = [{"role": "user", "content": "Weather in Paris and Rome?"}, _calls(CALL, CALL2),
                _answer("call_2", "24 C"), _answer("call_1", "18 C"), {"role": "user", "content": "Which is warmer?"}]
    meta = {"agent": "off", **({"session_id": "tools-rendered"} if session else {})}
    assert _chat(rig, messages, metadata=meta).status_code == 200
    rendered = [(m.role, m.content) for m in rig.engine.calls[-1][0]]
    assert ("assistant", '[call call_1] get_weather({"city": "Paris"})\n[call call_2] get_weather({"city": "Rome"})') \
        in rendered, rendered
    assert rendered.index(("tool", "[result of call call_2] 24 C")) < rendered.index(("tool", "[result of call call_1] 18 C"))


def test_call_arguments_are_checked_under_the_reject_policy(rig: Rig) -> None:
    """Rendered into the history (and a session), so checked as the content is."""
    call = {**CALL, "function": {"name": "lookup", "arguments": '{"ssn": "123-45-6789"}'}}
    r = rig.client.post("/v1/chat/completions", headers=headers("strict"), json={
        "model": "recallserve", "metadata": {"agent": "off"},
        "messages": [ASK, _calls(call), _answer("call_1"), {"role": "user", "content": "ok"}]})
    assert_envelope(r, 400, "messages.1.tool_calls.0.function.arguments")


def test_an_empty_question_is_not_said_to_hold_an_image(rig: Rig) -> None:
    assert _chat(rig, [{"role": "user", "content": ""}]).status_code == 200
    prompt = rig.prompts()[-1]
    assert "image" not in prompt and "Question: (an empty message)" in prompt, prompt


# ---- response_format.json_schema ------------------------------------------------------------------

def _format(schema: Any = None, **spec: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "reply", **({"schema": schema} if schema is not None else {}),
                                                   **spec}}


BAD_SCHEMAS: dict[str, Any] = {
    "unknown type": {"type": "nope"},
    "unknown type deep inside": {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "nope"}}}},
    "properties a list": {"type": "object", "properties": [1]},
    "a property not a schema": {"properties": {"a": "x"}},
    "minLength a string": {"type": "string", "minLength": "x"},
    "a $ref to nothing": {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}},
}
"""Schemas llama.cpp's grammar compiler fails on (checked below when llama_cpp is installed)."""


@pytest.mark.parametrize("case", BAD_SCHEMAS)
def test_a_schema_the_engine_cannot_compile_is_400_before_the_engine(rig: Rig, case: str) -> None:
    schema = BAD_SCHEMAS[case]
    try:
        from llama_cpp.llama_grammar import json_schema_to_gbnf
    except ImportError:  # pragma: no cover - llama-cpp-python is a runtime dependency
        pass
    else:  # the oracle: what the cpu-local engine did with it after the 200
        with pytest.raises(Exception):  # noqa: B017 - AssertionError, AttributeError, TypeError by case
            json_schema_to_gbnf(json.dumps(schema))
    for stream in (False, True):
        calls = len(rig.engine.calls)
        error = _refused(rig, _chat(rig, stream=stream, response_format=_format(schema)),
                         "response_format.json_schema.schema")
        assert "not a valid JSON Schema" in error["message"], error
        assert len(rig.engine.calls) == calls


HUGE_GRAMMARS: dict[str, Any] = {
    "minLength 1e6": {"type": "string", "minLength": 10**6},
    "maxItems 1e6": {"type": "array", "maxItems": 10**6, "items": {"type": "integer"}},
    "a pattern a{1000000}": {"type": "string", "pattern": "^a{1000000}$"},
}
"""Schemas whose grammar llama.cpp writes out as megabytes (each repetition a copy)."""


@pytest.mark.parametrize("case", [*HUGE_GRAMMARS, "counts adding up"])
def test_a_schema_whose_grammar_is_megabytes_is_400(rig: Rig, case: str) -> None:
    """``minLength: 1e8`` was a 500 MB grammar built in 5 s on the engine's thread; a bound per
    count (16,384) and for the whole schema (65,536) keeps it to ~0.5 MB."""
    schema = HUGE_GRAMMARS.get(case) or {"type": "object", "properties": {
        f"p{i}": {"type": "string", "maxLength": 10_000} for i in range(7)}}
    if case in HUGE_GRAMMARS:
        gbnf = pytest.importorskip("llama_cpp.llama_grammar")
        assert len(gbnf.json_schema_to_gbnf(json.dumps(schema))) > 1_000_000  # the oracle: what the engine built
    calls = len(rig.engine.calls)
    error = _refused(rig, _chat(rig, response_format=_format(schema)), "response_format.json_schema.schema")
    assert "repetitions" in error["message"], error
    assert len(rig.engine.calls) == calls


def test_usual_lengths_and_patterns_are_fine(rig: Rig) -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3,8}$"},
                                               "text": {"type": "string", "maxLength": 10_000},
                                               "tags": {"type": "array", "maxItems": 20, "items": {"type": "string"}}}}
    assert _chat(rig, response_format=_format(schema)).status_code == 200


@pytest.mark.parametrize(("spec", "param"), [
    ({"schema": {"type": "object"}}, "response_format.json_schema.name"),
    ({"name": "a reply/v2", "schema": {"type": "object"}}, "response_format.json_schema.name"),
    ({"name": "r" * 65, "schema": {"type": "object"}}, "response_format.json_schema.name"),
    ({"name": "reply", "schema": {"type": "object"}, "strict": "yes"}, "response_format.json_schema.strict"),
    ({"name": "reply", "schema": {"type": "object"}, "schemas": {}}, "response_format.json_schema.schemas"),
    ({"name": "reply", "schema": {"enum": []}}, "response_format.json_schema.schema"),
], ids=["no name", "a name with a slash", "a name of 65", "strict a string", "an unknown key", "an empty enum"])
def test_a_malformed_json_schema_spec_is_400_naming_its_field(rig: Rig, spec: dict[str, Any], param: str) -> None:
    calls = len(rig.engine.calls)
    _refused(rig, _chat(rig, response_format={"type": "json_schema", "json_schema": spec}), param)
    assert len(rig.engine.calls) == calls


def test_the_schema_the_sdk_builds_from_a_pydantic_model_reaches_the_engine(rig: Rig) -> None:
    pytest.importorskip("openai")
    from openai.lib._parsing._completions import type_to_response_format_param
    from pydantic import BaseModel

    class Item(BaseModel):
        name: str
        qty: int

    class Order(BaseModel):
        id: str
        items: list[Item]
        note: str | None

    response_format = type_to_response_format_param(Order)
    r = _chat(rig, response_format=response_format)
    assert r.status_code == 200, r.text
    assert rig.engine.calls[-1][1].json_schema == response_format["json_schema"]["schema"]  # type: ignore[index]


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

