"""A tool's REST route, run in process on the app's router with the ``/mcp`` request's context.

An MCP tool call is the REST request it names (:class:`recallserve.client.Call`: method, path, JSON
body, query), handed to the app's router as an ASGI request of its own: route matching, the
app-wide edge checks (query, content type, Unicode, duplicate keys), the route's auth dependency
(the caller's ``Authorization`` / ``api-key`` headers: the key decides the tenant), its request
model's validation, the service (PII policy, bounds, admission) and the route's error answers are
the REST route's code; the answer is read by the client's own :func:`~recallserve.client._core.decode`
(an error answer becomes :class:`~recallserve.client.RecallServeError` with the API's message).

What the request does not pass through a second time is what the ``/mcp`` request itself passed at
the app's edge: the request-id / metrics middleware (the tool's route runs under the ``/mcp``
request's id, so a turn the ``ask`` tool made is traced under the id its caller got back, and a tool
call is counted once, as ``/mcp``) and the body bound (the route's body is re-encoded from part of
the ``/mcp`` body, UTF-8 as sent, so it is never larger). Nor an HTTP client: before, the tools went
through ``httpx.ASGITransport`` and both middlewares again; timed in process on the 2-core host, the
tool's call above the memory service's own time went from 2.0 to 0.9 ms (p50), and ``bench mcp-search``
from 1.45-1.50x the REST p50 to 1.28x (raw JSON-RPC) / 1.40x (the SDK client) (docs/benchmarks.md).

An exception the route leaves unhandled is logged with the request id and becomes the API's 500
message, as :class:`~recallserve.serve.api.observe.ObserveMiddleware` answers it over HTTP.
"""

from __future__ import annotations

import contextlib
import json
import logging
from urllib.parse import unquote
from collections.abc import Mapping
from typing import Any, TypeVar

import anyio
import httpx
from starlette.types import ASGIApp, Message, Scope

from recallserve.client import Call, RecallServeError
from recallserve.client._core import decode

__all__ = ["run_route"]

T = TypeVar("T")
log = logging.getLogger("recallserve.api")

#: What the skipped edge layers put in a request's scope and the route needs: the app, its exception
#: handlers (Starlette's ExceptionMiddleware: an APIError becomes the API's envelope) and the
#: request's state (its id, set by the ObserveMiddleware).
_KEPT = ("type", "asgi", "http_version", "scheme", "server", "client", "root_path", "app",
         "starlette.exception_handlers")


def _body(call: Call[Any]) -> bytes:
    """The route's JSON body, encoded as :mod:`httpx` encodes the client's (compact, UTF-8, no NaN)."""
    if call.json is None:
        return b""
    try:
        return json.dumps(call.json, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except ValueError:
        raise RecallServeError(400, "arguments: NaN and Infinity are not JSON numbers", type="invalid_request_error",
                               param="arguments") from None


async def run_route(router: ASGIApp, outer: Scope, call: Call[T], headers: Mapping[str, str]) -> T:
    """``call`` answered by ``router`` as if ``headers`` had sent it in the request of ``outer``.

    Args:
        router: the app's router (``app.router``: its routes, without the edge middleware).
        outer: the scope of the ``/mcp`` request (already through the app's edge).
        call: the REST request to run.
        headers: the caller's key headers (lower-case names).

    Raises:
        RecallServeError: the route's error answer (status, the API's message and code).
    """
    body = _body(call)
    query = str(httpx.QueryParams(call.params)).encode("ascii") if call.params else b""
    state = outer.get("state", {})
    scope: dict[str, Any] = {k: outer[k] for k in _KEPT if k in outer}
    scope.update(method=call.method, path=unquote(call.path), raw_path=call.path.encode("utf-8"), query_string=query,
                 state={"request_id": state.get("request_id")} if "request_id" in state else {},
                 headers=[(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii")),
                          *((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())])
    done = anyio.Event()
    sent_body = False
    status = 0
    answer_headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        # NOTE: as an ASGI server does: the client "leaves" only once the answer is complete.
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            answer_headers.extend(message.get("headers", ()))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    request_id = scope["state"].get("request_id")
    async with contextlib.AsyncExitStack() as stack:
        # NOTE: FastAPI's per-request stack (file uploads close on it), as its middleware opens one.
        scope["fastapi_middleware_astack"] = stack
        try:
            await router(scope, receive, send)
        except Exception:
            log.exception("request %s %s %s (an MCP tool): unhandled error", request_id, call.method,
                          getattr(scope.get("route"), "path", "unmatched"))
            raise RecallServeError(500, f"internal server error (request id {request_id})", type="server_error",
                                   code="internal_error", request_id=request_id) from None
        finally:
            done.set()
    response = httpx.Response(status, headers=answer_headers, content=b"".join(chunks))
    return decode(call, response)
