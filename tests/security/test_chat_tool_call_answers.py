"""Every tool call answered, once, and each answer reaching the model beside its call
(``/v1/chat/completions``, plain and streaming).

* an assistant message's ``tool_calls`` need not be answered: a call with no tool message after it
  (the history's last message, or followed by the next user message), or only some of parallel
  calls answered, was answered 200 where OpenAI refuses ("an assistant message with 'tool_calls'
  must be followed by tool messages responding to each 'tool_call_id'"); ``tool_calls: []``
  ("empty array") and one call answered twice were accepted too, and an assistant message with
  a null content and no calls (OpenAI: content "required unless tool_calls") was rendered as
  nothing. Each is a 400 naming ``messages.<i>.tool_calls`` / ``.tool_call_id`` / ``.content``;
  the openai SDK's own tool-calling history still passes;
* an assistant message's calls never reached the model (only its text did, none for a call-only
  message): of two tool answers ("18 C", "24 C") it could not tell which call each answered. The
  history now renders each call (``[call <id>] <name>(<arguments>)``) and heads each answer with
  its call's id, and the reject PII policy checks the arguments as it checks the content;
* an assistant's ``{"type": "refusal"}`` content part (which openai-python's types allow) was a 400.
The shape of each call is ``test_chat_tool_call_shape.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.security.conftest import ASK, Rig, serving
from tests.security.conftest import chat_with_agent_off as _chat
from tests.security.conftest import refused as _refused
from tests.unit.edge.conftest import assert_envelope, headers

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}


def _answer(call_id: str, text: str = "18 C") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _calls(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One rig for the module (no case reads another's state)."""
    with serving(tmp_path_factory.mktemp("rig")) as r:
        yield r


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
