"""Grounded numbers (the calculator may only use numbers the conversation gives) and places
bound to the clock's time zone; both proven on the prompt the engine receives."""

from __future__ import annotations


import pytest
from pydantic import Field

from recallserve.kernels import StrictModel

from recallserve.serve.agent import Agent, AgentConfig, Tool, ToolRegistry, builtin_tools
from recallserve.serve.agent.builtin import CLOCK_PLACES, CLOCK_ROUTING
from recallserve.serve.agent.demo import DemoWorld, demo_tools
from recallserve.serve.agent.given_numbers import numbers_in, ungrounded
from recallserve.serve.agent.routing import RoutingHint
from tests.unit.agent.conftest import ScriptedEngine, call, final, run_agent

pytestmark = pytest.mark.filterwarnings("error")

REFUND = "If I return 2 kettles at 39.90 each, how much refund do I get?"


def _agent(eng: ScriptedEngine, **cfg: object) -> Agent:
    return Agent(eng, ToolRegistry(builtin_tools() + demo_tools(DemoWorld())), config=AgentConfig(**cfg))




@pytest.mark.parametrize(("expression", "evidence", "bad"), [
    ("(2 * 39.90) - 2 * 19.90", REFUND, ["19.90"]),  # the eval's tuned question 22
    ("(2 * 39.90) - 10.00", REFUND, ["10.00"]),  # the same, a later run: 10.00 is an amount, not a count
    ("(2 * 39.90) - 10", REFUND, []),  # written as a count, 10 stays free
    ("2.0 * 39.90", REFUND, []),  # 2 is given
    ("1450 * 0.5", "1450 watts for half an hour", []),  # a fraction word
    ("2 * 39.9", REFUND, []),  # 39.9 is 39.90
    ("1,299.00 * 3", "three at 1299 each", []),
    ("200 * 0.85", "200 with 15% off", []),  # 1 - 15/100
    ("200 * 1.2", "200 plus 20%", []),
    ("(12 + 35 + 20) / 3", "the average of 12, 35 and 20", []),  # counts are free
    ("45 * 60", "45 minutes", []),  # unit factors are free
    ("17 * 4.5", "seventeen boxes at 4.50", []),  # number words
    ("17 * 4.5 + 99", "seventeen boxes at 4.50", ["99"]),
    ("529 * 0.9", "这台咖啡机卖529元，打九折以后多少钱？", []),  # a Chinese discount: 九折 = pay 90%
    ("529 * 0.85", "529元，打8.5折", []),
    ("529 * 0.75", "这台咖啡机卖529元，打九折以后多少钱？", ["0.75"]),
    ("5 * 24.5 + 8", "买五个杯子，每个二十四块五，邮费八块", []),  # money with its tenths
    ("30000 * 0.9", "3万元打九折", []),  # digits with a Chinese unit
    ("5 * 24.9", "买五个杯子，每个二十四块五", ["24.9"]),
])
def test_ungrounded_names_only_numbers_nobody_gave(expression: str, evidence: str, bad: list[str]) -> None:
    assert ungrounded(expression, numbers_in(evidence)) == bad


def test_an_invented_number_is_refused_and_the_model_corrects_it() -> None:
    eng = ScriptedEngine([
        call("calculator", expression="(2 * 39.90) - 2 * 19.90"),
        call("calculator", expression="2 * 39.90"),
        final("You get 79.80 back."),
    ])
    result = run_agent(_agent(eng, use_router=False, routing_rules=False), REFUND)
    first, second = result.tool_calls
    assert first.status == "invalid" and "19.90" in first.observation and first.result is None
    assert second.status == "ok" and second.result["result"] == 79.8
    # the model read the refusal naming the number, then the real result
    assert "19.90, which neither the question nor the results give" in eng.calls[1][0][-1].content
    assert "2 * 39.90 = 79.8" in eng.calls[2][0][-1].content
    assert result.answer == "You get 79.80 back."


def test_the_same_rejected_expression_again_is_refused_and_the_next_step_may_only_answer() -> None:
    eng = ScriptedEngine([
        call("calculator", expression="(2 * 39.90) - 0.00"),
        call("calculator", expression="(2 * 39.90) - 0.00"),
        final("You get 79.80 back."),
    ])
    result = run_agent(_agent(eng, use_router=False, routing_rules=False), REFUND)
    assert [c.status for c in result.tool_calls] == ["invalid", "refused"]
    assert "These were rejected before" in eng.calls[2][0][-1].content
    # a step of refusals only leaves no tool in the next step's grammar: the model answers
    assert "calculator" not in str(eng.calls[2][1].json_schema)
    assert result.answer == "You get 79.80 back."


def test_numbers_from_an_earlier_observation_are_grounded() -> None:
    class Args(StrictModel):
        sku: str = Field(max_length=20, description="sku")

    price = Tool("price", "the unit price of a SKU", Args, lambda a, ctx: {"sku": a.sku, "price": 123.45}, "basic")
    eng = ScriptedEngine([call("price", sku="BM3-PRO"), call("calculator", expression="123.45 * 17 + 13.5"),
                          call("calculator", expression="123.45 * 17"), final("2098.65")])
    reg = ToolRegistry([*builtin_tools(), price])
    agent = Agent(eng, reg, config=AgentConfig(use_router=False, routing_rules=False))
    result = run_agent(agent, "What do 17 BM3-PRO cost?", scopes=["basic"])
    # 123.45 came from the observation, 17 from the question; 13.5 from nowhere
    assert [c.status for c in result.tool_calls] == ["ok", "invalid", "ok"]
    assert "uses 13.5," in result.tool_calls[1].observation
    assert result.tool_calls[2].result["result"] == pytest.approx(2098.65)


def test_a_named_place_binds_the_clock_and_the_grammar_allows_only_its_zone() -> None:
    assert CLOCK_ROUTING.bindings("what time is it in Tokyo right now?") == {"timezone": ["Asia/Tokyo"]}
    assert CLOCK_ROUTING.bindings("Time in new york and in LONDON?") == {"timezone": ["America/New_York", "Europe/London"]}
    assert CLOCK_ROUTING.bindings("what time is it?") == {}
    # the holdout question 23: one place, so the rules make the call without the model
    eng = ScriptedEngine([final("It is the evening in Tokyo.")])
    result = run_agent(_agent(eng), "what time is it in Tokyo right now?")
    (rec,) = result.tool_calls
    assert rec.name == "current_time" and rec.args == {"timezone": "Asia/Tokyo"} and rec.status == "ok"
    assert "+09:00" in eng.calls[-1][0][-1].content


def test_every_place_maps_to_an_installed_zone() -> None:
    import zoneinfo

    for place, zone in CLOCK_PLACES.items():
        assert zoneinfo.ZoneInfo(zone), place


def test_aliases_need_a_bind_pattern() -> None:
    with pytest.raises(ValueError, match="aliases.timezone"):
        RoutingHint(aliases={"timezone": {"tokyo": "Asia/Tokyo"}})


def test_chinese_numerals_are_given_numbers() -> None:
    assert {1347.0, 3.0} <= numbers_in("1347块三个人平摊") and 2000.0 in numbers_in("两千块")
    assert ungrounded("1347 / 3", numbers_in("1347块三个人平摊，每人要出多少？")) == []
    assert ungrounded("2000 * 0.9", numbers_in("两千块打九折")) == []
