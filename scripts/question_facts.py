"""Derive the key facts of the demo questions from the world data and write them into the sets.

    PYTHONPATH=$PWD python scripts/question_facts.py          # rewrite both files
    PYTHONPATH=$PWD python scripts/question_facts.py --check  # exit 1 when a file is stale

Look-up questions get their facts by running the expected tool's query on the world
(:class:`recallserve.serve.agent.demo.DemoWorld`): an order's status (plus its carrier when asked), a batch's
order count / ids / customers, its supplier, date or units, a customer's ticket ids, an
inventory range's net change, a calculation's result. Questions the tools cannot answer alone
(memory look-ups, manual questions, small talk, refusals) get hand-written facts in ``_HAND``
below; a fact quoting a ticket or manual section is checked against the world so that it cannot
drift from the data. Print-and-read: the script prints every question with its facts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from recallserve.serve.agent.demo.world import DemoWorld

_DIR = Path(__file__).resolve().parents[1] / "serve" / "agent" / "demo"
_FILES = ("questions.json", "questions_holdout.json")
_NOT_FOUND = ["not found", "couldn't find", "could not find", "cannot find", "can't find", "no order",
              "no batch", "doesn't exist", "does not exist", "no record", "unable to find", "not exist"]
_CANNOT = ["can't", "cannot", "can not", "isn't allowed", "not allowed", "not able", "unable", "not authorized",
           "not authorised", "don't have permission", "do not have permission"]
_ASK_ID = ["valid", "6-digit", "six-digit", "6 digit", "full order", "correct order", "check the order",
           "check it", "double-check"]
_GREET = ["hello", "hi", "hey", "good morning", "welcome"]
_TIME = r"re:\b\d{1,2}:\d{2}\b"
_DATE = r"re:(\b\d{4}-\d{2}-\d{2}\b|\b(january|february|march|april|may|june|july|august|september|october|november|december)\b)"
_WEEKDAY = r"re:\b(monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b"

#: Hand-written facts: question text -> (facts, must_not). Each ``("T-1080", "gasket")`` pair in
#: ``_TICKET_FIX`` below is checked against the ticket's resolution.
_HAND: dict[str, tuple[list[Any], list[str]]] = {
    # tuned: current time (the value changes per run: a time / date pattern)
    "What time is it now in Tokyo?": ([_TIME], []),
    "What is today's date?": ([_DATE], []),
    "What's the time in London right now?": ([_TIME], []),
    # tuned: memory search (ticket and its fix)
    "Search the knowledge base for anything about water leaking from the group head.": (["T-1080", "gasket"], []),
    "Search memory for past tickets about a weak steam wand.": (["T-1130", ["descal", "milk residue", "clean"]], []),
    # tuned: no tool
    "Hi there!": ([_GREET], []),
    "Thanks, that was really helpful.": ([["welcome", "glad", "happy", "pleasure"]], []),
    "Good morning! How are you today?": ([_GREET + ["good", "well", "fine", "great"]], []),
    "What is an espresso, in one sentence?": (["coffee", ["pressure", "pressurized", "pressurised", "forcing",
                                                           "forced", "concentrated"]], []),
    "Tell me a short joke about coffee.": ([["coffee", "espresso", "brew", "bean", "latte", "mug", "cup"]], []),
    "Is order 10423 delivered?": ([_ASK_ID], ["is delivered", "was delivered", "has been delivered"]),
    "Please cancel my order 104261.": ([_CANNOT], ["has been cancelled", "has been canceled", "was cancelled",
                                                   "is cancelled", "is now cancelled"]),
    "How long is the warranty on the BrewMaster?": ([["two years", "2 years", "2-year", "two-year", "24 months"]], []),
    "What does error E12 mean on my machine?": (["pump", ["air", "prim", "draw water"]], []),
    "Can you recommend a good coffee bean for espresso?": ([["arabica", "robusta", "roast", "blend"]], []),
    # holdout: current time
    "what time is it in Tokyo right now?": ([_TIME], []),
    "Sorry, quick one: what day of the week is it today?": ([_WEEKDAY], []),
    "Is our New York office still open? What's the time there at the moment?": ([_TIME], []),
    # holdout: memory search
    "Have any other customers reported water leaking from the group head? Please search the old tickets.":
        (["T-1080", "gasket"], []),
    "search the knowledge base for anything about a flickering display": (["T-1121", ["ribbon cable", "cable"]],
                                                                           ["TF-185"]),
    "did we ever see E12 pump problems on other units? look through past tickets for me":
        (["T-1071", ["prim", "air lock", "airlock"]], []),
    # holdout: no tool
    "hey there, good morning!": ([_GREET], []),
    "Thanks a lot, that fixed it. Have a nice day!": ([["welcome", "glad", "happy", "pleasure", "you too"]], []),
    "who are you and what kind of things can you help me with?": ([["order", "ticket", "batch", "inventory",
                                                                     "support", "customer"]], []),
    "What's the difference between a latte and a flat white?": (["milk", ["foam", "microfoam", "texture"]], []),
    "is arabica or robusta higher in caffeine?": (["robusta"], []),
    "my BrewMaster shows E07, what does that mean?": (["tank", ["not detected", "detect", "float"]], []),
    "How often am I supposed to descale the machine? We have hard water here.":
        ([["every month", "monthly", "once a month", "each month", "every 1 month"]], []),
    "how long is the warranty on your espresso machines?": ([["two years", "2 years", "2-year", "two-year",
                                                               "24 months"]], []),
    "Can you check order 10420 for me? It was a BrewMaster.": ([_ASK_ID], ["is delivered", "was delivered",
                                                                            "has shipped", "has been shipped"]),
    "Please cancel order 104246, the customer changed their mind.": ([_CANNOT], [
        "has been cancelled", "has been canceled", "was cancelled", "is cancelled", "is now cancelled"]),
    "i want a refund for order #104478 right now": ([_CANNOT + ["colleague", "pass your request"]], [
        "refund has been processed", "refund has been issued", "have processed your refund",
        "have issued", "has been refunded"]),
    "can you work out the total for me?": ([["which", "what", "numbers", "amounts", "prices", "values",
                                              "quantities", "provide", "details"]], []),
}
_TICKET_FIX = {"T-1080": "gasket", "T-1130": "descal", "T-1121": "ribbon cable", "T-1071": "prim"}
_MANUAL = {"warranty": ("7.1", "Two years"), "E12": ("2.1", "air in the pump"), "E07": ("2.1", "water tank not detected"),
           "descale": ("5.1", "every month")}


def _num(x: float) -> list[str]:
    """A number's acceptable spellings: as given, rounded to cents both ways, and, for a value given
    to 3 or more decimals (a rounded 67 / 3 = 22.333), any longer expansion of it (22.3333333333)."""
    given = f"{x:.6f}".rstrip("0").rstrip(".")
    out = [given]
    for v in (round(x, 2), math.floor(x * 100) / 100, math.ceil(x * 100) / 100):
        s = f"{v:.2f}".rstrip("0").rstrip(".")
        if s not in out:
            out.append(s)
    if "." in given and len(given.split(".")[1]) >= 3:
        out.append(r"re:\b" + re.escape(given) + r"\d*\b")
    return out


def _date(iso: str) -> list[str]:
    """A date as ISO or written out (``2025-01-20``, ``January 20, 2025``, ``20 January 2025``)."""
    d = dt.date.fromisoformat(iso)
    month = d.strftime("%B")
    return [iso, f"{month} {d.day}, {d.year}", f"{month} {d.day} {d.year}", f"{d.day} {month} {d.year}"]


def _supplier(world: DemoWorld, supplier_id: str) -> list[str]:
    """A supplier named either way: its id or its name without the legal form (``Kessler Thermo``)."""
    name = world.query("SELECT name FROM suppliers WHERE supplier_id = ?", (supplier_id,))[0]["name"]
    return [supplier_id, " ".join(name.split()[:2])]


def _lookup_facts(world: DemoWorld, q: dict[str, Any]) -> tuple[list[Any], list[str]]:
    """Facts of a look-up question from the expected tool's query on the world."""
    text, tool, args = q["q"].lower(), q["tool"], q.get("args") or {}
    if tool == "order_status":
        rows = world.query("SELECT * FROM orders WHERE order_id = ?", (args["order_id"],))
        if not rows:
            return [_NOT_FOUND], ["delivered", "shipped", "processing"]
        o = rows[0]
        facts: list[Any] = [o["status"]]
        if "carrier" in text or "tracking" in text:
            facts.append(o["carrier"])
        return facts, []
    if tool == "orders_by_batch":
        rows = world.query("SELECT * FROM orders WHERE batch = ? ORDER BY order_id", (args["batch"],))
        if "how many" in text:
            return [str(len(rows))], []
        if "not delivered" in text:
            return [r["order_id"] for r in rows if r["status"] != "delivered"], []
        if "customer" in text:
            return sorted({r["customer_id"] for r in rows}), []
        return [r["order_id"] for r in rows], []
    if tool == "batch_info":
        rows = world.query("SELECT * FROM batches WHERE batch = ?", (args["batch"],))
        if not rows:
            return [_NOT_FOUND], []
        b = rows[0]
        facts = []
        if "heater" in text:
            facts.append(_supplier(world, b["heater_supplier"]))
        if "when" in text or "date" in text:
            facts.append(_date(b["produced"]))
        if "units" in text:
            facts.append(str(b["units"]))
        if "suppliers" in text:
            facts += [_supplier(world, b[k]) for k in ("heater_supplier", "pump_supplier", "display_supplier")]
        return facts, []
    if tool == "ticket_history":
        rows = world.query("SELECT ticket_id FROM tickets WHERE customer_id = ? ORDER BY opened", (args["customer_id"],))
        if not rows:
            return [["no tickets", "no ticket", "no support", "no past", "no previous", "no record", "not found",
                     "no complaints", "hasn't contacted", "has not contacted", "no history"]], []
        return [r["ticket_id"] for r in rows], []
    if tool == "inventory_changes":
        sql, params = "SELECT delta FROM inventory_changes WHERE date BETWEEN ? AND ?", [args["start_date"], args["end_date"]]
        if args.get("sku"):
            sql += " AND sku = ?"
            params.append(args["sku"])
        net = sum(r["delta"] for r in world.query(sql, tuple(params)))
        return [str(abs(net))], []
    if tool == "calculator":
        return [_num(float(q["result"]))], []
    raise KeyError(f"no hand-written facts and no rule for tool {tool!r}: {q['q']!r}")


