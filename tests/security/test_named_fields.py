"""A 400 from a rule that spans fields (a model's own check: at most 4 stop sequences, an expiry
after the creation time, a known context mode) names the field in ``param`` as a field's type
error does, and its message is one line about that field.

Those answers had ``param: null`` (or ``memories.0``) and messages such as ``body: Value error,
stop: ...``; a memory the record model refused came back as pydantic's multi-line dump of the
whole record, input values included.
"""

from __future__ import annotations

import pytest

from tests.security.conftest import Rig
from tests.unit.edge.conftest import assert_envelope, headers

_CHAT = {"model": "recallserve", "messages": [{"role": "user", "content": "hi"}]}
_SECRET = "vault code PELICAN-77"
CASES = {
    "stop sequences": ("/v1/chat/completions", _CHAT | {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    "client tools": ("/v1/chat/completions", _CHAT | {"tools": [{"type": "function"}]}, "tools"),
    "logprobs": ("/v1/chat/completions", _CHAT | {"logprobs": True}, "logprobs"),
    "no user message": ("/v1/chat/completions", _CHAT | {"messages": [{"role": "system", "content": "x"}]}, "messages"),
    "context mode": ("/v1/chat/completions", _CHAT | {"metadata": {"context_mode": "psychic"}}, "metadata.context_mode"),
    "agent mode": ("/v1/chat/completions", _CHAT | {"metadata": {"agent": "maybe"}}, "metadata.agent"),
    "created before 1970": ("/v1/memories", {"memories": [{"text": _SECRET, "created_at": -5}]}, "memories.0.created_at"),
    "expiry before creation": ("/v1/memories", {"memories": [{"text": _SECRET, "created_at": 2e9, "expires_at": 1e9}]},
                               "memories.0.expires_at"),
    "expiry before now": ("/v1/memories", {"memories": [{"text": "ok"}, {"text": _SECRET, "expires_at": 10}]},
                          "memories.1.expires_at"),
    "empty metadata key": ("/v1/memories", {"memories": [{"text": _SECRET, "metadata": {"": 1}}]}, "memories.0.metadata"),
    "search window": ("/v1/memories/search", {"query": "x", "filters": {"created_after": 2e9, "created_before": 1e9}},
                      "filters.created_before"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_cross_field_rule_names_its_field(shared_rig: Rig, case: str) -> None:
    path, body, field = CASES[case]
    error = assert_envelope(shared_rig.client.post(path, json=body, headers=headers("acme")), 400, field)
    message = error["message"]
    assert message.startswith(f"{field}: "), message
    assert "Value error" not in message and "\n" not in message and "validation error" not in message, message
    assert "PELICAN" not in message, message  # the refused record is not echoed back


def test_a_field_validator_keeps_its_field(shared_rig: Rig) -> None:
    """The positive control: a check inside one field names that field, the path within it in the message."""
    body = {"memories": [{"text": "a", "metadata": {"a": {"b": 1}}}]}
    error = assert_envelope(shared_rig.client.post("/v1/memories", json=body, headers=headers("acme")), 400,
                            "memories.0.metadata")
    assert "metadata.a" in error["message"], error


OPTIONS = {
    "tool_choice required": ({"tool_choice": "required"}, "tool_choice"),
    "tool_choice unknown word": ({"tool_choice": "sometimes"}, "tool_choice"),
    "tool_choice a function": ({"tool_choice": {"type": "function", "function": {"name": "lookup"}}}, "tool_choice"),
    "an empty stop sequence": ({"stop": [""]}, "stop.0"),
    "stop of the wrong type": ({"stop": 5}, "stop"),
    "stream_options without stream": ({"stream_options": {"include_usage": True}}, "stream_options"),
}


@pytest.mark.parametrize("case", OPTIONS)
def test_a_chat_option_the_server_cannot_honour_is_refused(shared_rig: Rig, case: str) -> None:
    """These were answered 200 with the option ignored (a tool call never made, no usage chunk)."""
    extra, field = OPTIONS[case]
    r = shared_rig.client.post("/v1/chat/completions", json=_CHAT | extra, headers=headers("acme"))
    assert assert_envelope(r, 400, field)["message"].startswith(f"{field}: ")


@pytest.mark.parametrize("extra", [{"tool_choice": "none"}, {"tool_choice": "auto"}, {"stop": "\n\n"},
                                   {"stream": True, "stream_options": {"include_usage": True}}], ids=str)
def test_the_options_it_honours_are_accepted(shared_rig: Rig, extra: dict) -> None:
    r = shared_rig.client.post("/v1/chat/completions", json=_CHAT | {"metadata": {"agent": "off"}} | extra,
                               headers=headers("acme"))
    assert r.status_code == 200, r.text


WRONG_TYPES = {
    "max_tokens as text": ("/v1/chat/completions", _CHAT | {"max_tokens": "16"}, "max_tokens"),
    "max_tokens as 16.0": ("/v1/chat/completions", _CHAT | {"max_tokens": 16.0}, "max_tokens"),
    "temperature as text": ("/v1/chat/completions", _CHAT | {"temperature": "0.5"}, "temperature"),
    "stream as 'yes'": ("/v1/chat/completions", _CHAT | {"stream": "yes"}, "stream"),
    "stream as 1": ("/v1/chat/completions", _CHAT | {"stream": 1}, "stream"),
    "seed beyond 64 bits": ("/v1/chat/completions", _CHAT | {"seed": 2**64}, "seed"),
    "seed as text": ("/v1/chat/completions", _CHAT | {"seed": "7"}, "seed"),
    "search k as text": ("/v1/memories/search", {"query": "x", "k": "5"}, "k"),
    "search hybrid as 'no'": ("/v1/memories/search", {"query": "x", "hybrid": "no"}, "hybrid"),
    "search threshold as text": ("/v1/memories/search", {"query": "x", "threshold": "0.2"}, "threshold"),
    "retention_weight as text": ("/v1/memories", {"memories": [{"text": "x", "retention_weight": "2"}]},
                                 "memories.0.retention_weight"),
    "experience k as text": ("/v1/experiences/search", {"query": "x", "source_model": "m", "k": "2"}, "k"),
}


@pytest.mark.parametrize("case", WRONG_TYPES)
def test_a_number_or_flag_of_the_wrong_json_type_is_400(shared_rig: Rig, case: str) -> None:
    """These were coerced ("16" -> 16, "no" -> False), so a client's bug went unnoticed."""
    path, body, field = WRONG_TYPES[case]
    assert_envelope(shared_rig.client.post(path, json=body, headers=headers("acme")), 400, field)


def test_an_integer_where_a_number_is_asked_is_fine(shared_rig: Rig) -> None:
    r = shared_rig.client.post("/v1/chat/completions", headers=headers("acme"),
                               json=_CHAT | {"metadata": {"agent": "off"}, "temperature": 1, "top_p": 1, "seed": -1})
    assert r.status_code == 200, r.text
    r = shared_rig.client.post("/v1/memories/search", json={"query": "x", "threshold": 0}, headers=headers("acme"))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("raw", [b"{'model': 'x'}", b'{"model": "recallserve",}', b'{"model": "recallserve"'])
def test_a_json_syntax_error_names_the_body_not_a_field(shared_rig: Rig, raw: bytes) -> None:
    """Its param was the character offset ("1"), read as a field called "1"."""
    r = shared_rig.client.post("/v1/chat/completions", content=raw,
                               headers={**headers("acme"), "content-type": "application/json"})
    error = assert_envelope(r, 400)
    assert error["param"] is None and error["message"].startswith("body: invalid JSON at character "), error


FILING = {
    "topic not a path": ({"topic": "Physics Stuff!"}, "metadata.topic"),
    "topic with an e-mail": ({"topic": "physics/jane.doe@example.com"}, "metadata.topic"),
    "topic with an SSN (a path until masked)": ({"topic": "physics/123-45-6789"}, "metadata.topic"),
    "task_domain too long": ({"task_domain": "d" * 65}, "metadata.task_domain"),
}


@pytest.mark.parametrize("case", FILING)
def test_a_segmented_turn_with_a_bad_filing_is_400_before_the_model(rig: Rig, case: str) -> None:
    """These were a 500 from the experience record's validation, after the model had answered."""
    meta, field = FILING[case]
    body = _CHAT | {"metadata": {"reasoning": "segmented", **meta}}
    assert_envelope(rig.client.post("/v1/chat/completions", json=body, headers=headers("acme")), 400, field)
    assert rig.engine.calls == []


def test_a_segmented_turn_with_a_good_filing_is_answered(rig: Rig) -> None:
    body = _CHAT | {"metadata": {"reasoning": "segmented", "topic": "physics/speed", "task_domain": "units"}}
    r = rig.client.post("/v1/chat/completions", json=body, headers=headers("acme"))
    assert r.status_code == 200, r.text
