"""The written problem set of ``recallserve eval experiences``: rules, problems and seed experiences.

24 problems in three domains (8 arithmetic, 8 unit, 8 rule questions), each with its expected
answer; 5 registered rules; and 8 seed experiences, worked traces of *similar* problems (other
numbers), which the "with experiences" condition puts in the active cache before the run.
Kept as Python data so it ships inside the package without package-data configuration.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RULES", "PROBLEMS", "SEEDS"]

RULES: list[dict[str, Any]] = [
    {"id": "OT-1", "domain": "rules", "variables": ["rate", "hours"],
     "description": "weekly pay: first 40 hours at the hourly rate, hours above 40 at 1.5 times the rate",
     "expression": "rate*min(hours, 40) + 1.5*rate*max(0, hours - 40)"},
    {"id": "SHIP-1", "domain": "rules", "variables": ["total", "weight"],
     "description": "shipping fee: 5 plus 2 per kg above 1 kg; free when the order total is at least 100",
     "expression": "0 if total >= 100 else 5 + 2*max(0, weight - 1)"},
    {"id": "LATE-1", "domain": "rules", "variables": ["balance", "months"],
     "description": "late fee: 2% of the balance per full month late, at most 10% of the balance",
     "expression": "balance*min(0.02*months, 0.10)"},
    {"id": "DISC-1", "domain": "rules", "variables": ["qty", "price"],
     "description": "order cost: qty times price, 10% off the whole order when qty is 10 or more",
     "expression": "qty*price*(0.9 if qty >= 10 else 1)"},
    {"id": "SPEED-URBAN", "domain": "rules", "variables": ["speed"],
     "description": "in town a vehicle complies when its speed is at most 50 km/h",
     "expression": "speed <= 50"},
]

# expected: a number (compared with 1% tolerance) or a word (yes/no).
PROBLEMS: list[dict[str, Any]] = [
    {"id": "a1", "domain": "arithmetic", "topic": "math/arithmetic", "expected": 51,
     "question": "Pens cost 3 each. How much do 17 pens cost?"},
    {"id": "a2", "domain": "arithmetic", "topic": "math/percent", "expected": 36,
     "question": "What is 15% of 240?"},
    {"id": "a3", "domain": "arithmetic", "topic": "math/percent", "expected": 15,
     "question": "A price rises from 80 to 92. By what percentage did it increase?"},
    {"id": "a4", "domain": "arithmetic", "topic": "math/equations", "expected": 6,
     "question": "Solve for x: 3x + 7 = 25."},
    {"id": "a5", "domain": "arithmetic", "topic": "math/arithmetic", "expected": 12.5,
     "question": "What is the average of 4, 8, 15 and 23?"},
    {"id": "a6", "domain": "arithmetic", "topic": "math/percent", "expected": 84,
     "question": "A tank holds 240 liters and is 35% full. How many liters are in it?"},
    {"id": "a7", "domain": "arithmetic", "topic": "math/arithmetic", "expected": 720,
     "question": "Split 1440 among three people in the ratio 1:2:3. How much is the largest share?"},
    {"id": "a8", "domain": "arithmetic", "topic": "math/equations", "expected": 4,
     "question": "Solve for y: 5y - 9 = 11."},
    {"id": "u1", "domain": "units", "topic": "physics/speed", "expected": 60,
     "question": "A car travels 150 km in 2.5 hours. What is its average speed in km/h?"},
    {"id": "u2", "domain": "units", "topic": "physics/conversion", "expected": 20,
     "question": "Convert 72 km/h to m/s."},
    {"id": "u3", "domain": "units", "topic": "physics/speed", "expected": 12,
     "question": "A runner covers 5 km in 25 minutes. What is the speed in km/h?"},
    {"id": "u4", "domain": "units", "topic": "physics/energy", "expected": 4.5,
     "question": "A 1500 W heater runs for 3 hours. How much energy does it use in kWh?"},
    {"id": "u5", "domain": "units", "topic": "physics/conversion", "expected": 9000,
     "question": "How many seconds are there in 2.5 hours?"},
    {"id": "u6", "domain": "units", "topic": "physics/energy", "expected": 36,
     "question": "A force of 12 N moves an object 3 m. How much work is done in joules?"},
    {"id": "u7", "domain": "units", "topic": "physics/force", "expected": 10,
     "question": "A 4 kg box accelerates at 2.5 m/s^2. What is the net force in newtons?"},
    {"id": "u8", "domain": "units", "topic": "physics/conversion", "expected": 15,
     "question": "A car uses 6 L of fuel per 100 km. How many liters does it use for 250 km?"},
    {"id": "r1", "domain": "rules", "topic": "rules/pay", "expected": 1078,
     "question": "A worker earns 22 per hour and works 46 hours this week. What is the weekly pay under OT-1?"},
    {"id": "r2", "domain": "rules", "topic": "rules/pay", "expected": 684,
     "question": "A worker earns 18 per hour and works 38 hours this week. What is the weekly pay under OT-1?"},
    {"id": "r3", "domain": "rules", "topic": "rules/shipping", "expected": 10,
     "question": "An order totals 64 and weighs 3.5 kg. What is the shipping fee under SHIP-1?"},
    {"id": "r4", "domain": "rules", "topic": "rules/shipping", "expected": 0,
     "question": "An order totals 120 and weighs 8 kg. What is the shipping fee under SHIP-1?"},
    {"id": "r5", "domain": "rules", "topic": "rules/fees", "expected": 30,
     "question": "A balance of 500 is paid 3 full months late. What is the late fee under LATE-1?"},
    {"id": "r6", "domain": "rules", "topic": "rules/fees", "expected": 80,
     "question": "A balance of 800 is paid 7 full months late. What is the late fee under LATE-1?"},
    {"id": "r7", "domain": "rules", "topic": "rules/orders", "expected": 162,
     "question": "A customer buys 12 items at 15 each. What is the order cost under DISC-1?"},
    {"id": "r8", "domain": "rules", "topic": "rules/traffic", "expected": "no",
     "question": "A car drives at 58 km/h in town. Does it comply with SPEED-URBAN? Answer yes or no."},
]


def _seed(domain: str, topic: str, text: str, steps: list[tuple[str, str]], checks: list[dict[str, Any]],
          answer: str) -> dict[str, Any]:
    return {
        "metadata": {"source_model": "qwen2.5-coder-1.5b-instruct-q4_k_m", "task_domain": domain, "topic": topic},
        "context": {"raw_text": text},
        "reasoning": [{"step_id": i, "text": t, "principle": p} for i, (t, p) in enumerate(steps, start=1)],
        "verification": checks,
        "outcome": {"answer": answer, "confidence": "high"},
    }


SEEDS: list[dict[str, Any]] = [
    _seed("arithmetic", "math/percent", "What is 20% of 150?",
          [("20% of 150 = 0.20 * 150 = 30", "p% of x = p/100 * x")],
          [{"type": "recomputation", "target": "0.20 * 150", "expected": 30},
           {"type": "boundary_test", "target": "30", "input": {"min": 0, "max": 150}}], "30"),
    _seed("arithmetic", "math/equations", "Solve for x: 4x + 2 = 18.",
          [("4x = 18 - 2 = 16", "subtract the constant from both sides"), ("x = 16 / 4 = 4", "divide by the coefficient")],
          [{"type": "back_substitution", "target": "4*x + 2 = 18", "input": {"x": 4}},
           {"type": "recomputation", "target": "(18 - 2) / 4", "expected": 4}], "4"),
    _seed("arithmetic", "math/arithmetic", "Split 600 in the ratio 1:3. How much is the larger share?",
          [("parts = 1 + 3 = 4; one part = 600 / 4 = 150", "share = total * part / sum of parts"),
           ("larger share = 3 * 150 = 450", "multiply by the largest ratio term")],
          [{"type": "recomputation", "target": "600 * 3 / (1 + 3)", "expected": 450},
           {"type": "boundary_test", "target": "450", "input": {"min": 0, "max": 600}}], "450"),
    _seed("units", "physics/speed", "A cyclist rides 45 km in 1.5 hours. What is the speed in km/h?",
          [("speed = 45 km / 1.5 h = 30 km/h", "v = d / t")],
          [{"type": "recomputation", "target": "45 / 1.5", "expected": 30},
           {"type": "unit_check", "target": "45 km / 1.5 h", "expected": "30 km/h"}], "30 km/h"),
    _seed("units", "physics/energy", "A 2000 W kettle runs for 0.5 hours. Energy in kWh?",
          [("energy = 2 kW * 0.5 h = 1 kWh", "E = P * t")],
          [{"type": "recomputation", "target": "2000 * 0.5 / 1000", "expected": 1},
           {"type": "unit_check", "target": "2000 W * 0.5 h", "expected": "1 kWh"}], "1 kWh"),
    _seed("units", "physics/conversion", "Convert 36 km/h to m/s.",
          [("36 km/h = 36 * 1000 m / 3600 s = 10 m/s", "1 km/h = 1000/3600 m/s")],
          [{"type": "recomputation", "target": "36 * 1000 / 3600", "expected": 10},
           {"type": "unit_check", "target": "36 km/h", "expected": "10 m/s"}], "10 m/s"),
    _seed("rules", "rules/pay", "A worker earns 20 per hour and works 45 hours. Weekly pay under OT-1?",
          [("regular pay = 20 * 40 = 800", "OT-1"), ("overtime = 1.5 * 20 * 5 = 150; total 950", "OT-1")],
          [{"type": "regulatory_check", "target": "OT-1", "input": {"rate": 20, "hours": 45}, "expected": 950},
           {"type": "recomputation", "target": "20*40 + 1.5*20*5", "expected": 950}], "950"),
    _seed("rules", "rules/shipping", "An order totals 40 and weighs 2 kg. Shipping fee under SHIP-1?",
          [("total 40 < 100 so not free", "SHIP-1"), ("fee = 5 + 2 * (2 - 1) = 7", "SHIP-1")],
          [{"type": "regulatory_check", "target": "SHIP-1", "input": {"total": 40, "weight": 2}, "expected": 7},
           {"type": "recomputation", "target": "5 + 2*(2 - 1)", "expected": 7}], "7"),
]