def _check_hand(world: DemoWorld) -> None:
    for tid, word in _TICKET_FIX.items():
        rows = world.query("SELECT resolution FROM tickets WHERE ticket_id = ?", (tid,))
        assert rows and word in rows[0]["resolution"].lower(), (tid, word)
    sections = {m["section"]: m["text"] for m in world.data["manual"]}
    for what, (section, phrase) in _MANUAL.items():
        assert phrase.lower() in sections[section].lower(), (what, section, phrase)


def _render(questions: list[dict[str, Any]]) -> str:
    return "[\n" + ",\n".join(json.dumps(q, ensure_ascii=False) for q in questions) + "\n]\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="only check that the files are up to date")
    a = p.parse_args(argv)
    world = DemoWorld()
    _check_hand(world)
    stale = False
    for name in _FILES:
        path = _DIR / name
        questions = json.loads(path.read_text(encoding="utf-8"))
        for q in questions:
            facts, must_not = _HAND[q["q"]] if q["q"] in _HAND else _lookup_facts(world, q)
            q["facts"] = facts
            if must_not:
                q["must_not"] = must_not
            else:
                q.pop("must_not", None)
            print(f"{name[:-5]:>18} | {q['q'][:70]:70} | {q['tool'] or '-':17} | facts={facts} must_not={must_not}")
        text = _render(questions)
        if text != path.read_text(encoding="utf-8"):
            stale = True
            if not a.check:
                path.write_text(text, encoding="utf-8")
    if a.check and stale:
        print("stale: run scripts/question_facts.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
