"""A structural check of a client's JSON Schema (``response_format.json_schema.schema``).

The schema is compiled into a grammar by the engine (llama.cpp's ``json_schema_to_gbnf``, vLLM's
guided decoding) only once the turn reaches it: a keyword of the wrong type there (``"type":
"nope"``, ``"properties": [...]``, ``"minLength": "3"``, a ``$ref`` to nothing) failed inside the
engine and came back as a 503 "model engine unavailable" (or an error event mid-stream) for the client's
mistake. :func:`schema_problem` finds those before the turn, from the keywords' meta-schema types
(JSON Schema 2020-12, with draft-04/07's ``definitions`` and tuple ``items``), so the 400 names the
keyword's path.

Unknown keywords pass (JSON Schema ignores them), as does anything well-typed that an engine may
still not support; only shapes no JSON Schema validator would accept are refused, and repetition
counts past what a grammar can hold (:data:`MAX_COUNT`, :data:`MAX_TOTAL_COUNT`).

Example:
    >>> schema_problem({"type": "object", "properties": {"a": {"type": "nope"}}})
    "properties.a.type: 'nope' is not a JSON Schema type (string, number, integer, boolean, object, array, null)"
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["schema_problem"]

TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
_ONE = ("not", "if", "then", "else", "contains", "propertyNames", "additionalProperties", "additionalItems",
        "unevaluatedProperties", "unevaluatedItems")
"""Keywords whose value is one schema."""
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
"""Keywords whose value maps names to schemas."""
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
"""Keywords whose value is a non-empty list of schemas."""
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains",
           "maxContains")
_NUMBERS = ("minimum", "maximum", "multipleOf")
MAX_COUNT = 16_384
"""NOTE: the largest length or item count (``minLength``, ``maxItems``, ...; a regex's ``{n,m}``).
llama.cpp's grammar compiler writes a repetition out as that many copies, on the engine's thread:
measured, ``"minLength": 1e8`` built a 500 MB grammar in 5 s, ``"maxLength": 1e7`` 80 MB, a
pattern ``^a{100000000}$`` 100 MB (~8 bytes a count); 16,384 is a 130 kB grammar."""
MAX_TOTAL_COUNT = 65_536
"""NOTE: all of a schema's counts together (a schema holds up to 256 keywords): a ~0.5 MB grammar."""
_QUANTIFIER = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")
_STRINGS = ("format", "title", "description", "$id", "$schema", "$comment", "$anchor", "contentMediaType",
            "contentEncoding")


class _Bad(ValueError):
    """One problem, its message starting with the keyword's path."""


def _where(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _resolve(root: dict[str, Any], ref: str) -> bool:
    """Whether the local reference ``ref`` (``#`` or ``#/a/b``, RFC 6901) names a part of ``root``."""
    node: Any = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return False
    return True


def _check(node: Any, path: str, root: dict[str, Any], total: list[int]) -> None:
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        raise _Bad(f"{path or 'schema'}: a schema is an object (or true / false), got {type(node).__name__}")
    for key, v in node.items():
        at = _where(path, key)
        if key == "type":
            kinds = v if isinstance(v, list) else [v]
            if not kinds or len(set(map(str, kinds))) != len(kinds):
                raise _Bad(f"{at}: a type or a non-empty list of distinct types")
            for t in kinds:
                if t not in TYPES:
                    raise _Bad(f"{at}: {str(t)[:40]!r} is not a JSON Schema type ({', '.join(TYPES)})")
        elif key in _ONE:
            _check(v, at, root, total)
        elif key in _MAP:
            if not isinstance(v, dict):
                raise _Bad(f"{at}: an object mapping names to schemas, got {type(v).__name__}")
            for name, sub in v.items():
                if key == "patternProperties":
                    _pattern(name, at, total)
                _check(sub, _where(at, name), root, total)
        elif key in _LIST:
            if not isinstance(v, list) or not v:
                raise _Bad(f"{at}: a non-empty list of schemas")
            for i, sub in enumerate(v):
                _check(sub, f"{at}.{i}", root, total)
        elif key == "items":
            for i, sub in enumerate(v) if isinstance(v, list) else [(None, v)]:
                _check(sub, at if i is None else f"{at}.{i}", root, total)
        elif key in _COUNTS:
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise _Bad(f"{at}: a non-negative integer, got {str(v)[:40]!r}")
            _count(v, at, total)
        elif key in _NUMBERS:
            if not _is_number(v) or (key == "multipleOf" and v <= 0):
                raise _Bad(f"{at}: a number{' above 0' if key == 'multipleOf' else ''}, got {str(v)[:40]!r}")
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            if not (_is_number(v) or isinstance(v, bool)):  # NOTE: a flag in draft-04, a number since draft-06
                raise _Bad(f"{at}: a number, got {str(v)[:40]!r}")
        elif key == "required":
            if not isinstance(v, list) or not all(isinstance(n, str) for n in v) or len(set(v)) != len(v):
                raise _Bad(f"{at}: a list of distinct property names")
        elif key == "enum":
            # NOTE: an empty enum admits no value: a grammar that can never finish (the engine ran to max_tokens).
            if not isinstance(v, list) or not v:
                raise _Bad(f"{at}: a non-empty list of values")
        elif key == "uniqueItems":
            if not isinstance(v, bool):
                raise _Bad(f"{at}: true or false")
        elif key == "pattern":
            _pattern(v, at, total)
        elif key in _STRINGS:
            if not isinstance(v, str):
                raise _Bad(f"{at}: a string, got {type(v).__name__}")
        elif key == "$ref":
            if not isinstance(v, str):
                raise _Bad(f"{at}: a string, got {type(v).__name__}")
            if not v.startswith("#"):
                raise _Bad(f"{at}: only a reference inside the schema ('#/...') is resolved; {v[:80]!r} is not fetched")
            if not _resolve(root, v):
                raise _Bad(f"{at}: {v[:80]!r} names nothing in the schema")


def _count(n: int, at: str, total: list[int]) -> None:
    """Add the repetition count ``n`` to ``total[0]``; past :data:`MAX_COUNT` or the total it is refused."""
    total[0] += n
    if n > MAX_COUNT:
        raise _Bad(f"{at}: more than {MAX_COUNT} repetitions (the engine's grammar writes each one out)")
    if total[0] > MAX_TOTAL_COUNT:
        raise _Bad(f"{at}: the schema's lengths and counts add up to over {MAX_TOTAL_COUNT} repetitions "
                   "(the engine's grammar writes each one out)")


def _pattern(v: Any, at: str, total: list[int]) -> None:
    # NOTE: the type only: JSON Schema's regexes are ECMA-262 (``\\p{L}``, ...), which Python's ``re``
    # does not compile; refusing what it cannot read would refuse valid schemas.
    if not isinstance(v, str):
        raise _Bad(f"{at}: a regular expression string, got {type(v).__name__}")
    for low, high in _QUANTIFIER.findall(v):
        # NOTE: the digits' length first: int() of over 4300 digits raises (and past 9 is too many anyway).
        _count(max(int(d) if len(d) <= 9 else MAX_COUNT + 1 for d in (low, high or "0")), at, total)


def schema_problem(schema: dict[str, Any]) -> str | None:
    """The first structural problem of ``schema`` as ``<keyword path>: <why>``, or None when sound.

    The path is relative to the schema (``properties.a.type``); the caller prefixes its field.
    Bounded by the caller's size check (depth and items) before it runs.
    """
    try:
        _check(schema, "", schema, [0])
    except _Bad as exc:
        return str(exc)
    return None
