"""The demo customer-service world: orders, batches, suppliers, tickets, inventory, a manual.

``world.json`` (shipped in the package) is loaded into an in-memory SQLite database; the demo
tools run real SQL against it. Everything here is invented for the project (no real company).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from importlib import resources
from typing import Any

from recallserve.serve.memory import MemoryWrite

__all__ = ["DemoWorld", "load_world_data"]

_SCHEMA = """
CREATE TABLE suppliers (supplier_id TEXT PRIMARY KEY, name TEXT NOT NULL, supplies TEXT NOT NULL);
CREATE TABLE batches (batch TEXT PRIMARY KEY, sku TEXT NOT NULL, produced TEXT NOT NULL, units INTEGER NOT NULL,
    heater_supplier TEXT, pump_supplier TEXT, display_supplier TEXT, note TEXT);
CREATE TABLE orders (order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, sku TEXT NOT NULL,
    batch TEXT NOT NULL REFERENCES batches(batch), qty INTEGER NOT NULL, unit_price REAL NOT NULL,
    total REAL NOT NULL, ordered_on TEXT NOT NULL, status TEXT NOT NULL, carrier TEXT NOT NULL);
CREATE TABLE tickets (ticket_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, order_id TEXT, batch TEXT,
    opened TEXT NOT NULL, status TEXT NOT NULL, problem TEXT NOT NULL, photo_description TEXT, resolution TEXT);
CREATE TABLE inventory_changes (id INTEGER PRIMARY KEY AUTOINCREMENT, date TEXT NOT NULL, sku TEXT NOT NULL,
    delta INTEGER NOT NULL, reason TEXT NOT NULL);
CREATE INDEX orders_batch ON orders(batch);
CREATE INDEX tickets_customer ON tickets(customer_id);
CREATE INDEX inventory_date ON inventory_changes(date);
"""


def load_world_data() -> dict[str, Any]:
    """The raw world (``serve/agent/demo/world.json``)."""
    return json.loads(resources.files("recallserve.serve.agent.demo").joinpath("world.json").read_text(encoding="utf-8"))


class DemoWorld:
    """An in-memory SQLite copy of the world; thread-safe (tools run in worker threads)."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.data = data or load_world_data()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._db.executescript(_SCHEMA)
            for table in ("suppliers", "batches", "orders", "tickets", "inventory_changes"):
                rows = self.data[table]
                cols = list(rows[0])
                sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
                self._db.executemany(sql, [tuple(r[c] for c in cols) for r in rows])
            self._db.commit()
        self.models: dict[str, str] = self.data["product"]["sku_models"]

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Rows of a parameterised read query as dicts."""
        with self._lock:
            return [dict(r) for r in self._db.execute(sql, params).fetchall()]

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        """Run a parameterised write; returns the changed row count."""
        with self._lock:
            cur = self._db.execute(sql, params)
            self._db.commit()
            return cur.rowcount

    def skus(self) -> list[str]:
        """Known SKUs."""
        return sorted(self.models)

    def memories(self) -> list[MemoryWrite]:
        """The manual sections and past tickets as memory units.

        A ticket reads ``Ticket <id> (<model>, batch <b>, opened <date>). Fault: <problem> Fix:
        <resolution> (customer <c>, order <o>) <photo description>``: each fault with its own fix.
        """
        out: list[MemoryWrite] = []
        company = self.data["company"]
        for sec in self.data["manual"]:
            out.append(MemoryWrite(
                text=f"{company} BrewMaster manual section {sec['section']} '{sec['title']}': {sec['text']}",
                kind="text", source_id=f"manual:{sec['section']}", topic="manual",
                metadata={"section": sec["section"], "title": sec["title"]},
            ))
        for t in self.data["tickets"]:
            model = self.models.get(next((o["sku"] for o in self.data["orders"] if o["order_id"] == t["order_id"]), ""), "")
            photo = f" {t['photo_description']}" if t["photo_description"] else ""
            # NOTE: fault and fix next to each other, the photo last: the prompt cuts a memory at
            # RecallConfig.item_chars, and measured on the demo, the fix of a ticket whose photo came
            # first was cut off (T-1042), so the 1.5B model took the fix from another ticket.
            out.append(MemoryWrite(
                text=(f"Ticket {t['ticket_id']} ({model}, batch {t['batch']}, opened {t['opened']}). "
                      f"Fault: {t['problem']} Fix: {t['resolution']} "
                      f"(customer {t['customer_id']}, order {t['order_id']}){photo}"),
                kind="text", source_id=f"ticket:{t['ticket_id']}", topic="tickets",
                metadata={"ticket_id": t["ticket_id"], "customer_id": t["customer_id"], "batch": t["batch"],
                          "has_photo": bool(t["photo_description"])},
            ))
        return out
