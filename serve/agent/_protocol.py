"""The strict JSON step protocol: the grammar schema, tolerant parsing, the streamed answer.

One reasoner reply is exactly one JSON object::

    {"thought": "...", "type": "tool_call", "name": "order_status", "args": {"order_id": "104233"}}
    {"thought": "...", "type": "tool_calls", "calls": [{"id": "c1", "name": ..., "args": {...}}, ...]}
    {"thought": "...", "type": "final", "answer": "..."}

The engine is constrained by :func:`step_schema` (llama.cpp turns it into a GBNF grammar, vLLM
into guided decoding): per tool an alternative whose ``name`` is a constant and whose ``args``
is that tool's own argument schema, so even a 1.5B model emits well-typed calls. Parsing is
still tolerant (code fences, trailing prose, ``arguments`` for ``args``, JSON repaired with
``json_repair``) because remote engines may ignore the constraint.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

from recallserve.serve.agent.routing import bind_schema
from recallserve.serve.agent.tools import ToolSet

__all__ = ["ParsedCall", "ParsedStep", "StepParseError", "step_schema", "router_schema", "parse_step",
           "parse_json_object", "AnswerStream", "is_final_only", "FINAL_WRAPPER_TOKENS"]

# NOTE: the thought is a short rationale; 120 characters (~30 tokens) keeps a step around a second
# of generation on the 2-core CPU while still letting the model name the tool and why.
THOUGHT_MAX_CHARS = 120
MAX_PARALLEL_CALLS = 4
#: Tokens of ``{"type": "final", "answer": "`` and the closing ``"}`` around an answer (Qwen2.5's
#: tokenizer: 10), added to a client's ``max_tokens`` when a step can only be the answer.
FINAL_WRAPPER_TOKENS = 12


class StepParseError(ValueError):
    """The reply is not a valid step; the message says what is wrong (it goes back to the model)."""


@dataclass
class ParsedCall:
    """One requested call: id (c1..), tool name, raw args."""

    id: str
    name: str
    args: dict[str, Any]


@dataclass
class ParsedStep:
    """A parsed reply: either calls or a final answer."""

    type: str
    thought: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    answer: str = ""


def _thought() -> dict[str, Any]:
    return {"type": "string", "maxLength": THOUGHT_MAX_CHARS}


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


_FIXED_TOKEN = re.compile(r"\\d\{(\d+)\}|\\d|\[[^\]]+\]\{(\d+)\}|\[[^\]]+\]|\\.|[^\\\[\]{}()*+?|.^$]")


def fixed_length(pattern: str) -> int | None:
    """Length of every match of a simple fixed-length pattern (``^B-\\d{4}$`` -> 6), else None."""
    body = pattern.removeprefix("^").removesuffix("$")
    pos, total = 0, 0
    while pos < len(body):
        m = _FIXED_TOKEN.match(body, pos)
        if m is None:
            return None
        total += int(m.group(1) or m.group(2) or 1)
        pos = m.end()
    return total


def _grammar_prop(spec: dict[str, Any]) -> dict[str, Any]:
    """One argument for the grammar: no description, no regex, no length bounds.

    NOTE: llama-cpp-python's schema-to-grammar converter mistranslates ``\\d{4}`` in patterns
    (it emits a literal backslash-d), and long length bounds unroll into deep nested rules; so a
    fixed-length pattern becomes ``minLength == maxLength`` and the exact check stays in code.
    """
    out = {k: v for k, v in spec.items() if k not in ("description", "pattern", "minLength", "maxLength")}
    if "anyOf" in out:
        out["anyOf"] = [_grammar_prop(s) for s in out["anyOf"]]
    n = fixed_length(spec["pattern"]) if "pattern" in spec else None
    if n is not None:
        out["minLength"] = out["maxLength"] = n
    return out


def _grammar_args(schema: dict[str, Any]) -> dict[str, Any]:
    """The args schema for the grammar (descriptions live in the prompt; fewer grammar rules)."""
    props = {k: _grammar_prop(v) for k, v in schema.get("properties", {}).items()}
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if schema.get("required"):
        out["required"] = list(schema["required"])
    return out


def step_schema(tools: ToolSet, *, allow_parallel: bool, allow_final: bool = True,
                bindings: Mapping[str, Mapping[str, list[str]]] | None = None) -> dict[str, Any]:
    """JSON schema of one reply: one alternative per tool, optionally multi-call, and final.

    ``bindings`` (tool -> argument -> values found in the question, from the routing rules)
    narrow those arguments to the found values; see :func:`recallserve.serve.agent.routing.bind_schema`.
    """
    alts: list[dict[str, Any]] = []
    args: dict[str, dict[str, Any]] = {}
    for name, tool in tools.items():
        schema = tool.args_schema
        if bindings is not None and tool.routing is not None and tool.routing.bind:
            schema = bind_schema(schema, tool.routing.bind, bindings.get(name, {}))
        args[name] = _grammar_args(schema)
        alts.append(_obj({"thought": _thought(), "type": {"const": "tool_call"}, "name": {"const": name},
                          "args": args[name]}))
    if allow_parallel and len(tools) >= 1:
        if bindings is not None:
            # NOTE: with routing bindings each parallel call carries its tool's (bound) argument
            # schema; measured: with free-form args the model added a second call with an
            # invented customer id. Without bindings the items stay generic (a smaller grammar).
            items = [_obj({"id": {"type": "string", "pattern": "^c[1-9]$"}, "name": {"const": n}, "args": a})
                     for n, a in args.items()]
            call: dict[str, Any] = items[0] if len(items) == 1 else {"anyOf": items}
        else:
            call = _obj({"id": {"type": "string", "pattern": "^c[1-9]$"}, "name": {"enum": list(tools)},
                         "args": {"type": "object"}})
        alts.append(_obj({"thought": _thought(), "type": {"const": "tool_calls"},
                          "calls": {"type": "array", "items": call, "minItems": 2, "maxItems": MAX_PARALLEL_CALLS}}))
    if alts and allow_final:
        alts.append(_obj({"thought": _thought(), "type": {"const": "final"}, "answer": {"type": "string"}}))
    elif not alts:
        # NOTE: with nothing left to choose, a thought only delays the answer: measured on cpu-local,
        # the 1.5B model's final thought was ~30 generated tokens (~1 s on 2 idle cores, more under
        # load) before the first answer token, restating the observation the answer then repeats.
        alts.append(_obj({"type": {"const": "final"}, "answer": {"type": "string"}}))
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def is_final_only(schema: dict[str, Any]) -> bool:
    """Whether a :func:`step_schema` allows only the final answer (no call, no thought)."""
    return all(alt.get("properties", {}).get("type") == {"const": "final"} for alt in schema.get("anyOf", [schema]))


def router_schema(tools: ToolSet) -> dict[str, Any]:
    """JSON schema of the router's decision ``{"tools": [...]}`` (an empty list = answer directly).

    NOTE: measured with the 1.5B model, a separate ``route: direct|tools`` field made it answer
    "direct" for order and ticket questions; listing tools (or none) is the decision it gets right.
    """
    items: dict[str, Any] = {"enum": list(tools)} if tools else {"type": "string"}
    return _obj({"tools": {"type": "array", "items": items, "maxItems": 3}})


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.MULTILINE)


def parse_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text``: strict first, then repaired by ``json_repair``."""
    body = _FENCE.sub("", text.strip()).strip()
    start = body.find("{")
    if start < 0:
        raise StepParseError("no JSON object found; reply with one JSON object")
    candidate = body[start:]
    end = candidate.rfind("}")
    strict = candidate[: end + 1] if end >= 0 else candidate
    try:
        obj = json.loads(strict)
    except json.JSONDecodeError:
        import json_repair

        obj = json_repair.loads(candidate)
        if not isinstance(obj, dict) or not obj:
            raise StepParseError("reply is not valid JSON; reply with one JSON object") from None
    if not isinstance(obj, dict):
        raise StepParseError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _args(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise StepParseError(f"{where}: must be a JSON object, got a string") from None
    if not isinstance(raw, dict):
        raise StepParseError(f"{where}: must be a JSON object, got {type(raw).__name__}")
    return raw


def parse_step(text: str) -> ParsedStep:
    """Parse one reply tolerantly; raises :class:`StepParseError` with a message for the model."""
    obj = parse_json_object(text)
    kind = obj.get("type")
    thought = str(obj.get("thought") or "")[: THOUGHT_MAX_CHARS * 2]
    if kind is None:  # NOTE: tolerate the common omissions of untrained models.
        kind = "final" if "answer" in obj else "tool_calls" if "calls" in obj else "tool_call" if "name" in obj else None
    if kind == "final":
        answer = obj.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            raise StepParseError("final: 'answer' must be a non-empty string")
        return ParsedStep(type="final", thought=thought, answer=answer.strip())
    if kind == "tool_call":
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            raise StepParseError("tool_call: 'name' must be a tool name")
        raw = obj.get("args", obj.get("arguments"))
        return ParsedStep(type="tool_call", thought=thought, calls=[ParsedCall("c1", name, _args(raw, "args"))])
    if kind == "tool_calls":
        calls_raw = obj.get("calls")
        if not isinstance(calls_raw, list) or not calls_raw:
            raise StepParseError("tool_calls: 'calls' must be a non-empty list")
        if len(calls_raw) > MAX_PARALLEL_CALLS:
            raise StepParseError(f"tool_calls: at most {MAX_PARALLEL_CALLS} calls per step")
        calls: list[ParsedCall] = []
        for i, c in enumerate(calls_raw):
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                raise StepParseError(f"calls[{i}]: must be an object with a 'name'")
            cid = str(c.get("id") or f"c{i + 1}")
            if any(p.id == cid for p in calls):
                raise StepParseError(f"calls[{i}].id: duplicate id {cid!r}")
            calls.append(ParsedCall(cid, c["name"], _args(c.get("args", c.get("arguments")), f"calls[{i}].args")))
        return ParsedStep(type="tool_calls", thought=thought, calls=calls)
    raise StepParseError(f"type: must be 'tool_call', 'tool_calls' or 'final', got {kind!r}")


_FINAL = re.compile(r'"type"\s*:\s*"final"')
_ANSWER = re.compile(r'"answer"\s*:\s*"')
_ESC = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class AnswerStream:
    """Pulls the ``answer`` string out of a streamed final step as it is generated.

    Feed the raw deltas; :meth:`feed` returns the new answer characters (JSON escapes decoded;
    an escape cut in half by a delta boundary waits for the next delta).
    """

    def __init__(self) -> None:
        self.buf = ""
        self._start: int | None = None
        self._pos = 0
        self._done = False
        self.emitted = ""

    def feed(self, delta: str) -> str:
        """Add raw text; return newly decoded answer text (may be empty)."""
        self.buf += delta
        if self._done:
            return ""
        if self._start is None:
            tm = _FINAL.search(self.buf)
            am = _ANSWER.search(self.buf, tm.end()) if tm else None
            if am is None:
                return ""
            self._start = self._pos = am.end()
        out: list[str] = []
        i, buf = self._pos, self.buf
        while i < len(buf):
            ch = buf[i]
            if ch == '"':
                self._done = True
                i += 1
                break
            if ch == "\\":
                if i + 1 >= len(buf):
                    break
                nxt = buf[i + 1]
                if nxt == "u":
                    if i + 6 > len(buf):
                        break
                    try:
                        code = int(buf[i + 2 : i + 6], 16)
                    except ValueError:
                        out.append(buf[i : i + 6])
                        i += 6
                        continue
                    if 0xD800 <= code <= 0xDBFF:  # NOTE: a surrogate pair (emoji) spans two escapes
                        if i + 12 > len(buf):
                            break
                        low = int(buf[i + 8 : i + 12], 16) if buf[i + 6 : i + 8] == "\\u" else 0
                        if 0xDC00 <= low <= 0xDFFF:
                            out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                            i += 12
                            continue
                    out.append(chr(code))
                    i += 6
                    continue
                out.append(_ESC.get(nxt, nxt))
                i += 2
                continue
            out.append(ch)
            i += 1
        self._pos = i
        text = "".join(out)
        self.emitted += text
        return text
