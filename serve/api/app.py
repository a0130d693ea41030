"""The FastAPI application of the ingress, built from plain objects (no Ray).

``deployments/ingress.py`` hands this app to ``serve.ingress``; tests mount it in-process.
Routes: ``GET /healthz``, ``GET /metrics``, ``GET /v1/models``, ``POST /v1/chat/completions``
(JSON or SSE), plus any extra routers (memories, experiences) the caller passes in, and ``/mcp``
(the MCP server over those routes, :mod:`recallserve.serve.mcp`).

At the edge, before any route: a body over ``max_body_bytes`` is a 413, a malformed
``x-request-id`` a 400, and an unexpected exception a 500 in the JSON error envelope; every
error answer carries ``x-request-id`` and is logged with it. Log records of the process are
PII-masked (:func:`recallserve.serve.pii.install_log_masking`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.routing import compile_path

from recallserve.serve.api.auth import Authenticator
from recallserve.serve.api.chat_protocol import ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse
from recallserve.serve.api.errors import APIError, clip, error_body, install_error_handlers
from recallserve.serve.api.limits import (MAX_BODY_BYTES, BodyLimitMiddleware, check_content_type, check_duplicate_keys, check_query,
                              check_unicode)
from recallserve.serve.api.metrics import CONTENT_TYPE_LATEST, render_metrics
from recallserve.serve.api.observe import ObserveMiddleware
from recallserve.serve.engine import EngineError
from recallserve.serve.memory_api.admission import AdmissionRefused, SearchAdmission
from recallserve.serve.mcp import McpEndpoint
from recallserve.serve.pii import SESSION_KEY_CHARS, PersonalDataError, apply_pii, install_log_masking, mask_id, user_key
from recallserve.serve.pipeline import ChatPipeline, RequestContext

__all__ = ["create_app"]

log = logging.getLogger("recallserve.api")


def _stream_error(exc: Exception, request_id: str) -> dict[str, object]:
    """The error envelope of a failure after the stream's 200 went out (the status cannot change)."""
    if isinstance(exc, (EngineError, TimeoutError)):
        log.warning("stream %s failed: %s", request_id, exc)
        return error_body(f"model engine failed mid-stream: {exc}", "engine_error")
    if isinstance(exc, APIError):
        # NOTE: e.g. the memory tier down during the turn's write-back: the same body a JSON answer gets.
        log.warning("stream %s failed: %s", request_id, exc.message)
        return error_body(exc.message, exc.type, exc.param, exc.code)
    if isinstance(exc, PersonalDataError):
        return error_body(str(exc), "invalid_request_error", exc.param, "personal_data")
    log.exception("stream %s: unhandled error", request_id)
    return error_body(f"internal server error (request id {request_id})", "server_error", None, "internal_error")


_END = object()
"""The queue item :func:`_detached` puts after a stream's last chunk."""


async def _holding(chunks: AsyncIterator[ChatCompletionChunk],
                   held: contextlib.AsyncExitStack) -> AsyncIterator[ChatCompletionChunk]:
    """``chunks``; ``held`` (the turn's admission slot) is given back when the stream ends or fails."""
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        await held.aclose()


def _refused(exc: AdmissionRefused) -> JSONResponse:
    """A chat turn not admitted in time (``chat.admission``): 503 in the API's envelope with ``Retry-After``."""
    return JSONResponse(error_body(f"{exc}; retry after {exc.retry_after_s:g} s", "service_unavailable", None,
                                   "chat_overloaded"),
                        status_code=503, headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))})


