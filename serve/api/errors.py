"""OpenAI-style error bodies and the exception handlers that produce them.

Every error leaves as ``{"error": {"message", "type", "param", "code"}}`` with a 4xx for bad
input (the ``param`` names the offending field; personal data under the ``reject`` policy is a
400 with code ``personal_data``; a body over the cap a 413) and 503/504 for engine trouble; an
unexpected exception becomes a 500 with the request id (the app's middleware answers it, so the
``x-request-id`` header is set too), never a hang or a plain-text body.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from recallserve.serve.engine import EngineError
from recallserve.serve.statedb import StateUnavailableError
from recallserve.serve.pii import PersonalDataError

__all__ = ["APIError", "MAX_NAME_CHARS", "MAX_PARAM_CHARS", "MAX_WHY_CHARS", "clip", "install_error_handlers", "error_body",
           "describe_error"]

log = logging.getLogger("recallserve.api")


class APIError(Exception):
    """An error with an HTTP status and an OpenAI-style body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, object]:
    """The OpenAI error envelope."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


MAX_NAME_CHARS = 64
"""NOTE: the longest field name an error quotes in full (the API's own keys are at most 32 characters,
a metadata key 128): an unknown key is the client's text, and a 1-MB key was echoed in the message
and the param (twice over: 2 MB answered, and logged, for one 1-MB body)."""
MAX_PARAM_CHARS = 256
"""NOTE: the longest whole field path (``memories.3.metadata.<key>``) an error quotes in full."""
MAX_WHY_CHARS = 1024
"""NOTE: the longest reason an error quotes (a validator's message can quote the value it refused)."""


def clip(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and how many were left out.

    Example:
        >>> clip("abcdef", 3)
        'abc...(3 more characters)'
    """
    return text if len(text) <= limit else f"{text[:limit]}...({len(text) - limit} more characters)"


def _loc_to_param(loc: tuple[object, ...]) -> str:
    # NOTE: FastAPI prefixes body fields with "body"; drop it and pydantic's union tags so
    # the param reads like the JSON path a client wrote ("messages.0.role").
    # Only the first element says where the field came from; a body field may itself be
    # called "query" (memory search), so never drop later elements by name.
    # A union reports one error per member under the member's name ("str", "list[...]",
    # "ImagePart"): those are types, not fields, so they are dropped too.
    parts = [clip(str(p), MAX_NAME_CHARS) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    return ".".join(p for p in parts if not p.startswith(("function-", "tagged-union", "constrained-")) and not _UNION_MEMBER.match(p))


_UNION_MEMBER = re.compile(r"^(?:str|int|float|bool|none|.*\[.*\]|[A-Z][A-Za-z0-9]*)$")
# NOTE: a validator's message that starts by naming a field ("created_at: must not be before
# 1970", "stop: at most 4 stop sequences"): pydantic reports a model validator's error at the
# model (the body, "memories.0"), so the name in the message is the field's.
_NAMED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): ")


def describe_error(err: Mapping[str, Any], prefix: str = "") -> tuple[str, str]:
    """(param, message) of one pydantic error: the JSON path of the field (``prefix`` before it)
    and ``"<param>: <why>"``, without pydantic's ``Value error,`` noise.

    A model validator's error (at the model, naming a field in its message) gets that field as
    its param: ``memories.0`` + ``created_at: ...`` -> ``memories.0.created_at``. A field
    validator's message naming a path inside its field (``metadata.a: nested too deeply`` at
    ``memories.0.metadata``) keeps the field as the param.
    """
    if err.get("type") == "json_invalid":
        # NOTE: FastAPI's location of a JSON syntax error is ("body", <character offset>): a
        # position, not a field.
        where = (err.get("loc") or ("body", "?"))[-1]
        why = (err.get("ctx") or {}).get("error", "invalid JSON")
        return prefix, f"body: invalid JSON at character {where}: {why}"
    loc = _loc_to_param(tuple(err.get("loc", ())))
    param = ".".join(p for p in (prefix, loc) if p)
    why = clip(str(err.get("msg", "invalid")).removeprefix("Value error, "), MAX_WHY_CHARS)
    named = _NAMED.match(why) if err.get("type") == "value_error" else None
    if named is not None:
        name = named.group(1)
        if param.rsplit(".", 1)[-1] != name.split(".", 1)[0]:
            param, why = ".".join(p for p in (param, name) if p), why[named.end():]
    return param, f"{param or 'body'}: {why}"


# NOTE: FastAPI's answer to a body its JSON parser gave up on with something other than a syntax
# error: bytes that are not UTF-8, nesting deeper than Python's recursion limit, an integer of over
# 4300 digits.
_FASTAPI_UNPARSABLE = "There was an error parsing the body"
_UNPARSABLE = "body: could not be parsed as JSON (not UTF-8 text, nested too deeply, or a number too long)"


def install_error_handlers(app: FastAPI) -> None:
    """Register handlers turning every failure into an OpenAI-style JSON error."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        # NOTE: the deepest location first: of a union's per-member errors, the one that got furthest
        # into the value names the field the client got wrong ("...image_url.url", not "content").
        errs = sorted(exc.errors(), key=lambda e: -len(e.get("loc", ())))
        described = [describe_error(e) for e in errs[:5]] or [("", "body: invalid request")]
        param = described[0][0]
        msg = "; ".join(m for _, m in described)
        return JSONResponse(error_body(msg, "invalid_request_error", param or None), status_code=400)

    @app.exception_handler(PersonalDataError)
    async def _personal(_: Request, exc: PersonalDataError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "invalid_request_error", exc.param, "personal_data"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        code = "request_too_large" if exc.status_code == 413 else None
        message = _UNPARSABLE if exc.status_code == 400 and exc.detail == _FASTAPI_UNPARSABLE else str(exc.detail)
        # NOTE: Starlette's own bare answers (no route, a method a route outside /v1 does not take:
        # "/console/a%2Fb", "POST /console/index.html") name the part of the request at fault.
        if exc.status_code == 404 and message == "Not Found":
            message = f"path: no route {clip(request.url.path, 200)}"
        elif exc.status_code == 405 and message == "Method Not Allowed":
            message = f"method: {clip(request.method, 32)} is not allowed on {clip(request.url.path, 200)}"
        # NOTE: a router that raises HTTPException (so it also runs in a bare app) names the field
        # by starting its message with it ("exp_id: experience 'x' not found").
        named = _NAMED.match(message)
        return JSONResponse(error_body(message, kind, named.group(1) if named else None, code),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(EngineError)
    async def _engine(_: Request, exc: EngineError) -> JSONResponse:
        log.warning("engine failure: %s", exc)
        return JSONResponse(error_body(f"model engine unavailable: {exc}", "engine_error"), status_code=503)

    @app.exception_handler(StateUnavailableError)
    async def _state(_: Request, exc: StateUnavailableError) -> JSONResponse:
        # NOTE: nothing was half-done (each store call is one transaction): the client retries.
        log.warning("state database: %s", exc)
        return JSONResponse(error_body(str(exc), "service_unavailable", None, "state_unavailable"), status_code=503,
                            headers={"Retry-After": "1"})

    @app.exception_handler(TimeoutError)
    async def _timeout(_: Request, exc: TimeoutError) -> JSONResponse:
        return JSONResponse(error_body(f"timed out: {exc}", "timeout_error"), status_code=504)
