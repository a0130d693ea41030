"""The outermost app middleware: request ids, request metrics, and the envelope of unexpected errors.

A plain ASGI middleware, not ``@app.middleware("http")``: Starlette's ``BaseHTTPMiddleware`` runs
the app in a task of its own and re-streams every response through a memory channel, which cost
1.1-1.4 ms of CPU per request on the 2-core host (an empty FastAPI route: 1.2 ms without it, 2.5 ms
with it, 1.2 ms with this class, measured through httpx's ASGI transport). 
A memory search costs ~40 ms through the cluster, so that was 3% of every search.

What it does for each HTTP request:

* the request id: the client's ``x-request-id`` when valid (1-128 characters of ``A-Z a-z 0-9 . _ : -``),
  else a new one (:func:`new_request_id`); an invalid one, or two different ones, is answered 400 naming the header;
  the id is put on ``request.state.request_id`` and on every response's ``x-request-id`` header;
* ``REQUESTS`` and ``LATENCY`` by matched route template and method (bounded cardinality: a method
  outside :data:`METHODS` counts as ``OTHER``), the latency taken when the response starts (time
  to headers; a stream's body is not counted);
* ``TENANT_REQUESTS`` and ``TENANT_LATENCY`` by the tenant the API key resolved to (set on
  ``request.state.tenant`` by :class:`~recallserve.serve.api.auth.Authenticator`), for the console's Health page;
* an exception that escapes the app before the response started becomes the JSON envelope with
  status 500 and the request id (logged with its traceback); after it started, it is logged and
  re-raised (the server closes the connection); a cancelled request (client gone) counts as 499,
  and a stream whose client left (``ClientDisconnect``) is logged as such, not as an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from recallserve.serve.api.errors import error_body
from recallserve.serve.api.limits import RESERVED_REQUEST_IDS, path_segment_problem, valid_request_id
from recallserve.serve.api.metrics import LATENCY, REQUESTS, TENANT_LATENCY, TENANT_REQUESTS

__all__ = ["METHODS", "ObserveMiddleware", "method_label", "new_request_id"]

log = logging.getLogger("recallserve.api")

_HEADER = b"x-request-id"

#: Methods a metric's ``method`` label names as sent (RFC 9110's, plus PATCH).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"})
#: The console's Health route, whose polls its per-tenant figures leave out.
HEALTH_ROUTE = "/v1/console/health"


# NOTE: hex digits spelt as letters: ~0.3 % of uuid4 hex ids hold a digit run the PII masker takes for
# a card or phone number, and a turn's trace is kept under its masked id (serve.traces), so such a
# turn was listed under another id than its x-request-id.
_NO_DIGITS = str.maketrans("0123456789", "ghijklmnop")


def new_request_id() -> str:
    """A fresh request id: uuid4 hex (128 bits) with its digits spelt as the letters g-p.

    Example:
        >>> len(new_request_id()), any(c.isdigit() for c in new_request_id())
        (32, False)
    """
    return uuid.uuid4().hex.translate(_NO_DIGITS)


def method_label(method: str) -> str:
    """The ``method`` label of a request: the method when it is one of :data:`METHODS`, else ``OTHER``.

    NOTE: HTTP lets a method be any token and the server passes it on (a 405 answers it), so a
    label copied from it let every request with a made-up method (``FOO1``, ``FOO2``, ...) add a
    time series to ``/metrics`` for the life of the process.

    Example:
        >>> method_label("POST"), method_label("X-PROBE-17")
        ('POST', 'OTHER')
    """
    return method if method in METHODS else "OTHER"



def _log_path(scope: Scope) -> str:
    """The request's path as logged: its matched route template (``/v1/users/{user}``), never the
    raw path, whose ids (an end user, a session) a log must not keep (an erasure could not reach
    them); ``<unmatched>`` when no route matched (the client's path may still carry such an id)."""
    route = getattr(scope.get("route"), "path", None)
    return route if isinstance(route, str) else "<unmatched>"

class ObserveMiddleware:
    """Request id, metrics and the 500 envelope for every HTTP request (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = [v.decode("latin-1") for k, v in scope["headers"] if k == _HEADER]
        sent_id = sent[0] if sent else None
        # NOTE: two different ids: the trace kept one and a proxy's log the other (a 400, as two API keys are a 401).
        repeated = len(set(sent)) > 1
        request_id = sent_id if sent_id and not repeated and valid_request_id(sent_id) else new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        start = time.perf_counter()
        status = 0
        header = (_HEADER, request_id.encode("latin-1"))

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*(h for h in message.get("headers", ()) if h[0].lower() != _HEADER), header]
                self._observe(scope, status, start)
            await send(message)

        try:
            if sent_id is not None and sent_id != request_id:
                why = (f"x-request-id: given {len(sent)} times with different values; send it once" if repeated
                       else f"x-request-id: {sent_id!r} names a route (GET /v1/turns/{sent_id}), so the turn could never be "
                       "read by its id; send another id" if sent_id in RESERVED_REQUEST_IDS
                       else f"x-request-id: {problem}; send another id" if (problem := path_segment_problem(sent_id))
                       else "x-request-id: must be 1-128 characters of A-Z a-z 0-9 . _ : -")
                response = JSONResponse(error_body(why, "invalid_request_error", "x-request-id"), status_code=400)
                await response(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            # NOTE: the client went away (a closed connection, a load test stopping): nginx's 499,
            # so the error-rate panels count server errors only.
            if not status:
                status = 499
                self._observe(scope, status, start)
            raise
        except ClientDisconnect:
            # NOTE: under ASGI spec 2.4 a stream's send to a closed connection raises this: the
            # client left (as the cancellation above), not a server error worth a traceback; the
            # turn is still stored (serve.api.app._detached).
            log.info("request %s %s %s: client disconnected", request_id, scope["method"], _log_path(scope))
            if not status:
                self._observe(scope, 499, start)
            return
        except Exception:
            log.exception("request %s %s %s: unhandled error", request_id, scope["method"], _log_path(scope))
            if status:
                raise  # the response has started: nothing else can be sent on it
            response = JSONResponse(error_body(f"internal server error (request id {request_id})", "server_error",
                                               None, "internal_error"), status_code=500)
            await response(scope, receive, send_with_id)
        if status >= 400:
            log.log(logging.WARNING if status >= 500 else logging.INFO, "request %s %s %s -> %d", request_id,
                    scope["method"], _log_path(scope), status)

    @staticmethod
    def _observe(scope: Scope, status: int, start: float) -> None:
        # NOTE: label by matched route template, not raw path, to keep cardinality bounded.
        route = getattr(scope.get("route"), "path", "unmatched")
        method = method_label(scope["method"])
        took = time.perf_counter() - start
        REQUESTS.labels(route, method, str(status)).inc()
        LATENCY.labels(route, method).observe(took)
        tenant = scope.get("state", {}).get("tenant")
        # NOTE: the Health page's own polls are left out, as in its whole-process figures (_SKIP_ROUTES).
        if isinstance(tenant, str) and route != HEALTH_ROUTE:
            TENANT_REQUESTS.labels(tenant, str(status)).inc()
            TENANT_LATENCY.labels(tenant).observe(took)
