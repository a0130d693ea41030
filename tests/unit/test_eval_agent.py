"""Scoring of ``recallserve eval agent`` (the questions file and the pass rule)."""

from __future__ import annotations

from deployments.cli._eval_agent import _pct, score_result
from serve.agent import default_registry
from serve.agent.demo import load_questions
from serve.agent.schemas import AgentResult, RouteDecision, ToolCallRecord


def _result(*calls: ToolCallRecord) -> AgentResult:
    return AgentResult(answer="a", finish_reason="final", route=RouteDecision(route="tools", source="router"),
                       tool_calls=list(calls))


def _rec(name: str, args: dict, status: str = "ok", result=None) -> ToolCallRecord:
    return ToolCallRecord(id="c1", step=1, name=name, args=args, status=status, observation="o", result=result)


def test_questions_file_is_consistent() -> None:
    qs = load_questions()
    names = set(default_registry().names())
    assert len(qs) >= 30 and sum(q["tool"] is not None for q in qs) >= 25
    for q in qs:
        assert q["tool"] is None or q["tool"] in names, q
        if q["tool"] and "args" in q:  # the expected arguments themselves pass validation
            tool = default_registry().get(q["tool"])
            full = dict(q["args"])
            tool.validate(full)


def test_score_rules() -> None:
    q = {"q": "x", "tool": "order_status", "args": {"order_id": "104208"}}
    assert score_result(q, _result(_rec("order_status", {"order_id": "104208"})))
    assert score_result(q, _result(_rec("order_status", {"order_id": "104208"}, status="error")))  # valid, not found
    assert not score_result(q, _result(_rec("order_status", {"order_id": "104209"})))
    assert not score_result(q, _result(_rec("order_status", {"order_id": "10420"}, status="invalid")))
    calc = {"q": "x", "tool": "calculator", "result": 76.33}
    assert score_result(calc, _result(_rec("calculator", {"expression": "0.17*449"}, result={"result": 76.33})))
    assert not score_result(calc, _result(_rec("calculator", {"expression": "17*449"}, result={"result": 7633})))
    none = {"q": "hi", "tool": None}
    assert score_result(none, _result()) and not score_result(none, _result(_rec("calculator", {})))
    mem = {"q": "x", "tool": "memory_search", "args_contain": {"query": "leak"}}
    assert score_result(mem, _result(_rec("memory_search", {"query": "Water LEAKING group head"})))


def test_percentile() -> None:
    assert _pct([3, 1, 2], 50) == 2 and _pct(list(range(1, 101)), 95) == 95
