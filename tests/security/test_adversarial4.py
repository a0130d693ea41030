"""A fourth adversarial pass over the HTTP API: what the third left open.

* an assistant message's echoed ``tool_calls`` were free-form JSON: a call without a function
  name, with object ``arguments``, of an unknown ``type``, with unknown keys or two calls of one
  id were answered 200 and rendered as history; a tool message answering a call nobody made (or
  following no assistant message with calls) too, where the OpenAI API refuses both;
* a session's entity table grew with every distinct id, amount or date a client sent, read back
  on every turn (``context.max_entities_per_session`` now keeps the most recently seen);
* every new ``task_domain`` a tenant's records named opened another active cache of up to
  ``active_capacity`` records, which searches without a domain, the review queue and maintenance
  scan (``experience.max_active_domains`` now demotes the least recently used domain's records).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recallserve.serve.context import ContextConfig
from tests.security.conftest import A, B, Rig, serving
from tests.unit.edge.conftest import assert_envelope, headers
from tests.unit.experience._records import speed_record

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
    # next user message (an unanswered call is its own 400: test_adversarial7).
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


# ---- a session's entity table is bounded ---------------------------------------------------------

ENTITY_CAP = 50


def _orders(start: int, n: int) -> str:
    return "Please check " + ", ".join(f"order {i}" for i in range(start, start + n)) + "."


def test_a_sessions_entity_table_keeps_the_most_recently_seen_up_to_its_cap(tmp_path: Path) -> None:
    with serving(tmp_path, context_config=ContextConfig(summary_keep_recent=1, max_entities_per_session=ENTITY_CAP)) as r:
        meta = {"agent": "off", "session_id": "many-ids", "context_mode": "summary"}
        for start in (100_000, 200_000, 300_000):
            reply = _chat(r, [{"role": "user", "content": _orders(start, 40)}], metadata=meta)
            assert reply.status_code == 200, reply.text
        got = r.client.get("/v1/sessions/many-ids", headers=headers(A))
        assert got.status_code == 200, got.text
        values = {e["value"] for e in got.json()["entities"]}
        assert len(got.json()["entities"]) == ENTITY_CAP, len(got.json()["entities"])
        # the newest turn's ids and the answer's (seen in every turn) stay; the first turn's are gone
        assert {str(i) for i in range(300_000, 300_040)} <= values, sorted(values)
        assert "104208" in values, sorted(values)
        assert not values & {str(i) for i in range(100_000, 100_040)}, sorted(values)
        # an id seen again is the most recent again: it comes back, and the table stays at its cap
        assert _chat(r, [{"role": "user", "content": "About order 100000 again."}], metadata=meta).status_code == 200
        after = r.client.get("/v1/sessions/many-ids", headers=headers(A)).json()["entities"]
        assert len(after) == ENTITY_CAP and "100000" in {e["value"] for e in after}


def test_one_request_with_more_entities_than_the_cap_stores_the_last_ones(tmp_path: Path) -> None:
    with serving(tmp_path, context_config=ContextConfig(summary_keep_recent=1, max_entities_per_session=ENTITY_CAP)) as r:
        # NOTE: 200 ids, under the 256 spans one text is read for (serve.context._entities.MAX_ENTITY_SPANS).
        reply = _chat(r, [{"role": "user", "content": _orders(500_000, 200)}],
                      metadata={"agent": "off", "session_id": "one-big"})
        assert reply.status_code == 200, reply.text
        values = {e["value"] for e in r.client.get("/v1/sessions/one-big", headers=headers(A)).json()["entities"]}
        assert len(values) == ENTITY_CAP and "500199" in values and "500000" not in values


# ---- the active experience caches of a tenant are bounded in domains -----------------------------

DOMAIN_CAP = 2


def _tier(rig: Rig, exp_id: str, tenant: str = A) -> str:
    r = rig.client.get(f"/v1/experiences/{exp_id}", headers=headers(tenant))
    assert r.status_code == 200, r.text
    return str(r.json()["tier"])


def _active(rig: Rig, exp_id: str, domain: str, when: float, tenant: str = A) -> None:
    record = speed_record(exp_id=exp_id, domain=domain, timestamp=when, label="correct")
    r = rig.client.post("/v1/experiences", json=record, headers=headers(tenant))
    assert r.status_code == 201 and r.json()["tier"] == "active", r.text


def test_a_new_task_domain_past_the_cap_demotes_the_least_recently_used_domain(tmp_path: Path) -> None:
    # NOTE: minutes ago, so no record is demoted for its decay or window instead.
    t0 = time.time() - 3600
    with serving(tmp_path, experience_config={"max_active_domains": DOMAIN_CAP}) as r:
        _active(r, "exp-b", "globex-only", t0, tenant=B)
        _active(r, "exp-1", "units", t0 + 100)
        _active(r, "exp-2", "tax", t0 + 200)
        _active(r, "exp-3", "units", t0 + 300)  # units used again: tax is now the least recent
        # a third domain: the least recently used one (tax) leaves the active cache, kept as archival
        _active(r, "exp-4", "geometry", t0 + 50)  # NOTE: an older timestamp: the new domain still stays
        assert [_tier(r, i) for i in ("exp-1", "exp-2", "exp-3", "exp-4")] == ["active", "archival", "active", "active"]
        found = r.client.post("/v1/experiences/search", headers=headers(A),
                              json={"query": "", "source_model": "Qwen2.5-Coder-1.5B-Instruct", "k": 10})
        assert found.status_code == 200, found.text
        assert {h["experience"]["record"]["metadata"]["task_domain"] for h in found.json()["hits"]} == {"units", "geometry"}
        # another tenant's domains neither count nor move
        assert _tier(r, "exp-b", tenant=B) == "active"
        # a reviewer's "correct" brings a record (and its domain) back, demoting the now least recent
        label = r.client.post("/v1/experiences/exp-2/label", json={"label": "correct"}, headers=headers(A))
        assert label.status_code == 200 and label.json()["tier"] == "active", label.text
        assert [_tier(r, i) for i in ("exp-1", "exp-2", "exp-3", "exp-4")] == ["active", "active", "active", "archival"]
