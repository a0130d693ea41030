"""The shape of an assistant message's echoed ``tool_calls`` in ``/v1/chat/completions``, as
OpenAI's API takes it.

The calls were free-form JSON: a call without a function name, with object ``arguments``, of an
unknown ``type``, with unknown keys or two calls of one id were answered 200 and rendered as
history; a tool message answering a call nobody made (or following no assistant message with
calls) too, where the OpenAI API refuses both. Each is a 400 naming the field, before any model
call; the histories the openai SDK builds, and replies echoed from OpenAI itself, are answered.
That every call is answered once is ``test_chat_tool_call_answers.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.security.conftest import A, Rig, serving
from tests.unit.edge.conftest import assert_envelope, headers

CHAT: dict[str, Any] = {"model": "recallserve", "metadata": {"agent": "off"}}
CALL: dict[str, Any] = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def _chat(rig: Rig, messages: list[dict[str, Any]], tenant: str = A, **extra: Any) -> Any:
    return rig.client.post("/v1/chat/completions", json={**CHAT, **extra, "messages": messages}, headers=headers(tenant))


def _exchange(*calls: dict[str, Any], answers: tuple[str, ...] = ("call_1",)) -> list[dict[str, Any]]:
    """user -> assistant(calls) -> one tool message per id of ``answers`` -> user."""
    return [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": list(calls)},
            *({"role": "tool", "tool_call_id": a, "content": "18 C"} for a in answers),
            {"role": "user", "content": "and tomorrow?"}]


def _function(**fields: Any) -> dict[str, Any]:
    return {**CALL, "function": {**CALL["function"], **fields}}


# ---- tool_calls: OpenAI's shape, and every answer to a call made ---------------------------------

BAD_TOOL_CALLS = {
    "arguments an object": (_exchange(_function(arguments={"city": "Paris"})), "messages.1.tool_calls.0.function.arguments"),
    "arguments a number": (_exchange(_function(arguments=1)), "messages.1.tool_calls.0.function.arguments"),
    "arguments too long": (_exchange(_function(arguments="x" * 200_001)), "messages.1.tool_calls.0.function.arguments"),
    "no function name": (_exchange({**CALL, "function": {"arguments": "{}"}}), "messages.1.tool_calls.0.function.name"),
    "empty function name": (_exchange(_function(name="")), "messages.1.tool_calls.0.function.name"),
    "function name with a newline": (_exchange(_function(name="f\nINFO forged")), "messages.1.tool_calls.0.function.name"),
    "function name too long": (_exchange(_function(name="f" * 129)), "messages.1.tool_calls.0.function.name"),
    "unknown key in function": (_exchange(_function(strict=True)), "messages.1.tool_calls.0.function.strict"),
    "no function": (_exchange({"id": "call_1", "type": "function"}), "messages.1.tool_calls.0.function"),
    "type not function": (_exchange({**CALL, "type": "custom"}), "messages.1.tool_calls.0.type"),
    "no type": (_exchange({"id": "call_1", "function": CALL["function"]}), "messages.1.tool_calls.0.type"),
    "no id": (_exchange({"type": "function", "function": CALL["function"]}), "messages.1.tool_calls.0.id"),
    "empty id": (_exchange({**CALL, "id": ""}), "messages.1.tool_calls.0.id"),
    "id a number": (_exchange({**CALL, "id": 1}), "messages.1.tool_calls.0.id"),
    "id too long": (_exchange({**CALL, "id": "c" * 257}), "messages.1.tool_calls.0.id"),
    "id with a NUL": (_exchange({**CALL, "id": "call\x001"}), "messages.1.tool_calls.0.id"),
    "unknown key in a call": (_exchange({**CALL, "index": 0}), "messages.1.tool_calls.0.index"),
    "a call not an object": (_exchange("call_1"), "messages.1.tool_calls.0"),  # type: ignore[arg-type]
    "two calls of one id": (_exchange(CALL, _function(name="get_time")), "messages.1.tool_calls.1.id"),
    "an answer to a call nobody made": (_exchange(CALL, answers=("call_2",)), "messages.2.tool_call_id"),
    # NOTE: the call is answered in its place, so what is refused is the second answer after the
    # next user message (an unanswered call is its own 400: test_chat_tool_call_answers.py).
    "an answer after the next user message": (
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
         {"role": "user", "content": "y"}, {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
         {"role": "user", "content": "z"}], "messages.4.tool_call_id"),
    "an answer with no assistant message before it": (
        [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
         {"role": "user", "content": "y"}], "messages.1.tool_call_id"),
    "an answer after an assistant message without calls": (
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "ok"},
         {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}, {"role": "user", "content": "y"}],
        "messages.2.tool_call_id"),
}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One rig for the module (the chat cases hold no state the others read)."""
    with serving(tmp_path_factory.mktemp("rig")) as r:
        yield r


@pytest.mark.parametrize("case", BAD_TOOL_CALLS)
def test_a_malformed_tool_history_is_400_naming_the_field(rig: Rig, case: str) -> None:
    messages, field = BAD_TOOL_CALLS[case]
    calls = len(rig.engine.calls)
    error = assert_envelope(_chat(rig, messages), 400, field)
    assert error["message"].startswith(f"{field}: "), error
    assert len(rig.engine.calls) == calls  # refused before any model call


