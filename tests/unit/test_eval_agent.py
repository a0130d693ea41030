"""Scoring of ``recallserve eval agent`` (the questions file and the pass rule)."""

from __future__ import annotations

import argparse

import pytest
from recallserve.deployments.cli._eval_agent import _pct, question_numbers, score_result
from recallserve.serve.agent import default_registry
from recallserve.serve.agent.demo import load_questions
from recallserve.serve.agent.demo.facts import score_answer
from recallserve.serve.agent.schemas import AgentResult, RouteDecision, ToolCallRecord


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


def test_every_question_has_key_facts_and_the_files_match_the_world(capsys) -> None:
    import importlib.util
    from pathlib import Path

    qs = load_questions("all")
    assert len(qs) == 80 and all(q["facts"] for q in qs)
    # NOTE: the look-up facts are derived from world.json; a changed world or question must be re-derived.
    path = Path(__file__).resolve().parents[2] / "scripts" / "question_facts.py"
    spec = importlib.util.spec_from_file_location("question_facts", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--check"]) == 0, capsys.readouterr().err


def test_question_schema_rejects_a_question_without_facts_or_with_an_unknown_field() -> None:
    import pytest
    from pydantic import ValidationError
    from recallserve.serve.agent.demo.questions import Question

    ok = Question.model_validate({"q": "hi", "tool": None, "facts": [["hello", "hi"]]})
    assert ok.facts == [["hello", "hi"]]
    with pytest.raises(ValidationError, match="facts"):
        Question.model_validate({"q": "hi", "tool": None})
    with pytest.raises(ValidationError, match="facts"):
        Question.model_validate({"q": "hi", "tool": None, "facts": [[]]})
    with pytest.raises(ValidationError, match="fact"):
        Question.model_validate({"q": "hi", "tool": None, "facts": ["hi"], "fact": ["typo"]})


def test_key_fact_matching_normalises_numbers_and_respects_word_edges() -> None:
    from recallserve.serve.agent.demo.facts import normalise, score_answer

    assert normalise("Total:  EUR 1,818.960\n") == "total: eur 1818.96"
    assert normalise("79.80 and 387.00 and 1,500 units") == "79.8 and 387 and 1500 units"
    assert score_answer("The total is 1,818.96 euros.", [["1818.96"]]).passed
    assert score_answer("Refund: 79.80", ["79.8"]).passed
    assert not score_answer("It costs 112 euros", ["12"]).passed  # a number must not match inside another
    assert not score_answer("Error E120", ["E12"]).passed
    assert not score_answer("22.333", ["22.3"]).passed  # nor a prefix of a longer decimal
    assert score_answer("Run the priming steps", ["prim"]).passed  # a word stem may continue
    assert score_answer("Batch B\u20112320 ok", ["B-2320"]).passed  # a non-breaking hyphen is a hyphen
    v = score_answer("Ticket T-1121: replaced the TF-185 thermal fuse.", ["T-1121", ["ribbon cable", "cable"]],
                     ["TF-185"])
    assert not v.passed and v.missing == ["ribbon cable | cable"] and v.forbidden == ["TF-185"]
    assert score_answer("It is 10:42 in Tokyo.", [r"re:\b\d{1,2}:\d{2}\b"]).passed
    assert not score_answer("It is morning in Tokyo.", [r"re:\b\d{1,2}:\d{2}\b"]).passed


def test_known_wrong_answer_fails_and_right_answers_pass_their_questions() -> None:
    from recallserve.deployments.cli._eval_agent import fact_row

    by_text = {q["q"]: q for q in load_questions("all")}
    flicker = by_text["search the knowledge base for anything about a flickering display"]
    # NOTE: the wrong answer: the fix of another ticket (the thermal fuse) for the display fault.
    wrong = fact_row(flicker, "Yes, T-1121 had this; it was fixed by replacing the TF-185 thermal fuse.")
    assert not wrong["facts_pass"] and wrong["forbidden"] == ["TF-185"]
    assert fact_row(flicker, "T-1121: a loose LCD ribbon cable, reseated at the service centre.")["facts_pass"]
    cancel = by_text["Please cancel my order 104261."]
    assert fact_row(cancel, "I'm sorry, but this account isn't allowed to do that, so nothing has been changed.")[
        "facts_pass"]
    assert not fact_row(cancel, "Done: order 104261 has been cancelled.")["facts_pass"]
    b2207 = by_text["Which orders came from batch B-2207?"]
    all_ids = "104208, 104212, 104216, 104225, 104238, 104241, 104246 and 104251"
    assert fact_row(b2207, f"Batch B-2207 has 8 orders: {all_ids}.")["facts_pass"]
    assert fact_row(b2207, "Batch B-2207 has 8 orders: 104208, 104212.")["missing"][0] == "104216"


def test_rescore_scores_an_earlier_report_by_the_current_facts() -> None:
    from recallserve.deployments.cli._eval_agent import rescore

    rows = [{"q": "What is 17% of 449?", "expected": "calculator", "pass": True, "answer": "It is 76.33.",
             "elapsed_ms": 10.0, "first_token_ms": 5.0},
            {"q": "Hi there!", "expected": None, "pass": True, "answer": "Good day.", "elapsed_ms": 4.0,
             "first_token_ms": None}]
    out = rescore({"questions_set": "tuned", "model": "m", "rows": rows})
    s = out["sets"]["tuned"]
    assert (s["questions"], s["passed"], s["facts_passed"], s["facts_score"]) == (2, 2, 1, 0.5)
    assert [r["n"] for r in s["rows"]] == [19, 31]
    assert s["facts_failed"] == [{"n": 31, "q": "Hi there!", "missing": ["hello | hi | hey | good morning | welcome"],
                                  "forbidden": []}]


def test_only_takes_numbers_and_ranges_and_names_a_bad_one() -> None:
    assert question_numbers("3, 5,26-28") == [3, 5, 26, 27, 28]
    for bad in ("26-x", "0", "9-3", "1-5000"):
        with pytest.raises(argparse.ArgumentTypeError, match="range|question number|start at 1"):
            question_numbers(bad)


def test_zh_time_key_fact_accepts_the_chinese_clock_and_hh_mm() -> None:
    q = next(q for q in load_questions("zh-tuned") if q["tool"] == "current_time")
    assert score_answer("东京现在是下午7点14分。", q["facts"]).passed
    assert score_answer("东京现在是19:14。", q["facts"]).passed
    assert not score_answer("东京现在是晚上。", q["facts"]).passed


def test_an_answer_counts_as_in_the_questions_language_without_the_records_it_quotes() -> None:
    """``language_pass``: a Chinese question's answer is Chinese; the quoted English record after it does not count."""
    from recallserve.deployments.cli._eval_agent import fact_row

    q = {"q": "这个故障以前出现过吗？", "tool": "memory_search", "facts": ["T-1080"]}
    chinese = "出现过，记录 T-1080 换了垫圈。\n\n记录 T-1080：Ticket T-1080 (BrewMaster 3000 espresso machine). Fault: water leaks."
    english = "Yes, T-1080 had it: the gasket was replaced.\n\n记录 T-1080：Ticket T-1080 (BrewMaster 3000)."
    assert fact_row(q, chinese)["language_pass"] and not fact_row(q, english)["language_pass"]
    assert fact_row({**q, "q": "Has this happened before?"}, english)["language_pass"]
