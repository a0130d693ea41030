"""``/mcp``: the Model Context Protocol endpoint of the ingress (streamable HTTP, the official SDK).

Transport: the SDK's :class:`StreamableHTTPSessionManager`, stateless with JSON answers (every
POST carries its own key and needs no session affinity across ingress replicas; there is no SSE
stream to hold). The legacy SSE transport is not served, nor the optional GET stream: any method
but POST is a 405 naming POST, which the spec lets a client read as "no server-initiated stream".

Each tool call is the REST route it names, run in process on the app's router under the ``/mcp``
request's id (:func:`~recallserve.serve.mcp._inprocess.run_route`), with the caller's ``Authorization`` /
``api-key`` headers. So the key check, tenancy, PII policy, bounds, admission (503 + Retry-After) and
error messages are the route's own code, not a second copy; a route's error becomes an MCP tool error
(``isError: true``) whose text is the route's message, never a transport failure.

The request itself is authenticated at the edge (the same :class:`Authenticator`): no key, a bad
key or two keys is the REST API's 401 envelope, before any MCP message is read. DNS-rebinding
protection of the SDK (a Host allow-list) is off: the server is reached under names the SDK cannot
know (a Service, a proxy), and a browser page without the API key gets the 401.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import AnyUrl
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from recallserve.client import Call, RecallServeError
import recallserve.client._calls as calls
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.api.errors import APIError, error_body
from recallserve.serve.api.limits import MAX_BODY_BYTES
from recallserve.serve.mcp._inprocess import run_route
from recallserve.serve.mcp._tools import TOOLS, ToolArgumentError

__all__ = ["McpEndpoint", "MEMORY_URI"]

T = TypeVar("T")

#: The memory resources' URI template (``resources/read`` of ``memory://<id>``).
MEMORY_URI = "memory://{memory_id}"
_FORWARDED = ("authorization", "api-key")
_INSTRUCTIONS = ("Long-term memory for this user's agent: add_memories stores facts, search_memories recalls "
                 "them (hybrid dense + BM25), ask runs one chat turn of the recallserve agent with its memories.")


class ToolFailed(Exception):
    """A route's error answer, as the tool error the MCP client sees (the route's message)."""


class McpEndpoint:
    """The ``/mcp`` ASGI endpoint of an app (mount it, and enter :meth:`running` in the app's lifespan).

    Args:
        router: the app's router (``app.router``), whose routes the tools run in process.
        auth: the app's authenticator (the same keys, checked at ``/mcp`` itself).
        name, version: what MCP clients show of the server.
        max_body_bytes: the app's body bound, given to the SDK too (its own default is 4 MiB), so a
            tool call carries what the REST route takes; above it the app's middleware answers the 413.
    """

    def __init__(self, router: ASGIApp, auth: Authenticator, name: str = "recallserve", version: str = "0.1.0",
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.auth = auth
        self.router = router
        self.max_body_bytes = max_body_bytes
        self.server: Server[Any, Request] = Server(name, version=version, instructions=_INSTRUCTIONS)
        self._manager: StreamableHTTPSessionManager | None = None
        self._register()

    def _register(self) -> None:
        server = self.server

        @server.list_tools()
        async def list_tools() -> list[types.Tool]:
            return [types.Tool(name=t.name, description=t.description, inputSchema=t.input_schema(),
                               annotations=types.ToolAnnotations(readOnlyHint=t.read_only,
                                                                 destructiveHint=t.name == "delete_memory"))
                    for t in TOOLS.values()]

        # NOTE: validate_input=False: the route validates, so the message is the REST API's own.
        @server.call_tool(validate_input=False)
        async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
            tool = TOOLS.get(name)
            if tool is None:
                raise ToolFailed(f"name: unknown tool {name[:64]!r}; the tools are {', '.join(TOOLS)}")
            try:
                # NOTE: the route's JSON as it came (result type str): the tool passes it on, so an answer is
                # not read into the API's models and written out again (docs/benchmarks.md, bench mcp-search).
                text = await self._run(replace(tool.call(arguments), result=str))
            except (RecallServeError, ToolArgumentError) as exc:
                raise ToolFailed(exc.message if isinstance(exc, RecallServeError) else str(exc)) from None
            structured = json.loads(text)
            if tool.result is not None:
                structured = tool.result(structured)
                text = json.dumps(structured)
            # NOTE: the JSON twice, as the spec asks of a tool with structured content (for older clients).
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                        structuredContent=structured)

        @server.list_resource_templates()
        async def templates() -> list[types.ResourceTemplate]:
            return [types.ResourceTemplate(uriTemplate=MEMORY_URI, name="memory", mimeType="application/json",
                                           description="One of the caller's memories by id, as GET /v1/memories/{id}.")]

        @server.list_resources()
        async def resources() -> list[types.Resource]:
            # NOTE: memories are found by search, not enumerated (a tenant may hold millions).
            return []

        @server.read_resource()
        async def read(uri: AnyUrl) -> list[ReadResourceContents]:
            text = str(uri)
            if not text.startswith("memory://") or len(text) == len("memory://"):
                raise ValueError(f"uri: expected {MEMORY_URI}, got {text[:200]!r}")
            try:
                memory = await self._run(calls.get_memory(text.removeprefix("memory://")))
            except RecallServeError as exc:
                raise ValueError(exc.message) from None
            return [ReadResourceContents(json.dumps(memory.model_dump(mode="json")), "application/json")]

    async def _run(self, call: Call[T]) -> T:
        """``call`` answered by the app's route, in process, as the ``/mcp`` request's caller (its key headers)."""
        request = self.server.request_context.request
        assert request is not None, "an MCP request over HTTP carries its HTTP request"
        headers = {h: request.headers[h] for h in _FORWARDED if h in request.headers}
        return await run_route(self.router, request.scope, call, headers)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's session manager for the app's lifetime (one per start: it runs once)."""
        self._manager = StreamableHTTPSessionManager(
            app=self.server, json_response=True, stateless=True, max_request_body_size=self.max_body_bytes,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        try:
            async with self._manager.run():
                yield
        finally:
            self._manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            await self.auth(Request(scope, receive))
        except APIError as exc:
            await JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code), status_code=exc.status)(
                scope, receive, send)
            return
        if scope["method"] != "POST":
            # NOTE: stateless, so no server-initiated message could reach a GET's stream: the spec's
            # 405 (clients then POST only), not an SSE stream held open for nothing.
            await JSONResponse(error_body(f"method: {scope['method'][:32]} is not allowed on /mcp (it takes POST; "
                                          "streamable HTTP, stateless)", "invalid_request_error", "method",
                                          "method_not_allowed"), status_code=405, headers={"allow": "POST"})(
                scope, receive, send)
            return
        if self._manager is None:
            await JSONResponse(error_body("mcp: the server is starting or stopping; retry", "service_unavailable"),
                               status_code=503, headers={"Retry-After": "1"})(scope, receive, send)
            return
        await self._manager.handle_request(scope, receive, send)
