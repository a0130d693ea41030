"""Edge limits of the ingress: the request-body cap (413) and the client's request id.

Both run before any route: a body over the cap is refused while it streams in (its
``content-length`` alone is enough when sent), so an oversized upload never reaches the JSON
parser or the ingress's memory; a request id that is not a short token is a 400 rather than a
string copied into every log line and response header.
"""

from __future__ import annotations

import re

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve.api.errors import error_body

__all__ = ["MAX_BODY_BYTES", "BodyLimitMiddleware", "valid_request_id"]

MAX_BODY_BYTES = 32 * 2**20
"""NOTE: 32 MiB: the largest image the describer takes (12 MiB, 16 MiB as base64) plus a full
text conversation (1M characters), or eight 2-3 MiB phone photos. Larger is a batch upload, not
a chat turn; each in-flight body is held (and decoded) in the ingress's memory, so the cap bounds
what concurrent requests can make a replica hold. ``create_app(max_body_bytes=...)`` changes it."""

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def valid_request_id(value: str) -> bool:
    """Whether a client's ``x-request-id`` is usable: 1-128 of ``A-Z a-z 0-9 . _ : -``."""
    return _REQUEST_ID.fullmatch(value) is not None


def _too_large(limit: int) -> str:
    return f"request body larger than {limit} bytes ({limit // 2**20} MiB)"


class BodyLimitMiddleware:
    """Refuses a request body over ``max_bytes`` with 413 in the JSON error envelope.

    A declared ``content-length`` over the cap is answered at once; a body streamed without one
    (chunked) is counted as it arrives and the route's body read fails with the same 413 (an
    ``HTTPException`` the app's handlers turn into the envelope).

    Args:
        app: the ASGI app to wrap.
        max_bytes: largest accepted body.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes: must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            status, message = (413, _too_large(self.max_bytes)) if declared.isdigit() else (400, "invalid content-length")
            response = JSONResponse(error_body(message, "invalid_request_error", None,
                                               "request_too_large" if status == 413 else None), status_code=status)
            await response(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise StarletteHTTPException(413, _too_large(self.max_bytes))
            return message

        await self.app(scope, limited, send)
