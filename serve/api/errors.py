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

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve.engine import EngineError
from serve.pii import PersonalDataError

__all__ = ["APIError", "install_error_handlers", "error_body"]

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


def _loc_to_param(loc: tuple[object, ...]) -> str:
    # NOTE: FastAPI prefixes body fields with "body"; drop it and pydantic's union tags so
    # the param reads like the JSON path a client wrote ("messages.0.role").
    # Only the first element says where the field came from; a body field may itself be
    # called "query" (memory search), so never drop later elements by name.
    # A union reports one error per member under the member's name ("str", "list[...]",
    # "ImagePart"): those are types, not fields, so they are dropped too.
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    return ".".join(p for p in parts if not p.startswith(("function-", "tagged-union")) and not _UNION_MEMBER.match(p))


_UNION_MEMBER = re.compile(r"^(?:str|int|float|bool|none|.*\[.*\]|[A-Z][A-Za-z0-9]*)$")


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
        first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
        param = _loc_to_param(tuple(first.get("loc", ())))
        msg = "; ".join(
            f"{_loc_to_param(tuple(e.get('loc', ()))) or 'body'}: {e.get('msg', 'invalid')}" for e in errs[:5]
        )
        return JSONResponse(error_body(msg, "invalid_request_error", param or None), status_code=400)

    @app.exception_handler(PersonalDataError)
    async def _personal(_: Request, exc: PersonalDataError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "invalid_request_error", exc.param, "personal_data"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        code = "request_too_large" if exc.status_code == 413 else None
        return JSONResponse(error_body(str(exc.detail), kind, None, code), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(EngineError)
    async def _engine(_: Request, exc: EngineError) -> JSONResponse:
        log.warning("engine failure: %s", exc)
        return JSONResponse(error_body(f"model engine unavailable: {exc}", "engine_error"), status_code=503)

    @app.exception_handler(TimeoutError)
    async def _timeout(_: Request, exc: TimeoutError) -> JSONResponse:
        return JSONResponse(error_body(f"timed out: {exc}", "timeout_error"), status_code=504)
