"""Tool registry, scopes, validators, calculator, clock, HTTP tools from config."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import Field, ValidationError

from recallserve.kernels import StrictModel
from recallserve.serve.agent import (
    HttpToolConfig,
    Tool,
    ToolArgsError,
    ToolContext,
    ToolRegistry,
    builtin_tools,
    default_registry,
    safe_eval,
)
from recallserve.serve.agent.demo import DEMO_SCOPES

CTX = ToolContext(tenant="t1", scopes=frozenset(DEMO_SCOPES))


@pytest.mark.parametrize(("expr", "want"), [
    ("(12.5 + 7.5) * 3 / 4", 15.0), ("17% * 449", 76.33), ("2^10", 1024), ("1,200 * 3", 3600),
    ("sqrt(16) + abs(-2)", 6.0), ("(12+35+20)/3", 22.333333333333332), ("-3 + +5", 2), ("10 // 3", 3),
])
def test_calculator_evaluates_arithmetic(expr: str, want: float) -> None:
    assert safe_eval(expr) == pytest.approx(want)


@pytest.mark.parametrize(("expr", "msg"), [
    ("__import__('os').system('id')", "not allowed"), ("(1).__class__", "not allowed"), ("2**100000", "exponent"),
    ("1/0", "division by zero"), ("10**99 * 10**99", "out of range"), ("lambda: 1", "not allowed"), ("2 +", "not valid"),
    ("open('x')", "not allowed"),
])
def test_calculator_rejects_non_arithmetic(expr: str, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        safe_eval(expr)


def test_registry_scopes_and_least_privilege() -> None:
    reg = default_registry()
    assert set(reg.for_scopes(["basic"])) == {"calculator", "current_time"}
    demo = reg.for_scopes(DEMO_SCOPES)
    assert "cancel_order" not in demo and "order_status" in demo
    assert "cancel_order" in reg.for_scopes(DEMO_SCOPES + ["orders:write"])
    assert list(demo) == sorted(demo)  # stable order -> stable prompt prefix
    assert set(demo.subset(["order_status", "cancel_order", "nope"])) == {"order_status"}  # never widens


def test_tool_definitions_are_checked() -> None:
    class A(StrictModel):
        x: int = Field(description="x")

    with pytest.raises(ValueError, match="must match"):
        Tool("Bad Name", "d", A, lambda a, c: 1, "basic")
    with pytest.raises(ValueError, match="':write' scope"):
        Tool("wipe", "d", A, lambda a, c: 1, "orders:read", destructive=True)
    reg = ToolRegistry(builtin_tools())
    with pytest.raises(ValueError, match="already registered"):
        reg.register(builtin_tools()[0])


def test_validation_errors_name_the_field() -> None:
    reg = default_registry()
    inv = reg.get("inventory_changes")
    with pytest.raises(ToolArgsError, match="end_date: range of 181 days"):
        inv.validate({"start_date": "2025-01-01", "end_date": "2025-07-01"})
    with pytest.raises(ToolArgsError, match="end_date: 2025-01-01 is before"):
        inv.validate({"start_date": "2025-02-01", "end_date": "2025-01-01"})
    with pytest.raises(ToolArgsError, match="sku: 'XX-1' is not one of"):
        inv.validate({"start_date": "2025-01-01", "end_date": "2025-01-31", "sku": "XX-1"})
    with pytest.raises(ToolArgsError, match="order_id: String should match pattern"):
        reg.get("order_status").validate({"order_id": "12345"})
    with pytest.raises(ToolArgsError, match="extra: Extra inputs are not permitted"):
        reg.get("order_status").validate({"order_id": "123456", "extra": 1})


def test_signature_and_schema_for_the_prompt() -> None:
    t = default_registry().get("order_status")
    assert t.signature().startswith("order_status(order_id: string (format ^\\d{6}$; 6-digit order id))")
    assert t.args_schema["properties"]["order_id"]["pattern"] == "^\\d{6}$"
    assert "title" not in json.dumps(t.args_schema)


def test_clock_returns_now_in_a_whitelisted_zone() -> None:
    t = default_registry().get("current_time")
    out = asyncio.run(t.invoke(t.validate({"timezone": "Asia/Tokyo"}), CTX))
    assert out["timezone"] == "Asia/Tokyo" and out["datetime"].endswith("+09:00")
    with pytest.raises(ToolArgsError, match="timezone"):
        t.validate({"timezone": "Mars/Olympus"})


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"path": self.path, "carrier": "DHL"}).encode()
        code = 404 if "000000" in self.path else 200
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_tool_from_config(http_server: str) -> None:
    cfg = HttpToolConfig(
        name="shipment_tracking", description="Carrier tracking of an order.", method="GET",
        url_template=http_server + "/track/{order_id}",
        params={"order_id": {"type": "string", "pattern": r"^\d{6}$", "description": "6-digit order id"},
                "lang": {"type": "string", "enum": ["en", "de"], "required": False}},
        scope="orders:read",
    )
    reg = default_registry(demo=False, http_tools=[cfg])
    tool = reg.get("shipment_tracking")
    out = asyncio.run(tool.invoke(tool.validate({"order_id": "104208", "lang": "de"}), CTX))
    assert out == {"path": "/track/104208?lang=de", "carrier": "DHL"}
    with pytest.raises(ToolArgsError, match="order_id"):
        tool.validate({"order_id": "../admin"})
    with pytest.raises(ToolArgsError, match="lang"):
        tool.validate({"order_id": "104208", "lang": "fr"})
    from recallserve.serve.agent.tools import ToolError

    with pytest.raises(ToolError, match="HTTP 404"):
        asyncio.run(tool.invoke(tool.validate({"order_id": "000000"}), CTX))


def test_http_tool_config_errors_name_the_field() -> None:
    with pytest.raises(ValidationError, match="placeholders \\['id'\\] are not in params"):
        HttpToolConfig(name="x_tool", description="d", url_template="https://h/{id}", scope="basic")
    with pytest.raises(ValidationError, match="must be declared destructive"):
        HttpToolConfig(name="x_tool", description="d", method="POST", url_template="https://h/x", scope="basic:write")
