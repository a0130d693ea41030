"""Record builders shared by the service and HTTP tests."""

from __future__ import annotations

from typing import Any

DAY = 86400.0


def speed_record(*, answer: str = "80 km/h", model: str = "Qwen2.5-Coder-1.5B-Instruct", domain: str = "units",
                 topic: str = "physics/speed", text: str = "A car drives 120 km in 1.5 h. What is its speed?",
                 timestamp: float | None = None, expires_at: float | None = None, exp_id: str | None = None,
                 label: str | None = None) -> dict[str, Any]:
    """A JSON-able record whose checks pass when ``answer`` is 80 km/h and fail otherwise."""
    md: dict[str, Any] = {"source_model": model, "task_domain": domain, "topic": topic}
    if timestamp is not None:
        md["timestamp"] = timestamp
    if expires_at is not None:
        md["expires_at"] = expires_at
    if exp_id is not None:
        md["id"] = exp_id
    rec: dict[str, Any] = {
        "metadata": md,
        "context": {"raw_text": text, "quantities": [{"name": "d", "value": 120, "unit": "km"}]},
        "reasoning": [{"step_id": 1, "text": "divide distance by time", "principle": "v = d / t"}],
        "verification": [
            {"type": "recomputation", "target": "d / 1.5"},
            {"type": "unit_check", "target": "120 km / 1.5 h", "expected": "km/h"},
        ],
        "outcome": {"answer": answer, "confidence": "high"},
    }
    if label is not None:
        rec["evaluation"] = {"human_label": label}
    return rec
