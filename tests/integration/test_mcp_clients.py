"""``/mcp`` with three clients we did not write, against a running server process on loopback:
the official MCP Python client, the official TypeScript SDK under Node, and LangChain's MCP adapters.

The server is :mod:`tests.security._server` (the ingress app with the real memory service on two
hybrid shards, the session and experience services; the hashing embedder and a fixed-answer engine
are its only doubles), so ``/mcp`` here is the same code the Ray ingress serves. Each flow:
initialize, list the tools, add then search a memory, a second tenant's key sees nothing of the
first's, and a bad argument is a tool error carrying the REST API's message.

The same flows run against a cluster that is already up (``recallserve up``: Ray, the real
embedder and model) when ``RECALLSERVE_MCP_URL`` names it (loopback) and ``RECALLSERVE_MCP_KEYS``
gives two keys of different tenants (``sk-local,sk-other`` with ``RECALLSERVE_API_KEYS=sk-other:other``
set for ``up``); ``loadtests/results/mcp-clients-up.md`` records such a run.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from langchain_mcp_adapters.client import MultiServerMCPClient
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from recallserve.client import RecallServe, RecallServeError
from recallserve.serve.mcp import TOOLS
from recallserve.serve.ports import free_port
from loadtests._guard import check_host

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / "mcp_node"


@dataclass(frozen=True)
class Target:
    """Where the flows run: the base URL, a key of the tenant that writes, a key of another tenant."""

    base: str
    owner: str = "sk-acme"
    stranger: str = "sk-globex"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """A server process of the security rig (stopped by its PID after the module), or the running
    cluster ``RECALLSERVE_MCP_URL`` names (see the module docstring)."""
    url = os.environ.get("RECALLSERVE_MCP_URL")
    if url:
        keys = os.environ.get("RECALLSERVE_MCP_KEYS", "sk-local,sk-other").split(",")
        assert len(keys) == 2, "RECALLSERVE_MCP_KEYS: two keys of different tenants, comma-separated"
        yield Target(check_host(url), keys[0], keys[1])
        return
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.security._server", str(tmp_path_factory.mktemp("mcp")), str(port)],
                            cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.3)
        yield Target(base)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _rest_error(server: Target, **search: object) -> str:
    with RecallServe(server.base, server.owner) as rs, pytest.raises(RecallServeError) as exc:
        rs.memories.search(**search)  # type: ignore[arg-type]
    return exc.value.message


def test_official_python_client(server: Target) -> None:
    async def session_of(key: str, flow):  # type: ignore[no-untyped-def]
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
            async with streamable_http_client(f"{server.base}/mcp", http_client=http) as (read, write, _):
                async with ClientSession(read, write) as s:
                    info = await s.initialize()
                    assert info.serverInfo.name == "recallserve"
                    return await flow(s)

    async def owner(s: ClientSession) -> tuple[str, list[str], object]:
        assert sorted(t.name for t in (await s.list_tools()).tools) == sorted(TOOLS)
        added = await s.call_tool("add_memories", {"memories": [{"text": "Python says the dock code is TERN-3."}]})
        found = await s.call_tool("search_memories", {"query": "dock code", "k": 5, "threshold": -1})
        bad = await s.call_tool("search_memories", {"query": "dock code", "k": 0})
        return added.structuredContent["ids"][0], [h["id"] for h in found.structuredContent["data"]], bad

    async def stranger(s: ClientSession) -> str:
        return json.dumps((await s.call_tool("search_memories", {"query": "dock code", "k": 5, "threshold": -1})).model_dump())

    async def main() -> None:
        memory_id, found, bad = await session_of(server.owner, owner)
        assert memory_id in found
        theirs = await session_of(server.stranger, stranger)
        assert memory_id not in theirs and "TERN-3" not in theirs, theirs
        assert bad.isError and bad.content[0].text == _rest_error(server, query="dock code", k=0)  # type: ignore[attr-defined]

    asyncio.run(main())


def test_official_typescript_sdk_under_node(server: Target) -> None:
    node = shutil.which("node")
    assert node is not None, "node (20+) is needed: the README test command's system step installs it"
    if not (NODE_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        # NOTE: the lockfile's exact versions, from npm's cache when it has them (scripts/system_deps.sh runs this too).
        subprocess.run(["npm", "ci", "--prefer-offline", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True,
                       env={**os.environ, "npm_config_update_notifier": "false"}, timeout=300)
    out = subprocess.run([node, "flow.mjs", f"{server.base}/mcp", server.owner, server.stranger], cwd=NODE_DIR, check=True,
                         capture_output=True, text=True, timeout=120)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["server"]["name"] == "recallserve" and sorted(seen["tools"]) == sorted(TOOLS)
    assert seen["id"] in seen["mine"]
    assert seen["id"] not in seen["theirs"] and "GULL-12" not in seen["theirsText"], seen
    assert seen["bad"] == {"isError": True, "text": _rest_error(server, query="harbour code", k=0)}


def test_langchain_mcp_adapters_load_and_run_the_tools(server: Target) -> None:
    async def main() -> None:
        def client(key: str) -> MultiServerMCPClient:
            return MultiServerMCPClient({"recallserve": {"transport": "streamable_http", "url": f"{server.base}/mcp",
                                                         "headers": {"Authorization": f"Bearer {key}"}}})

        tools = {t.name: t for t in await client(server.owner).get_tools()}
        assert sorted(tools) == sorted(TOOLS)
        assert "query" in tools["search_memories"].args
        await tools["add_memories"].ainvoke({"memories": [{"text": "LangChain says the silo code is WREN-8."}]})
        mine = await tools["search_memories"].ainvoke({"query": "silo code", "k": 5, "threshold": -1})
        assert "WREN-8" in str(mine), mine
        theirs = {t.name: t for t in await client(server.stranger).get_tools()}
        found = await theirs["search_memories"].ainvoke({"query": "silo code", "k": 5, "threshold": -1})
        assert "WREN-8" not in str(found), found

    asyncio.run(main())


def test_the_blocking_client_against_the_server(server: Target) -> None:
    with RecallServe(server.base, server.owner) as rs:
        ids = rs.memories.add([{"text": "The sync client's kiln code is IBIS-4.", "source_id": "kiln"}]).ids
        assert rs.memories.search("kiln code", k=3).data[0].id == ids[0]
        assert rs.memories.list("kiln").data[0].text.endswith("IBIS-4.")
