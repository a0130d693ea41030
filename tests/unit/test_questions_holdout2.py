"""The session-3 held-out question sets (``compound_holdout2``, ``zh-holdout2``; the third pair ``compound_holdout3``,
``zh-holdout3``) against the demo world.

Each expected call passes the tool's own validation and names an order, batch or customer the world has;
each key fact a look-up gives is what the tool's query on the world returns (status, carrier, a batch's
orders / customers / count, a supplier, a date, units, a customer's tickets, an inventory net change); a
history fact is in the ticket its note names, and a fault the note calls absent is in no ticket or manual
section. These sets were written without the rules; this test checks the data, not how the agent routes.
Every check is generic over a set's questions: a new set is checked by adding it to ``_SETS``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from recallserve.deployments.cli._eval_agent import add_parser
from recallserve.serve.agent import default_registry
from recallserve.serve.agent.demo import DemoWorld, load_questions
from recallserve.serve.agent.demo.questions import QUESTION_SETS

_SETS = {"compound_holdout2": 12, "zh-holdout2": 16, "compound_holdout3": 12, "zh-holdout3": 16,
         "compound_holdout4": 16, "zh-holdout4": 20, "compound_holdout5": 16, "zh-holdout5": 20,
         "compound_holdout6": 16, "zh-holdout6": 20, "zh-holdout7": 20, "compound_holdout7": 16,
         "zh-holdout8": 20, "compound_holdout8": 16, "zh-holdout9": 20, "compound_holdout9": 16,
         "zh-holdout10": 20, "compound_holdout10": 16, "zh-holdout11": 20,
         "compound_holdout11": 16, "zh-holdout12": 20, "compound_holdout12": 16, "zh-holdout13": 20}
_LOT = r"(?<![A-Za-z0-9-])L-\d{4}(?![0-9])"
_STATUSES = ("processing", "shipped", "delivered", "returned", "cancelled")
# NOTE: ASCII edges, not \b: an id touches Chinese text ("订单104373送到了没有"), and Han characters are \w.
_EDGE, _END = r"(?<![A-Za-z0-9-])", r"(?![0-9])"
_ORDER, _BATCH, _CUSTOMER, _TICKET, _SUPPLIER = (_EDGE + p + _END for p in (r"\d{6}", r"B-\d{4}", r"C-\d{4}", r"T-\d{4}",
                                                                              r"S-\d{2}"))

WORLD = DemoWorld()


def _alts(fact: str | list[str]) -> list[str]:
    return [fact] if isinstance(fact, str) else fact


def _found(pattern: str, facts: list[Any]) -> set[str]:
    return {m for f in facts for a in _alts(f) for m in re.findall(pattern, a)}


def _orders(batch: str) -> list[dict[str, Any]]:
    return WORLD.query("SELECT * FROM orders WHERE batch = ? ORDER BY order_id", (batch,))


def _order(order_id: str) -> dict[str, Any]:
    rows = WORLD.query("SELECT * FROM orders WHERE order_id = ?", (order_id,))
    assert rows, f"order {order_id} is not in the world"
    return rows[0]


def _numbers(facts: list[Any]) -> set[int]:
    return {int(a.replace(",", "")) for f in facts for a in _alts(f) if re.fullmatch(r"\d{1,5}", a)}


def _world_text() -> str:
    tickets = " ".join(f"{t['problem']} {t['resolution']} {t['photo_description'] or ''}" for t in WORLD.data["tickets"])
    return (tickets + " " + " ".join(s["text"] for s in WORLD.data["manual"])).lower()


@pytest.mark.parametrize("name", sorted(_SETS))
def test_heldout_question_sets_load_and_the_cli_offers_them(name: str) -> None:
    import argparse

    assert name in QUESTION_SETS
    assert len(load_questions(name)) == _SETS[name]
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert parser.parse_args(["agent", "--questions", name]).questions == name


def _cases() -> list[tuple[str, int, dict[str, Any]]]:
    return [(name, i, q) for name in sorted(_SETS) for i, q in enumerate(load_questions(name), 1)]


@pytest.mark.parametrize(("name", "n", "q"), _cases(), ids=[f"{name}-{n}" for name, n, _ in _cases()])
def test_heldout_question_matches_the_world(name: str, n: int, q: dict[str, Any]) -> None:
    facts, must_not, args = q["facts"], q.get("must_not", []), q.get("args") or {}
    text = re.sub(r"(?<=\d) (?=\d)", "", q["q"])  # an id typed in groups ("104 246")
    tool = q["tool"]
    registry = default_registry()
    if tool is not None:
        assert tool in registry.names()
        if tool == "calculator":
            assert any(re.fullmatch(r"[\d.]+", a) and abs(float(a) - q["result"]) < 0.01 for f in facts for a in _alts(f))
        elif tool == "memory_search":
            if q.get("args_contain"):  # NOTE: without args_contain any query will do
                registry.get(tool).validate({"query": q["args_contain"]["query"]})
                assert q["args_contain"]["query"] in text
        else:
            registry.get(tool).validate(dict(args))
    # every order, batch and customer id the question or its facts name exists in the world
    for oid in _found(_ORDER, [text, *facts, *must_not]):
        _order(oid)
    for b in _found(_BATCH, [text]):
        assert WORLD.query("SELECT 1 FROM batches WHERE batch = ?", (b,)), b
    for c in _found(_CUSTOMER, [text, *facts]):
        assert WORLD.query("SELECT 1 FROM orders WHERE customer_id = ?", (c,)), c
    for t in _found(_TICKET, [*facts, q.get("note") or ""]):
        assert WORLD.query("SELECT 1 FROM tickets WHERE ticket_id = ?", (t,)), t

    if tool == "order_status":
        # the asked order's status (and carrier when a fact names one); a second order in the text likewise
        for oid in _found(_ORDER, [text]):
            o = _order(oid)
            assert any(o["status"] in _alts(f) for f in facts), (oid, o["status"])
        carriers = {a for f in facts for a in _alts(f)} & {"DHL", "DPD", "UPS"}
        assert carriers <= {_order(args["order_id"])["carrier"]}
    if tool != "orders_by_batch":
        # a status a fact states is the status of an order the question names (whatever the first tool), and
        # then every order the question names has its status stated
        stated = {s for f in facts for a in _alts(f) for s in _STATUSES if a == s}
        assert stated <= {_order(o)["status"] for o in _found(_ORDER, [text])}
        if stated:
            for oid in _found(_ORDER, [text]):
                assert any(_order(oid)["status"] in _alts(f) for f in facts), (oid, _order(oid)["status"])
    if tool == "orders_by_batch":
        rows = _orders(args["batch"])
        ids = {r["order_id"] for r in rows}
        listed, barred = _found(_ORDER, facts), _found(_ORDER, must_not)
        assert listed | barred <= ids and not listed & barred
        if listed:
            statuses = {r["status"] for r in rows if r["order_id"] in listed}
            if args.get("status") == "not_delivered":
                assert listed == {r["order_id"] for r in rows if r["status"] in ("processing", "shipped")}
            # the listed orders are all the batch's orders of their status(es), the barred ones the rest
            assert listed == {r["order_id"] for r in rows if r["status"] in statuses}
            assert barred <= ids - listed
        customers = _found(_CUSTOMER, facts)
        if customers:  # the batch's customers, or those of the orders a status filter lists
            assert customers in ({r["customer_id"] for r in rows},
                                 {r["customer_id"] for r in rows if r["order_id"] in listed})
        for count in _numbers(facts):
            assert count in (len(rows), len(listed)), count
    # a supplier fact: one of the asked batch's suppliers, named by id or by its name
    batches = WORLD.query(f"SELECT * FROM batches WHERE batch IN ({','.join('?' * len(_found(_BATCH, [text])))})",
                          tuple(_found(_BATCH, [text])))
    suppliers = {b[k] for b in batches for k in ("heater_supplier", "pump_supplier", "display_supplier")}
    assert _found(_SUPPLIER, facts) <= suppliers
    for f in facts:
        for a in _alts(f):
            if re.fullmatch(r"S-\d{2}", a):
                name = WORLD.query("SELECT name FROM suppliers WHERE supplier_id = ?", (a,))[0]["name"]
                assert all(x == a or x in name or not x.isascii() for x in _alts(f)), f  # 深圳: the name in Chinese
    if tool == "batch_info":
        b = WORLD.query("SELECT * FROM batches WHERE batch = ?", (args["batch"],))[0]
        for d in _found(r"(?<![0-9])\d{4}-\d{2}-\d{2}(?![0-9])", facts):
            assert d == b["produced"]
        assert _numbers(facts) <= {b["units"]}
    if tool == "ticket_history":
        want = {r["ticket_id"] for r in WORLD.query("SELECT ticket_id FROM tickets WHERE customer_id = ?",
                                                    (args["customer_id"],))}
        assert _found(_TICKET, facts) == want
    if tool == "inventory_changes":
        sql = "SELECT delta FROM inventory_changes WHERE date BETWEEN ? AND ?"
        params = (args["start_date"], args["end_date"])
        if args.get("sku"):
            sql, params = sql + " AND sku = ?", (*params, args["sku"])
        rows = WORLD.query(sql, params)
        net = abs(sum(r["delta"] for r in rows))
        # the net change, and any single movement of the range the question asks about
        assert net in _numbers(facts) and _numbers(facts) <= {net} | {abs(r["delta"]) for r in rows}
    # a customer named in the question: the ticket facts are that customer's tickets
    for c in _found(_CUSTOMER, [text]):
        if _found(_TICKET, facts):
            want = {r["ticket_id"] for r in WORLD.query("SELECT ticket_id FROM tickets WHERE customer_id = ?", (c,))}
            assert _found(_TICKET, facts) == want
    note = q.get("note") or ""
    # history: each fault/fix fact (an alternative in English) is in the text of a ticket the note names
    if note.startswith("history"):
        tickets = WORLD.query(f"SELECT problem, resolution FROM tickets WHERE ticket_id IN "
                              f"({','.join('?' * len(_found(_TICKET, [note])))})", tuple(_found(_TICKET, [note])))
        source = " ".join(f"{t['problem']} {t['resolution']}" for t in tickets).lower()
        # the fault / fix facts: not an id (a supplier's too), a status or a count (those come from the look-up)
        plain = [f for f in facts if not (_found(_ORDER, [f]) or _found(_CUSTOMER, [f]) or _found(_TICKET, [f])
                                          or _found(_SUPPLIER, [f])
                                          or any(a in _STATUSES for a in _alts(f))
                                          or all(re.fullmatch(r"\d{1,5}", a) for a in _alts(f))
                                          or _found(r"(?<![0-9])\d{4}-\d{2}-\d{2}(?![0-9])", [f])  # a date: looked up
                                          or all(re.fullmatch(r"\d[\d,. ]*", a) for a in _alts(f))  # 1,500 units
                                          or _found(_LOT, [f]))]  # a batch's fuse lot
        assert plain, q
        for f in plain:
            assert any(a.lower() in source for a in _alts(f)), f
    # a true absence: the fault is in no ticket or manual section, and no claim of absence is barred
    m = re.match(r"absent: ([^(]+?)\s*(?:\(|$)", note)
    if m:  # the fault's words, as words ("hot" is in "photo")
        assert not re.search(rf"\b{re.escape(m.group(1).lower())}\b", _world_text()), m.group(1)
        assert not must_not
    elif must_not and tool is not None and not _found(_ORDER, must_not) and not _found(_LOT, must_not):
        # claims of absence are barred only where the world has the history (T-ids in the note or facts);
        # a request the agent must decline (no tool) may bar the claim that it was done
        assert _found(_TICKET, [note, *facts])


def test_heldout_questions_are_new() -> None:
    # each held-out set shares no question with any other set (the tuned ones, the earlier held-out ones)
    for name, size in _SETS.items():
        mine = {q["q"] for q in load_questions(name)}
        assert len(mine) == size
        others = {q["q"] for s, files in QUESTION_SETS.items() if QUESTION_SETS[name][0] not in files
                  for q in load_questions(s)}
        shared = sorted(mine & others)  # NOTE: only the shared texts in the message, not the other sets' questions
        assert not shared, (name, shared)