async def _detached(chunks: AsyncIterator[ChatCompletionChunk], request_id: str,
                    background: set[asyncio.Task[None]]) -> AsyncIterator[ChatCompletionChunk]:
    """``chunks``, produced by a task of their own that runs to the end even when the client leaves.

    NOTE: the pipeline stores a streamed turn (its session append, trace and memory write-back)
    after the last token, as a plain answer's; a client that closed the connection mid-stream made
    the server cancel (or abandon) the generator at its next chunk, so the session lost the turn the
    client had half read, while a plain request whose client left was still stored in full. The
    producer is bounded as any turn (the request's deadline and ``max_tokens``), and so is the
    queue: one answer's chunks.
    """
    queue: asyncio.Queue[object] = asyncio.Queue()
    reader_gone = False

    async def produce() -> None:
        try:
            async for chunk in chunks:
                queue.put_nowait(chunk)
        except Exception as exc:  # noqa: BLE001 - handed to the reader (the stream's error event)
            if reader_gone:
                log.warning("stream %s failed after its client left: %s", request_id, exc)
            queue.put_nowait(exc)
        else:
            queue.put_nowait(_END)

    task = asyncio.get_running_loop().create_task(produce())
    background.add(task)
    task.add_done_callback(background.discard)
    try:
        while (item := await queue.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            yield item  # type: ignore[misc]
    finally:
        reader_gone = True


async def _sse(chunks: AsyncIterator[ChatCompletionChunk], request_id: str) -> AsyncIterator[bytes]:
    """Server-sent events; any failure mid-stream becomes an error event, then [DONE].

    NOTE: every exception, not only the engine's: once the 200 is sent, an escaping exception cuts
    the stream without ``[DONE]``, which an SDK reports as a network error, not the server's.
    """
    try:
        async for chunk in chunks:
            yield f"data: {chunk.model_dump_json(exclude_none=True)}\n\n".encode()
    except Exception as exc:  # noqa: BLE001 - the stream's one error path (see the note)
        yield f"data: {json.dumps(_stream_error(exc, request_id))}\n\n".encode()
    yield b"data: [DONE]\n\n"


async def _logged(hook: Callable[[], Awaitable[None]]) -> None:
    try:
        await hook()
    except Exception as exc:  # noqa: BLE001 - a startup hook must not take the app down
        log.warning("startup hook %s failed: %s", getattr(hook, "__name__", hook), exc)


async def _start_hooks(hooks: Sequence[Callable[[], Awaitable[None]]], wait_s: float,
                       background: set[asyncio.Task[None]], warm: asyncio.Event) -> None:
    """Start ``hooks`` together and wait for them up to ``wait_s``; ``warm`` is set once all are done.

    Awaited in the app's lifespan, so under Ray Serve (which runs the ASGI lifespan startup during
    replica initialisation) the replica reports ready only after its warm-up or the bound.
    """
    tasks = [asyncio.get_running_loop().create_task(_logged(h)) for h in hooks]
    for task in tasks:
        background.add(task)
        task.add_done_callback(background.discard)

    async def mark() -> None:
        await asyncio.gather(*tasks)
        warm.set()

    marker = asyncio.get_running_loop().create_task(mark())
    background.add(marker)
    marker.add_done_callback(background.discard)
    if wait_s > 0 and tasks:
        start = time.perf_counter()
        done, pending = await asyncio.wait(tasks, timeout=wait_s)
        if pending:
            log.warning("warm-up still running after %.0f s: ready now, it finishes in the background", wait_s)
        else:
            log.info("warm-up done in %.1f s before ready", time.perf_counter() - start)


def _allowed_methods(app: FastAPI, path: str) -> list[str]:
    """The methods the API document gives the paths matching ``path`` (none: an unknown path).

    NOTE: the ``/v1`` catch-all matches every method, so without this a known path asked with a
    method it does not take (``PUT /v1/chat/completions``) answered 404 instead of 405.
    """
    found: set[str] = set()
    for template, operations in app.openapi()["paths"].items():
        if compile_path(template)[0].match(path):
            found.update(method.upper() for method in operations)
    return sorted(found)


def create_app(
    pipeline: ChatPipeline,
    auth: Authenticator,
    *,
    routers: Sequence[APIRouter] = (),
    health: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    on_startup: Sequence[Callable[[], Awaitable[None]]] = (),
    startup_wait_s: float = 0.0,
    title: str = "recallserve",
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """Build the ingress app.

    Args:
        pipeline: answers chat requests.
        auth: maps API keys to tenants (every /v1 route requires a key).
        routers: extra routers, already carrying their own auth dependency.
        health: optional coroutine adding details to /healthz.
        on_startup: coroutines started when the app starts, e.g. a prompt-cache warm-up; a failure
            is logged, never fatal. ``/healthz`` says ``"warm": true`` once all have finished.
        startup_wait_s: how long the app's startup waits for them (0 = not at all); past it they
            go on in the background.
        max_body_bytes: largest request body (413 above; see ``recallserve.serve.api.limits.MAX_BODY_BYTES``).
    """
    install_log_masking()
    background: set[asyncio.Task[None]] = set()
    admission = SearchAdmission(pipeline.settings.admission, what="chat")
    warm = asyncio.Event()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with mcp.running():
            await _start_hooks(on_startup, startup_wait_s, background, warm)
            yield

    # NOTE: app-wide, so every router's routes (memories, experiences, sessions, ...) check it too.
    edge_checks = [Depends(check_query), Depends(check_content_type), Depends(check_unicode), Depends(check_duplicate_keys)]
    app = FastAPI(title=title, version="0.1.0", lifespan=lifespan, dependencies=edge_checks)
    install_error_handlers(app)
    # NOTE: added before the observer, so it runs inside it: a 413 gets the request id and metrics.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)

    # NOTE: outermost (added last): request id, metrics and the 500 envelope (serve.api.observe).
    app.add_middleware(ObserveMiddleware)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        body: dict[str, Any] = {"status": "ok", "models": pipeline.models(), "warm": warm.is_set()}
        if health is not None:
            body.update(await health())
        return body

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render_metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(tenant: str = Depends(auth)) -> dict[str, Any]:
        created = int(time.time())
        return {"object": "list",
                "data": [{"id": m, "object": "model", "created": created, "owned_by": "recallserve"} for m in pipeline.models()]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request,
                               tenant: str = Depends(auth)) -> ChatCompletionResponse | StreamingResponse:
        pii = auth.pii_for(tenant)
        if pii == "reject":
            # NOTE: checked at the edge, before anything is answered or stored; what the model and
            # tools add later is masked on write (serve.pii.for_write_back).
            apply_pii(body.user or "", pii, "user")
            apply_pii(body.metadata or {}, pii, "metadata")
            for i, message in enumerate(body.messages):
                apply_pii(message.text(), pii, f"messages.{i}.content")
                for j, call in enumerate(message.tool_calls or []):  # NOTE: rendered into the history too
                    apply_pii(call.function.arguments, pii, f"messages.{i}.tool_calls.{j}.function.arguments")
                # NOTE: a user message's name is stored as the write-back's metadata.speaker.
                apply_pii(message.name or "", pii, f"messages.{i}.name")
        # NOTE: the user and session ids key the session store; an e-mail as the user id (what
        # many clients send) is stored as its masked, still distinct key (serve.pii.user_key),
        # and the sessions, memory and erasure routes look it up the same way.
        user = user_key(body.user or "default", pii)
        if pii != "allow":
            if body.metadata and "session_id" in body.metadata:
                body.metadata = {**body.metadata, "session_id": mask_id(body.metadata["session_id"], SESSION_KEY_CHARS)}
        ctx = RequestContext(tenant=tenant, user=user, request_id=request.state.request_id,
                             scopes=auth.scopes_for(tenant), pii=pii)
        # NOTE: the turn waits here for one of the reasoner's slots (chat.admission), per tenant in turn, while it
        # can still be served in time; else the API's 503 with Retry-After, not a proxy's plain-text one (issue 37).
        held = contextlib.AsyncExitStack()
        try:
            await held.enter_async_context(admission.slot(tenant))
        except AdmissionRefused as exc:
            return _refused(exc)
        if body.stream:
            try:
                chunks = await pipeline.stream(body, ctx)
            except BaseException:
                await held.aclose()
                raise
            chunks = _detached(_holding(chunks, held), ctx.request_id, background)
            return StreamingResponse(_sse(chunks, ctx.request_id), media_type="text/event-stream",
                                     headers={"cache-control": "no-cache", "x-request-id": ctx.request_id})
        async with held:
            return await pipeline.complete(body, ctx)

    for router in routers:
        app.include_router(router)

    # NOTE: the MCP endpoint (serve.mcp): its tools call the routes above in process, with the caller's key.
    mcp = McpEndpoint(app.router, auth, title, app.version, max_body_bytes)
    app.router.add_route("/mcp", mcp, include_in_schema=False)

    # NOTE: every method a client may send (RFC 9110's but CONNECT): HEAD, OPTIONS and TRACE of a
    # known path were Starlette's bare "Method Not Allowed", naming neither the method nor what the path takes.
    @app.api_route("/v1/{path:path}", methods=["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"],
                   include_in_schema=False)
    async def unknown(path: str, request: Request) -> Response:
        allowed = _allowed_methods(app, f"/v1/{path}")
        # NOTE: the path is the client's text (as long as the server's URL limit): quoted clipped.
        path = clip(path, 200)
        if allowed:
            return JSONResponse(error_body(f"method: {request.method} is not allowed on /v1/{path} (it takes "
                                           f"{', '.join(allowed)})", "invalid_request_error", "method",
                                           "method_not_allowed"),
                                status_code=405, headers={"allow": ", ".join(allowed)})
        raise APIError(404, f"path: unknown route /v1/{path}", type="not_found_error", param="path")

    return app