def test_a_malformed_tool_history_is_refused_in_session_mode_too(rig: Rig) -> None:
    r = _chat(rig, _exchange(_function(arguments={"city": "Paris"})), metadata={"agent": "off", "session_id": "tools-bad"})
    assert_envelope(r, 400, "messages.1.tool_calls.0.function.arguments")
    assert rig.client.get("/v1/sessions/tools-bad", headers=headers(A)).status_code == 404  # nothing stored


WELL_FORMED = {
    "one call": _exchange(CALL),
    # NOTE: arguments need not be JSON (the OpenAI API takes any string: a model can write broken JSON).
    "arguments not JSON": _exchange(_function(arguments="{city: Paris")),
    "arguments empty": _exchange(_function(arguments="")),
    "parallel calls answered in any order": _exchange(CALL, {**CALL, "id": "call_2"}, answers=("call_2", "call_1")),
    "a text with the calls": [{"role": "user", "content": "x"},
                              {"role": "assistant", "content": "Looking it up.", "tool_calls": [CALL]},
                              {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
                              {"role": "user", "content": "thanks"}],
    # NOTE: some servers number their calls per turn (call_0, call_1, ...): an answer matches the calls just before it.
    "one id in two turns": [*_exchange(CALL), {"role": "assistant", "content": None, "tool_calls": [CALL]},
                            {"role": "tool", "tool_call_id": "call_1", "content": "17 C"},
                            {"role": "assistant", "content": "17 C"}, {"role": "user", "content": "ok"}],
}


@pytest.mark.parametrize("case", WELL_FORMED)
def test_a_well_formed_tool_history_is_answered(rig: Rig, case: str) -> None:
    messages = WELL_FORMED[case]
    r = _chat(rig, messages)
    assert r.status_code == 200, r.text
    prompt = "\n".join(m.content for m in rig.engine.calls[-1][0])
    assert "18 C" in prompt and messages[-1]["content"] in prompt, prompt  # the answers reach the model


def test_the_openai_sdks_tool_calling_history_is_answered(rig: Rig) -> None:
    """The history the SDK's own types build, sent by the SDK: its assistant message (a parsed
    response message, as ``messages.append(completion.choices[0].message)`` echoes it) and the
    tool answers to each of its calls."""
    openai = pytest.importorskip("openai")
    from openai.types.chat import ChatCompletionMessage as SdkMessage

    client = openai.OpenAI(base_url=f"{rig.client.base_url}/v1", api_key="sk-acme", http_client=rig.client,
                           max_retries=0)
    assistant = SdkMessage.model_validate({"role": "assistant", "content": None, "tool_calls": [
        CALL, {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]})
    history: list[Any] = [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Weather in Paris and Rome?"}, assistant,
                          {"role": "tool", "tool_call_id": "call_1", "content": "Paris: 18 C"},
                          {"role": "tool", "tool_call_id": "call_2", "content": "Rome: 24 C"}]
    first = client.chat.completions.create(model="recallserve", messages=[*history, {"role": "user", "content": "Warmer?"}],
                                           metadata={"agent": "off"})
    assert first.choices[0].message.content
    prompt = "\n".join(m.content for m in rig.engine.calls[-1][0])
    assert "Paris: 18 C" in prompt and "Rome: 24 C" in prompt, prompt
    # the next turn echoes the answer the SDK parsed, as a client loop does
    again = client.chat.completions.create(
        model="recallserve", metadata={"agent": "off"},
        messages=[*history, {"role": "user", "content": "Warmer?"}, first.choices[0].message,
                  {"role": "user", "content": "And tomorrow?"}])
    assert again.choices[0].message.content


def test_a_reply_echoed_from_openai_itself_is_answered(rig: Rig) -> None:
    """A history replayed from OpenAI's own API: its assistant messages carry ``refusal``, ``annotations``,
    ``audio`` and ``function_call`` (null or empty), which openai-python sends back as it parsed them. They
    were a 400 (unknown fields); now they pass, and a refusal stands for its message's null content."""
    openai = pytest.importorskip("openai")
    from openai.types.chat import ChatCompletionMessage as SdkMessage

    client = openai.OpenAI(base_url=f"{rig.client.base_url}/v1", api_key="sk-acme", http_client=rig.client,
                           max_retries=0)
    answered = SdkMessage.model_validate({"role": "assistant", "content": "Paris is 18 C.", "refusal": None,
                                          "annotations": [], "audio": None, "function_call": None})
    refused = SdkMessage.model_validate({"role": "assistant", "content": None, "refusal": "I cannot share that code."})
    out = client.chat.completions.create(model="recallserve", metadata={"agent": "off"}, messages=[
        {"role": "user", "content": "Weather in Paris?"}, answered, {"role": "user", "content": "Door code?"}, refused,
        {"role": "user", "content": "Tomorrow in Paris?"}])
    assert out.choices[0].message.content
    prompt = "\n".join(m.content for m in rig.engine.calls[-1][0])
    assert "Paris is 18 C." in prompt and "I cannot share that code." in prompt, prompt
    # what only an echoed reply carries is refused elsewhere, and the deprecated call form is named
    r = _chat(rig, [{"role": "user", "content": "hi", "refusal": "no"}])
    assert "assistant" in assert_envelope(r, 400, "messages.0.refusal")["message"]
    r = _chat(rig, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "function_call":
                                                         {"name": "f", "arguments": "{}"}}, {"role": "user", "content": "ok"}])
    assert "tool_calls" in assert_envelope(r, 400, "messages.1.function_call")["message"]
