"""``response_format.json_schema`` in ``/v1/chat/completions``: a schema the engine cannot compile,
or whose grammar would be megabytes, is the client's 400, before the engine.

* the schema was free-form: a schema of the wrong shape (``"type": "nope"``, ``"properties":
  [...]``, ``"minLength": "3"``, a ``$ref`` to nothing) reached the engine, whose grammar compiler
  failed on it (an engine error for the client's mistake, or an error event mid-stream); a missing
  or malformed ``name``, an unknown key and ``strict: "yes"`` were ignored. Each is a 400 naming
  its path; the schema openai-python builds from a pydantic model (``$defs`` / ``$ref``,
  ``anyOf``) still passes and reaches the engine;
* a schema's repetition counts were unbounded: llama.cpp's grammar compiler writes each
  repetition out, so ``"minLength": 1e8`` built a 500 MB grammar in 5 s on the engine's thread
  (a pattern ``^a{100000000}$`` 100 MB); a count past 16,384, or counts adding up past 65,536,
  are a 400 naming the schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.security.conftest import Rig, serving
from tests.security.conftest import chat_with_agent_off as _chat
from tests.security.conftest import refused as _refused


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One rig for the module (no case reads another's state)."""
    with serving(tmp_path_factory.mktemp("rig")) as r:
        yield r


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
