"""``/mcp`` with the official MCP Python client over streamable HTTP, in process (the app through
``httpx.ASGITransport``; the same client against a server process is tests/integration/test_mcp_clients.py).

Each assertion reads what the MCP client got (the tool result, the tool error's text) or the
prompt the engine received, and compares it with the REST route's answer to the same request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from recallserve.serve.memory_api import MemoryService
from recallserve.serve.mcp import TOOLS
from tests.unit.edge.conftest import ANSWER, FixedEngine, build_app, headers

@asynccontextmanager
async def _session(app: FastAPI, key_headers: dict[str, str]) -> AsyncIterator[tuple[ClientSession, httpx.AsyncClient]]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rs", headers=key_headers) as http:
        async with streamable_http_client("http://rs/mcp", http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session, http


def _run(tmp_path: Path, flow: Callable[[FastAPI], Awaitable[None]], engine: FixedEngine | None = None) -> None:
    app, memory = build_app(tmp_path, engine=engine)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            await flow(app)

    try:
        asyncio.run(main())
    finally:
        for shard_client in memory.coordinator.shards:
            shard_client.shard.close()


def test_tools_are_listed_with_the_routes_schemas(tmp_path: Path) -> None:
    async def flow(app: FastAPI) -> None:
        async with _session(app, headers("acme")) as (s, _):
            tools = {t.name: t for t in (await s.list_tools()).tools}
        assert sorted(tools) == sorted(TOOLS)
        search = tools["search_memories"].inputSchema
        assert search["required"] == ["query"] and {"k", "threshold", "filters", "decay", "hybrid"} <= set(search["properties"])
        assert all(t.description and len(t.description) > 20 for t in tools.values())
        assert all(p.get("description") for t in tools.values() for p in t.inputSchema["properties"].values())
        assert tools["delete_memory"].annotations.destructiveHint and tools["search_memories"].annotations.readOnlyHint

    _run(tmp_path, flow)


def test_add_then_search_and_resources(tmp_path: Path) -> None:
    async def flow(app: FastAPI) -> None:
        async with _session(app, headers("acme")) as (s, http):
            added = await s.call_tool("add_memories", {"memories": [{"text": "The boiler code is K-17.", "source_id": "b"}]})
            assert not added.isError, added
            memory_id = added.structuredContent["ids"][0]
            found = await s.call_tool("search_memories", {"query": "boiler code", "k": 3})
            rest = (await http.post("/v1/memories/search", json={"query": "boiler code", "k": 3})).json()
            assert [h["id"] for h in found.structuredContent["data"]] == [h["id"] for h in rest["data"]] == [memory_id]
            listed = await s.call_tool("list_memories", {"source_id": "b"})
            assert [m["text"] for m in listed.structuredContent["data"]] == ["The boiler code is K-17."]
            read = await s.read_resource(f"memory://{memory_id}")
            assert "K-17" in read.contents[0].text
            assert not (await s.call_tool("delete_memory", {"memory_id": memory_id})).isError
            assert (await http.get(f"/v1/memories/{memory_id}")).status_code == 404

    _run(tmp_path, flow)


def test_a_bad_argument_is_a_tool_error_with_the_rest_message(tmp_path: Path) -> None:
    cases: list[tuple[str, dict[str, Any], str, str, dict[str, Any]]] = [
        ("search_memories", {"query": "x", "k": 1000}, "POST", "/v1/memories/search", {"query": "x", "k": 1000}),
        ("search_memories", {"query": "  "}, "POST", "/v1/memories/search", {"query": "  "}),
        ("add_memories", {"memories": [{"text": "a", "colour": 1}]}, "POST", "/v1/memories",
         {"memories": [{"text": "a", "colour": 1}]}),
        ("get_memory", {"memory_id": "a\nb"}, "GET", "/v1/memories/a%0Ab", {}),
        ("get_memory", {"memory_id": "0" * 32}, "GET", "/v1/memories/" + "0" * 32, {}),
        ("search_experiences", {"query": "q"}, "POST", "/v1/experiences/search", {"query": "q"}),
    ]

    async def flow(app: FastAPI) -> None:
        async with _session(app, headers("acme")) as (s, http):
            for tool, arguments, method, path, body in cases:
                result = await s.call_tool(tool, arguments)
                rest = await http.request(method, path, json=body or None)
                assert rest.status_code >= 400 and result.isError, (tool, arguments, rest.text)
                assert result.content[0].text == rest.json()["error"]["message"], (tool, result.content, rest.text)
            missing = await s.call_tool("get_memory", {})
            assert missing.isError and missing.content[0].text == "memory_id: Field required"
            unknown = await s.call_tool("drop_tables", {})
            assert unknown.isError and unknown.content[0].text.startswith("name: unknown tool 'drop_tables'")

    _run(tmp_path, flow)


def test_ask_runs_one_chat_turn_with_the_callers_memories(tmp_path: Path) -> None:
    engine = FixedEngine()

    async def flow(app: FastAPI) -> None:
        async with _session(app, headers("acme")) as (s, http):
            await s.call_tool("add_memories", {"memories": [{"text": "Acme's fleet code is ORCA-5."}]})
            answer = await s.call_tool("ask", {"question": "What is the fleet code?", "session_id": "s-mcp"})
            assert not answer.isError and answer.structuredContent["answer"] == ANSWER, answer
            # NOTE: the prompt the engine received holds the question and the recalled memory.
            prompt = "\n".join(m.content for m in engine.calls[-1][0])
            assert "What is the fleet code?" in prompt and "ORCA-5" in prompt, prompt
            assert (await http.get("/v1/sessions/s-mcp")).json()["message_count"] == 2

    _run(tmp_path, flow, engine)


def test_the_key_is_checked_at_the_edge_as_rest_does(tmp_path: Path) -> None:
    async def flow(app: FastAPI) -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rs") as http:
            init = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            accept = {"accept": "application/json, text/event-stream"}
            for extra, code in [({}, "missing_api_key"), ({"authorization": "Bearer sk-nope"}, "invalid_api_key")]:
                r = await http.post("/mcp", json=init, headers={**accept, **extra})
                rest = await http.post("/v1/memories/search", json={"query": "x"}, headers=extra)
                assert r.status_code == rest.status_code == 401 and r.json() == rest.json(), r.text
                assert r.json()["error"]["code"] == code
            ok = await http.post("/mcp", json=init, headers={**accept, **headers("acme")})
            assert ok.status_code == 200 and len(ok.json()["result"]["tools"]) == len(TOOLS)
            # NOTE: the legacy SSE transport is not served: a GET is a 405, not a stream.
            assert (await http.get("/mcp", headers={**headers("acme"), "accept": "text/event-stream"})).status_code == 405

    _run(tmp_path, flow)


def test_a_body_over_the_bound_is_the_rest_413(tmp_path: Path) -> None:
    app, memory = build_app(tmp_path, max_body_bytes=4096)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rs") as http:
                call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": {"name": "add_memories", "arguments": {"memories": [{"text": "x" * 5000}]}}}
                r = await http.post("/mcp", json=call, headers={**headers("acme"), "accept": "application/json, text/event-stream"})
                rest = await http.post("/v1/memories", json=call["params"]["arguments"], headers=headers("acme"))
                assert r.status_code == rest.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text

    try:
        asyncio.run(main())
    finally:
        for shard_client in memory.coordinator.shards:
            shard_client.shard.close()


_ACCEPT = {"accept": "application/json, text/event-stream"}


def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def test_the_ask_tools_turn_is_traced_under_the_mcp_requests_id(tmp_path: Path) -> None:
    # NOTE: the route runs under the /mcp request's id, so the caller can read the turn it made by the id it got back.
    async def flow(app: FastAPI) -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rs") as http:
            r = await http.post("/mcp", json=_tool_call("ask", {"question": "Where is the kiln?"}),
                                headers={**headers("acme"), **_ACCEPT, "x-request-id": "mcp-turn-1"})
            assert r.status_code == 200 and not r.json()["result"]["isError"], r.text
            assert r.headers["x-request-id"] == "mcp-turn-1"
            turn = await http.get("/v1/turns/mcp-turn-1", headers=headers("acme"))
            assert turn.status_code == 200 and "Where is the kiln?" in turn.text, turn.text
            assert (await http.get("/v1/turns/mcp-turn-1", headers=headers("globex"))).status_code == 404

    _run(tmp_path, flow)


def test_an_unexpected_error_in_the_route_is_the_rest_500_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*_: object, **__: object) -> object:
        raise RuntimeError("bug while handling card 4111 1111 1111 1111")

    monkeypatch.setattr(MemoryService, "search_request", broken)

    async def flow(app: FastAPI) -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rs") as http:
            rest = await http.post("/v1/memories/search", json={"query": "kiln"},
                                   headers={**headers("acme"), "x-request-id": "rest-1"})
            r = await http.post("/mcp", json=_tool_call("search_memories", {"query": "kiln"}),
                                headers={**headers("acme"), **_ACCEPT, "x-request-id": "mcp-1"})
            result = r.json()["result"]
            assert rest.status_code == 500 and r.status_code == 200 and result["isError"], r.text
            assert result["content"][0]["text"] == rest.json()["error"]["message"].replace("rest-1", "mcp-1")
            assert "4111" not in r.text

    _run(tmp_path, flow)


def test_an_id_with_a_slash_stays_one_path_segment(tmp_path: Path) -> None:
    # NOTE: the tool's route gets the percent-encoded path as raw_path and the decoded one as path, as over HTTP.
    async def flow(app: FastAPI) -> None:
        async with _session(app, headers("acme")) as (s, http):
            got = await s.call_tool("get_memory", {"memory_id": "no/such?id"})
            rest = await http.get("/v1/memories/no%2Fsuch%3Fid")
            assert rest.status_code == 404 and got.isError, (rest.text, got)
            assert got.content[0].text == rest.json()["error"]["message"]

    _run(tmp_path, flow)
