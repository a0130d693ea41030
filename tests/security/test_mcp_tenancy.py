"""The cross-tenant probes of ``test_tenancy.py``, through the MCP tools at ``/mcp``.

Each MCP tool is a REST route called in process with the caller's key (``serve.mcp``); these
probes show that holds end to end: acme's data written through MCP is there for acme, and globex's
answer about it, through MCP, is its answer about data that does not exist. A tool without a
probe here fails :func:`test_every_mcp_tool_has_a_cross_tenant_probe` by name.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from recallserve.serve.mcp import TOOLS
from tests.security.conftest import A, B, Rig
from tests.security.test_tenancy import FRESH_MEMORY, MODEL, SECRET, _experience
from tests.unit.edge.conftest import headers

PROBES: dict[str, Callable[[Rig], None]] = {}
_ids = itertools.count(1)


def probe(tool: str) -> Callable[[Callable[[Rig], None]], Callable[[Rig], None]]:
    def register(fn: Callable[[Rig], None]) -> Callable[[Rig], None]:
        PROBES[tool] = fn
        return fn
    return register


def call(rig: Rig, tenant: str, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    """(isError, structured result or the error text) of one ``tools/call`` by ``tenant``'s key.

    NOTE: one JSON-RPC POST, as any streamable-HTTP client sends it; the official clients' flows
    are tests/unit/test_mcp.py (in process) and tests/integration/test_mcp_clients.py (a server).
    """
    r = rig.client.post("/mcp", headers={**headers(tenant), "accept": "application/json, text/event-stream"},
                        json={"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call",
                              "params": {"name": tool, "arguments": arguments}})
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    if result.get("isError"):
        return True, result["content"][0]["text"]
    return False, result["structuredContent"]


def _memory(rig: Rig, tenant: str, text: str = SECRET, source_id: str = "doc:1") -> str:
    error, out = call(rig, tenant, "add_memories", {"memories": [{"text": text, "source_id": source_id}]})
    assert not error, out
    return out["ids"][0]


@probe("add_memories")
def _add(rig: Rig) -> None:
    mine = _memory(rig, A)
    theirs = _memory(rig, B, "globex overwrite attempt")  # NOTE: the same dedup key
    assert theirs != mine
    assert call(rig, A, "get_memory", {"memory_id": mine})[1]["text"] == SECRET
    error, got = call(rig, A, "list_memories", {"source_id": "doc:1"})
    assert not error and [m["text"] for m in got["data"]] == [SECRET], got


@probe("search_memories")
def _search(rig: Rig) -> None:
    mine = _memory(rig, A)
    body = {"query": SECRET, "threshold": -1, "k": 50}
    assert mine in [h["id"] for h in call(rig, A, "search_memories", body)[1]["data"]]
    error, theirs = call(rig, B, "search_memories", body)
    assert not error and "PELICAN" not in json.dumps(theirs) and mine not in json.dumps(theirs), theirs


@probe("get_memory")
def _get(rig: Rig) -> None:
    mine = _memory(rig, A)
    assert call(rig, A, "get_memory", {"memory_id": mine})[1]["text"] == SECRET
    theirs = call(rig, B, "get_memory", {"memory_id": mine})
    nobody = call(rig, B, "get_memory", {"memory_id": FRESH_MEMORY})
    assert theirs[0] and theirs[1].replace(mine, "<id>") == nobody[1].replace(FRESH_MEMORY, "<id>"), (theirs, nobody)


@probe("list_memories")
def _list(rig: Rig) -> None:
    _memory(rig, A)
    assert call(rig, A, "list_memories", {"source_id": "doc:1"})[1]["data"]
    assert call(rig, B, "list_memories", {"source_id": "doc:1"}) == (False, {"object": "list", "data": []})


@probe("delete_memory")
def _delete(rig: Rig) -> None:
    mine = _memory(rig, A)
    theirs = call(rig, B, "delete_memory", {"memory_id": mine})
    nobody = call(rig, B, "delete_memory", {"memory_id": FRESH_MEMORY})
    assert theirs[0] and theirs[1].replace(mine, "<id>") == nobody[1].replace(FRESH_MEMORY, "<id>"), (theirs, nobody)
    assert call(rig, A, "get_memory", {"memory_id": mine})[1]["text"] == SECRET


@probe("search_experiences")
def _search_experiences(rig: Rig) -> None:
    mine = _experience(rig, A, answer="80 km/h")
    body = {"query": SECRET, "source_model": MODEL, "k": 50, "archival_k": 50, "topic_prefix": "physics"}
    assert mine in json.dumps(call(rig, A, "search_experiences", body)[1])
    assert call(rig, B, "search_experiences", body) == (False, {"hits": [], "archival": [], "conflicts": []})


@probe("ask")
def _ask(rig: Rig) -> None:
    _memory(rig, A)
    rig.engine.calls.clear()
    error, answer = call(rig, B, "ask", {"question": "What is acme's vault code word?"})
    assert not error and answer["answer"], answer
    # NOTE: the prompt the engine received for globex's turn holds nothing of acme's memory.
    assert rig.prompts() and not any("PELICAN" in p for p in rig.prompts()), rig.prompts()
    rig.engine.calls.clear()
    assert not call(rig, A, "ask", {"question": "What is the vault code word?"})[0]
    assert any("PELICAN" in p for p in rig.prompts()), rig.prompts()


def test_every_mcp_tool_has_a_cross_tenant_probe() -> None:
    assert sorted(set(TOOLS) - set(PROBES)) == []


@pytest.mark.parametrize("tool", sorted(PROBES))
def test_second_tenant_learns_nothing_through_mcp(rig: Rig, tool: str) -> None:
    PROBES[tool](rig)
