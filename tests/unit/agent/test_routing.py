"""Routing rules: decisions over the shipped question sets, argument binding, and how the loop
uses them (forced first call, grammar enums, direct answers, undecided -> router model)."""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from recallserve.kernels import StrictModel
from recallserve.serve.agent import Agent, AgentConfig, Tool, ToolRegistry, builtin_tools, default_registry
from recallserve.serve.agent.demo import DemoWorld, demo_tools
from recallserve.serve.agent.demo.tools import DEMO_SCOPES
from recallserve.serve.agent.routing import RoutingHint, bind_schema, route_by_rules
from tests.unit.agent.conftest import ScriptedEngine, SubstringMemory, call, final, route, run_agent, turn_for


def _questions(name: str) -> list[dict[str, Any]]:
    return json.loads(resources.files("recallserve.serve.agent.demo").joinpath(name).read_text(encoding="utf-8"))


def _rule_pass(q: dict[str, Any]) -> bool:
    reg = default_registry()
    d = route_by_rules(q["q"], reg.for_scopes(DEMO_SCOPES), reg.all())
    if q["tool"] is None:
        return d.route == "direct"
    return d.route == "tools" and q["tool"] in d.first_step


@pytest.mark.parametrize("q", _questions("questions.json"), ids=lambda q: q["q"][:40])
def test_rules_route_every_tuned_question(q: dict[str, Any]) -> None:
    assert _rule_pass(q)


def test_rules_generalise_to_the_held_out_questions() -> None:
    # NOTE: questions_holdout.json was written by someone who never saw the rules or the tuned
    # questions; the rules were not changed after their first run on it (39/40; the miss is a
    # refund request, for which no tool exists, routed to order_status).
    qs = _questions("questions_holdout.json")
    passed = sum(_rule_pass(q) for q in qs)
    assert passed >= 39, f"{passed}/{len(qs)}"


@pytest.mark.parametrize("q", _questions("questions_zh.json"), ids=lambda q: q["q"][:20])
def test_rules_route_every_chinese_tuned_question(q: dict[str, Any]) -> None:
    assert _rule_pass(q)


def test_rules_route_the_chinese_held_out_questions() -> None:
    # NOTE: questions_zh_holdout.json was written with questions_zh.json, before the Chinese routing
    # words; the rules were not changed after their first run on it (16/16).
    qs = _questions("questions_zh_holdout.json")
    passed = sum(_rule_pass(q) for q in qs)
    assert passed == len(qs), f"{passed}/{len(qs)}"


def test_a_chinese_discount_in_chinese_numerals_is_a_calculation() -> None:
    """八五折 (pay 85%) is the second operand of "689 ... 打八五折以后是多少钱"; a year word is no discount."""
    reg = default_registry()
    for q in ("这台咖啡机卖529元，打九折以后多少钱？", "449元的东西打8折是多少钱？"):
        assert route_by_rules(q, reg.for_scopes(DEMO_SCOPES), reg.all()).first_step == ["calculator"], q
    assert route_by_rules("我们公司八五年成立的", reg.for_scopes(DEMO_SCOPES), reg.all()).first_step != ["calculator"]


def test_ids_and_places_next_to_chinese_text_are_bound() -> None:
    reg = default_registry()
    d = route_by_rules("订单104208和104233发货了吗？", reg.for_scopes(DEMO_SCOPES), reg.all())
    assert d.bindings["order_status"] == {"order_id": ["104208", "104233"]}
    clock = route_by_rules("东京现在几点？", reg.for_scopes(DEMO_SCOPES), reg.all())
    assert clock.first_step == ["current_time"] and clock.bindings["current_time"] == {"timezone": ["Asia/Tokyo"]}
    # an id glued to Latin letters is still part of a longer token
    assert route_by_rules("订单X104208", reg.for_scopes(DEMO_SCOPES), reg.all()).bindings == {}


@pytest.mark.parametrize(("question", "start"), [
    ("取消订单104246，客户改主意了。", "抱歉，这个账户无权执行该操作"),
    ("你是谁？你能帮我做什么？", "我是本公司的客服助手"),
    ("订单10423发货了吗？", "暂时无法查询：\u201c订单10423\u201d看起来不是有效的编号"),
    ("Please cancel my order 104261.", "I'm sorry, but this account isn't allowed"),
])
def test_the_rules_own_replies_are_in_the_questions_language(question: str, start: str) -> None:
    reg = default_registry()
    d = route_by_rules(question, reg.for_scopes(DEMO_SCOPES), reg.all())
    assert d.route == "direct" and d.reply.startswith(start), d.reply


def test_bindings_offer_only_ids_from_the_text() -> None:
    reg = default_registry()
    d = route_by_rules("status of order #104208 and 104233?", reg.for_scopes(DEMO_SCOPES), reg.all())
    assert d.first_step == ["order_status"]
    assert d.bindings["order_status"] == {"order_id": ["104208", "104233"]}


def test_ocr_style_lowercase_ids_are_upper_cased_in_the_grammar() -> None:
    tool = next(t for t in demo_tools(DemoWorld()) if t.name == "batch_info")
    assert tool.routing is not None
    found = tool.routing.bindings("when was b-2207 produced?")
    schema = bind_schema(tool.args_schema, tool.routing.bind, found)
    assert schema["properties"]["batch"] == {"enum": ["B-2207"]}


def test_unmentioned_optional_argument_is_left_out_of_the_grammar() -> None:
    tool = next(t for t in demo_tools(DemoWorld()) if t.name == "inventory_changes")
    assert tool.routing is not None
    text = "stock changes between 2025-03-01 and 2025-03-31"
    schema = bind_schema(tool.args_schema, tool.routing.bind, tool.routing.bindings(text))
    assert "sku" not in schema["properties"]
    assert schema["properties"]["start_date"] == {"enum": ["2025-03-01", "2025-03-31"]}


def test_action_outside_the_scopes_is_answered_directly() -> None:
    reg = default_registry()
    d = route_by_rules("Please cancel order 104261", reg.for_scopes(DEMO_SCOPES), reg.all())
    assert d.route == "direct" and "orders:write" in d.reason
    granted = reg.for_scopes([*DEMO_SCOPES, "orders:write"])
    d2 = route_by_rules("Please cancel order 104261", granted, reg.all())
    assert d2.route == "tools" and "cancel_order" in d2.first_step


@pytest.mark.parametrize(("question", "tool", "bound"), [
    ("客户来电报的单号是104-318，问现在什么进度了", "order_status", {"order_id": ["104318"]}),
    ("亲，我那个订单 104 246 怎么还没动静啊", "order_status", {"order_id": ["104246"]}),
    ("B2301这一批总共对应了几个订单？", "orders_by_batch", {"batch": ["B-2301"]}),
    ("2208批次里有哪些订单退货了？", "orders_by_batch", {"batch": ["B-2208"], "status": ["returned"]}),
    ("2320那一批机器的产量多少台？", "batch_info", {"batch": ["B-2320"]}),
    ("Who supplied the heater of batch 2301?", "batch_info", {"batch": ["B-2301"]}),
    ("客户编号C1001之前报修过几次？", "ticket_history", {"customer_id": ["C-1001"]}),
])
def test_other_spellings_of_an_id_are_bound_in_their_canonical_form(question: str, tool: str, bound: dict[str, list[str]]) -> None:
    reg = default_registry()
    d = route_by_rules(question, reg.for_scopes(DEMO_SCOPES), reg.all())
    assert d.first_step == [tool] and d.bindings[tool] == bound, d


def test_spellings_leave_other_numbers_alone() -> None:
    reg = default_registry()
    for q in ("预算 100 000 元够吗？", "Is 2025 a good year for coffee?", "打 400-820-8820 可以吗？"):
        assert route_by_rules(q, reg.for_scopes(DEMO_SCOPES), reg.all()).route != "tools", q
    # a malformed id is still asked for, not guessed
    assert "malformed" in route_by_rules("batch 23, please", reg.for_scopes(DEMO_SCOPES), reg.all()).reason


def test_malformed_id_is_answered_directly() -> None:
    reg = default_registry()
    d = route_by_rules("is order 10423 delivered?", reg.for_scopes(DEMO_SCOPES), reg.all())
    assert d.route == "direct" and "malformed" in d.reason


def test_bad_hint_regex_names_the_field() -> None:
    with pytest.raises(ValidationError, match=r"keywords\[1\]"):
        RoutingHint(keywords=["ok", "(unclosed"])
    with pytest.raises(ValidationError, match=r"bind\.order_id"):
        RoutingHint(bind={"order_id": "[oops"})
    with pytest.raises(ValidationError, match=r"spellings.*refers to group 2, the pattern has 1"):
        RoutingHint(spellings={r"B(\d{4})": r"B-\2"})


def _registry(extra: list[Tool] = ()) -> ToolRegistry:
    reg = ToolRegistry(builtin_tools() + demo_tools(DemoWorld()))
    for t in extra:
        reg.register(t)
    return reg


def _run(agent: Agent, text: str) -> Any:
    return run_agent(agent, text)


def _alternatives(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return schema.get("anyOf", [schema])


def test_loop_forces_the_first_call_and_binds_the_id() -> None:
    eng = ScriptedEngine([call("order_status", order_id="104208"), final("delivered")])
    cfg = AgentConfig(use_router=True, rule_first_call=False)
    result = _run(Agent(eng, _registry(), config=cfg), "Where is order 104208?")
    assert result.route.source == "rules" and result.route.first_step == ["order_status"]
    first = _alternatives(eng.calls[0][1].json_schema)
    assert all(alt["properties"]["type"].get("const") != "final" for alt in first)  # must call
    single = [a for a in first if a["properties"]["type"].get("const") == "tool_call"]
    assert [a["properties"]["name"]["const"] for a in single] == ["order_status"]
    assert single[0]["properties"]["args"]["properties"]["order_id"] == {"enum": ["104208"]}
    second = _alternatives(eng.calls[1][1].json_schema)
    assert any(alt["properties"]["type"].get("const") == "final" for alt in second)
    assert result.tool_calls[0].status == "ok" and result.answer == "delivered"
    assert len(eng.calls) == 2  # no router-model call


def test_loop_answers_small_talk_without_tools_or_router_call() -> None:
    eng = ScriptedEngine(["Hello!"])
    result = _run(Agent(eng, _registry(), config=AgentConfig(use_router=True)), "Good morning!")
    assert result.route.route == "direct" and result.route.source == "rules"
    assert result.finish_reason == "direct" and not result.tool_calls and len(eng.calls) == 1
    assert eng.calls[0][1].json_schema is None and result.answer == "Hello!"


def test_rules_that_settle_a_direct_answer_reply_themselves() -> None:
    eng = ScriptedEngine([])  # no engine call may happen
    result = _run(Agent(eng, _registry(), config=AgentConfig()), "Please cancel order 104261")
    assert result.route.route == "direct" and result.finish_reason == "direct" and not result.tool_calls
    assert result.answer == result.route.reply and "nothing has been changed" in result.answer
    assert "isn't allowed" in result.answer and not eng.calls
    result = _run(Agent(eng, _registry(), config=AgentConfig()), "is order 10423 delivered?")
    assert "\u201corder 10423\u201d doesn't look like a valid id" in result.answer and "6-digit order id" in result.answer
    assert "delivered" not in result.answer.lower() and not eng.calls  # never a guess about the order


def test_direct_answer_carries_the_rules_advice() -> None:
    eng = ScriptedEngine(["I cannot cancel orders from here."])
    result = _run(Agent(eng, _registry(), config=AgentConfig(rule_replies=False)), "Please cancel order 104261")
    assert result.route.route == "direct" and "cannot do from this account" in result.route.advice
    assert result.route.advice in eng.calls[0][0][0].content and not result.tool_calls
    eng = ScriptedEngine(["Which order id?"])
    result = _run(Agent(eng, _registry(), config=AgentConfig(rule_replies=False)), "is order 10423 delivered?")
    assert "6-digit order id" in eng.calls[0][0][0].content and "ask the user" in eng.calls[0][0][0].content


def test_undecided_rules_ask_the_router_model() -> None:
    class Args(StrictModel):
        city: str

    weather = Tool("weather", "Weather of a city.", Args, lambda a, c: {"sunny": True}, "basic")
    eng = ScriptedEngine([route("tools", "weather"), call("weather", city="Oslo"), final("sunny")])
    result = _run(Agent(eng, _registry([weather]), config=AgentConfig(use_router=True)), "Is it nice outside in Oslo?")
    assert result.route.source == "router" and result.route.tools == ["weather"]
    assert result.tool_calls[0].name == "weather"


def test_rules_off_keeps_the_model_router() -> None:
    eng = ScriptedEngine([route("direct"), final("hi")])
    result = _run(Agent(eng, _registry(), config=AgentConfig(routing_rules=False)), "Where is order 104208?")
    assert result.route.source == "router" and result.route.route == "direct"


def test_http_tool_config_takes_a_routing_hint() -> None:
    from recallserve.serve.agent import HttpToolConfig, build_http_tool

    cfg = HttpToolConfig.model_validate({
        "name": "stock_price", "description": "Price of a ticker.", "url_template": "http://127.0.0.1:9/p/{ticker}",
        "params": {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}}, "scope": "basic",
        "routing": {"requires": [r"\$[A-Z]{1,5}\b"], "bind": {"ticker": r"\$([A-Z]{1,5})\b"}},
    })
    tool = build_http_tool(cfg)
    assert isinstance(tool.routing, RoutingHint) and tool.routing.bindings("price of $ACME?") == {"ticker": ["ACME"]}
    assert issubclass(tool.params, BaseModel)


def test_a_single_possible_call_leaves_the_grammar_once_made() -> None:
    eng = ScriptedEngine([call("order_status", order_id="104208"), final("It was delivered.")])
    result = _run(Agent(eng, _registry(), config=AgentConfig(rule_first_call=False)), "Where is order 104208?")
    assert result.answer == "It was delivered." and [c.status for c in result.tool_calls] == ["ok"]
    second = _alternatives(eng.calls[1][1].json_schema)
    assert [a["properties"]["type"].get("const") for a in second] == ["final"]


def test_a_call_the_rules_determine_runs_without_an_engine_step() -> None:
    eng = ScriptedEngine([final("Order 104208 was delivered.")])
    result = _run(Agent(eng, _registry(), config=AgentConfig()), "Where is order 104208?")
    assert len(eng.calls) == 1 and result.usage.engine_calls == 1  # the answer is the only engine call
    assert [(c.name, c.args, c.status) for c in result.tool_calls] == [("order_status", {"order_id": "104208"}, "ok")]
    assert result.answer == "Order 104208 was delivered." and result.finish_reason == "final"
    prompt = eng.calls[0][0]
    # the engine reads the step as if the model had written it, then the real observation
    step = json.loads(prompt[-2].content)
    assert prompt[-2].role == "assistant" and step["type"] == "tool_call" and step["name"] == "order_status"
    assert step["args"] == {"order_id": "104208"} and "104208" in step["thought"]
    assert prompt[-1].content.startswith("Observation(order_status): ") and '"order_id": "104208"' in prompt[-1].content
    (answer_step,) = _alternatives(eng.calls[0][1].json_schema)
    # nothing left to choose: the answer comes first, no thought before it
    assert answer_step["properties"]["type"] == {"const": "final"} and list(answer_step["properties"]) == ["type", "answer"]
    ruled = [s for s in result.steps if s.step == 1 and s.data.get("source") == "rules"]
    assert [s.kind for s in ruled] == ["thought", "action"]


def test_a_choice_between_tools_or_values_stays_with_the_model() -> None:
    # two ids: two possible calls, so the model writes step 1
    eng = ScriptedEngine([call("order_status", order_id="104208"), final("Delivered.")])
    result = _run(Agent(eng, _registry(), config=AgentConfig()), "Where are orders 104208 and 104333?")
    assert len(eng.calls) == 2 and result.route.first_step == ["order_status"]
    # the model is still asked when the determined call is switched off
    eng = ScriptedEngine([call("order_status", order_id="104208"), final("Delivered.")])
    result = _run(Agent(eng, _registry(), config=AgentConfig(rule_first_call=False)), "Where is order 104208?")
    assert len(eng.calls) == 2 and result.answer == "Delivered."


def test_tools_with_several_possible_calls_stay_available() -> None:
    from recallserve.serve.agent._calls import single_call_tools as _single_call_tools

    reg = default_registry()
    tools = reg.for_scopes(DEMO_SCOPES)
    d = route_by_rules("stock of GR-200 between 2025-04-01 and 2025-04-30", tools, reg.all())
    assert _single_call_tools(tools.subset(d.tools), d.bindings) == set()  # two dates -> several calls
    d = route_by_rules("Has customer C-1005 contacted support?", tools, reg.all())
    assert _single_call_tools(tools.subset(d.tools), d.bindings) == {"ticket_history"}


def test_a_tool_leaves_the_grammar_once_its_calls_used_every_value_the_question_gives() -> None:
    # two dates: several possible calls, so the model writes step 1; once a call used both, nothing is left
    eng = ScriptedEngine([call("inventory_changes", start_date="2025-04-01", end_date="2025-04-30", sku="GR-200"),
                          final("GR-200 went down by 3.")])
    result = _run(Agent(eng, _registry(), config=AgentConfig()),
                  "Show the stock movements of GR-200 between 2025-04-01 and 2025-04-30.")
    assert [c.status for c in result.tool_calls] == ["ok"] and len(eng.calls) == 2
    assert [a["properties"]["type"].get("const") for a in _alternatives(eng.calls[1][1].json_schema)] == ["final"]
    # two order ids, the model writing the steps: after the first call the tool stays for the second id, then it leaves
    eng = ScriptedEngine([call("order_status", order_id="104208"), call("order_status", order_id="104333"),
                          final("Both delivered.")])
    result = _run(Agent(eng, _registry(), config=AgentConfig(rule_first_call=False)), "Where are orders 104208 and 104333?")
    assert [c.args["order_id"] for c in result.tool_calls] == ["104208", "104333"]
    second = _alternatives(eng.calls[1][1].json_schema)
    assert any(a["properties"].get("name", {}).get("const") == "order_status" for a in second)
    assert [a["properties"]["type"].get("const") for a in _alternatives(eng.calls[2][1].json_schema)] == ["final"]


def test_several_ids_for_one_lookup_are_all_called_by_the_rules() -> None:
    """Two order ids: the rules fix both calls in step 1 (no engine step); the model only answers, with both
    observations in its prompt."""
    eng = ScriptedEngine([final("104208 was delivered; 104333 was delivered.")])
    result = _run(Agent(eng, _registry(), config=AgentConfig()), "Could you check orders 104208 and 104333?")
    assert [(c.name, c.args["order_id"], c.status) for c in result.tool_calls] == [
        ("order_status", "104208", "ok"), ("order_status", "104333", "ok")]
    assert len(eng.calls) == 1
    prompt = "\n".join(m.content for m in eng.calls[0][0])
    assert "104208" in prompt and "104333" in prompt and prompt.count("Observation(order_status)") == 2
    # two multi-valued arguments (dates): the model writes the step
    from recallserve.serve.agent._calls import determined_calls
    reg = _registry()
    tools = reg.for_scopes(DEMO_SCOPES)
    d = route_by_rules("stock of GR-200 between 2025-04-01 and 2025-04-30", tools, reg.all())
    assert determined_calls(tools.subset(["inventory_changes"]), d.bindings) == []


def test_the_rule_fixed_call_uses_the_grammars_value_for_a_lower_case_id() -> None:
    eng = ScriptedEngine([final("Supplied by S-04.")])
    result = _run(Agent(eng, _registry(), config=AgentConfig()), "who supplied the display for batch b-2320?")
    assert len(eng.calls) == 1  # the call was fixed by the rules ...
    (rec,) = result.tool_calls  # ... with the id as the grammar would have held the model to it
    assert rec.name == "batch_info" and rec.args == {"batch": "B-2320"} and rec.status == "ok"


def test_a_not_found_id_leaves_only_the_answer() -> None:
    # the executor refuses a repeat whatever the first result was, so the tool leaves the grammar
    eng = ScriptedEngine([final("Order 104999 was not found.")])
    result = _run(Agent(eng, _registry(), config=AgentConfig()), "What is the status of order 104999?")
    assert [c.status for c in result.tool_calls] == ["error"] and len(eng.calls) == 1
    assert [a["properties"]["type"].get("const") for a in _alternatives(eng.calls[0][1].json_schema)] == ["final"]


def test_a_destructive_call_is_never_run_without_the_models_step() -> None:
    from recallserve.serve.agent._calls import determined_calls as _determined_calls

    reg = _registry()
    tools = reg.for_scopes([*DEMO_SCOPES, "orders:write"])
    d = route_by_rules("Please cancel order 104261", tools, reg.all())
    assert "cancel_order" in d.first_step and d.bindings["cancel_order"] == {"order_id": ["104261"]}
    # one tool, one value: a lookup would be fixed, the cancellation is not
    assert _determined_calls(tools.subset(["order_status"]), {"order_status": {"order_id": ["104261"]}}) != []
    assert _determined_calls(tools.subset(["cancel_order"]), d.bindings) == []


@pytest.mark.parametrize(("question", "action"), [
    ("i want a refund for order #104478 right now", "issue a refund"),
    ("Please refund me, the kettle broke.", "issue a refund"),
    ("Can you send me a replacement machine?", "send a replacement"),
    ("change my delivery address for order 104246 to 5 Main St", "change an order's delivery"),
])
def test_an_action_no_tool_does_is_declined_by_the_rules(question: str, action: str) -> None:
    reg = default_registry()
    d = route_by_rules(question, reg.for_scopes(DEMO_SCOPES), reg.all())
    assert d.route == "direct" and action in d.reason  # declined before any lookup, even with an order id
    assert d.reply.startswith("I'm sorry, but I can't") and "colleague" in d.reply and action in d.reply


@pytest.mark.parametrize("question", [
    "If I return 2 kettles at 39.90 each, how much refund do I get?",  # arithmetic, not a request
    "What is your refund policy for espresso machines?",
    "how do I replace the gasket?",
    "Please cancel order 104246, the customer changed their mind.",  # a tool does it: its scope rule answers
])
def test_a_question_about_an_action_is_not_a_request_for_it(question: str) -> None:
    reg = default_registry()
    d = route_by_rules(question, reg.for_scopes(DEMO_SCOPES), reg.all())
    assert "which no tool does" not in d.reason


def test_a_refund_request_is_declined_without_a_lookup_or_an_engine_call() -> None:
    eng = ScriptedEngine([])
    result = _run(Agent(eng, _registry(), config=AgentConfig()), "i want a refund for order #104478 right now")
    assert result.answer.startswith("I'm sorry, but I can't issue a refund from here, so nothing has been changed")
    assert not result.tool_calls and not eng.calls
    # off switch: the model answers, advised by the rule
    eng = ScriptedEngine(["I cannot refund it myself; a colleague can help."])
    result = _run(Agent(eng, _registry(), config=AgentConfig(rule_replies=False)), "i want a refund for order #104478")
    assert result.answer == "I cannot refund it myself; a colleague can help."
    assert "issue a refund, which you cannot do here" in eng.calls[0][0][0].content


def test_one_memory_search_a_request_then_the_tool_leaves_the_grammar() -> None:
    memory = SubstringMemory({"ticket:T-1071": "Ticket T-1071: pump error E12, air lock; primed the pump."})
    eng = ScriptedEngine([call("memory_search", query="pump error E12", k=1), final("T-1071: prime the pump.")])
    agent = Agent(eng, _registry(), memory=memory, config=AgentConfig(max_steps=3))
    result = _run(agent, "Search the past tickets for pump problems")
    assert [(c.name, c.status) for c in result.tool_calls] == [("memory_search", "ok")]
    # the second step may only answer: memory_search is spent, so the answer comes first
    (answer_step,) = _alternatives(eng.calls[1][1].json_schema)
    assert answer_step["properties"]["type"] == {"const": "final"}
    observation = eng.calls[1][0][-1].content
    assert observation.startswith("Observation(memory_search): 1 matching memories found (cite their ids):")


def test_the_answer_step_is_bounded_by_the_clients_max_tokens() -> None:
    eng = ScriptedEngine([final("Order 104208 was delivered.")])
    run_agent(Agent(eng, _registry(), config=AgentConfig()), "Where is order 104208?", max_tokens=40)
    (answer_step,) = _alternatives(eng.calls[0][1].json_schema)
    assert answer_step["properties"]["type"] == {"const": "final"}
    assert eng.calls[0][1].max_tokens == 40 + 12  # the answer plus its JSON wrapper, not step_max_tokens (320)
    # a step that may still call a tool keeps the step cap
    eng = ScriptedEngine([call("inventory_changes", start_date="2025-04-01", end_date="2025-04-30", sku="GR-200"),
                          final("Down by 3.")])
    run_agent(Agent(eng, _registry(), config=AgentConfig()), "Stock of GR-200 between 2025-04-01 and 2025-04-30?",
              max_tokens=40)
    assert eng.calls[0][1].max_tokens == 320


def test_an_answer_stops_before_an_id_no_record_holds() -> None:
    """The model cites the real T-1071, then invents T-1072: the answer ends at the sentence before
    it, the invented id is never streamed, and the trace says why."""
    memory = SubstringMemory({"ticket:T-1071": "Ticket T-1071: pump error E12, air lock; primed the pump."})
    answer = "Yes: T-1071 had an air lock, fixed by priming. The second ticket is T-1072, also primed."
    eng = ScriptedEngine([call("memory_search", query="pump error E12"), final(answer)], chunk=3)
    agent = Agent(eng, _registry(), memory=memory, config=AgentConfig(max_steps=3))
    async def collect() -> tuple[str, Any]:
        text, result = "", None
        request, turn = await turn_for(agent, "Search the past tickets for pump problems")
        async for ev in agent.stream(request, turn):
            if ev.type == "answer_delta":
                text += ev.text
            elif ev.type == "done":
                result = ev.result
        return text, result

    streamed, result = asyncio.run(collect())
    kept = "Yes: T-1071 had an air lock, fixed by priming."
    # the search's record is quoted after the kept answer (grounding.record_note)
    quote = "Record T-1071: Ticket T-1071: pump error E12, air lock; primed the pump."
    assert result.answer == f"{kept}\n\n{quote}"
    assert "T-1072" not in streamed and streamed.startswith(kept) and streamed.endswith(quote)
    guard = [s for s in result.steps if s.kind == "guard"]
    assert len(guard) == 1 and guard[0].data["invented"] == "T-1072"
    # off switch: the answer is kept whole
    eng = ScriptedEngine([call("memory_search", query="pump error E12"), final(answer)])
    result = _run(Agent(eng, _registry(), memory=memory, config=AgentConfig(max_steps=3, check_ids=False)),
                  "Search the past tickets for pump problems")
    assert result.answer == f"{answer}\n\n{quote}"


def test_a_memory_search_is_offered_after_recall_only_when_the_user_asks_for_one() -> None:
    """The demo with its photo: the rules fix orders_by_batch (B-2207 from the label) and add
    memory_search for "happened before"; recall already found the E42 ticket, so the engine's
    only call is the answer. Asked to search, the user still gets the search as step 1."""
    memory = SubstringMemory({"ticket:T-1042": "Ticket T-1042: error E42 after descaling; TF-185 fuse replaced."})
    eng = ScriptedEngine([final("Yes: T-1042, the TF-185 fuse was replaced. Other orders: 104208.")])
    agent = Agent(eng, _registry(), memory=memory, config=AgentConfig(max_steps=3))
    result = _run(agent, "My machine shows error E42. Has this fault happened before? Which other orders come from "
                         "batch B-2207?")
    assert result.route.tools == ["orders_by_batch", "memory_search"]
    assert [c.name for c in result.tool_calls] == ["orders_by_batch"] and len(eng.calls) == 1
    assert "ticket:T-1042" in eng.calls[0][0][-3].content  # the recalled ticket is in the answer's prompt
    eng = ScriptedEngine([call("memory_search", query="error E42"), final("T-1042.")])
    result = _run(Agent(eng, _registry(), memory=memory, config=AgentConfig(max_steps=3)),
                  "Search the past tickets for error E42")
    assert [c.name for c in result.tool_calls] == ["memory_search"]


def test_two_searches_in_one_step_run_once() -> None:
    memory = SubstringMemory({"ticket:T-1130": "Ticket T-1130: weak steam wand, milk residue; descaled the wand."})
    both = json.dumps({"type": "tool_calls", "calls": [
        {"id": "c1", "name": "memory_search", "args": {"query": "weak steam wand"}},
        {"id": "c2", "name": "memory_search", "args": {"query": "steam wand milk"}}]})
    eng = ScriptedEngine([both, final("T-1130: descale the wand.")])
    agent = Agent(eng, _registry(), memory=memory, config=AgentConfig(max_steps=3, routing_rules=False, use_router=False))
    result = _run(agent, "Search memory for past tickets about a weak steam wand.")
    assert [(c.name, c.status) for c in result.tool_calls] == [("memory_search", "ok"), ("memory_search", "refused")]
    assert "at most 1 time(s) per request" in result.tool_calls[1].observation


@pytest.mark.parametrize(("question", "about_me"), [
    ("who are you and what kind of things can you help me with?", True),
    ("What can you do?", True),
    ("Good morning! How are you today?", False),
    ("what can you tell me about order 104208?", False),  # a lookup, not a question about the assistant
    ("你好呀，你都能帮我干些什么？", True),
    ("你可以为我做些什么？", True),
    ("你能帮我查一下天气吗？", False),
])
def test_a_question_about_the_assistant_gets_the_tool_sets_own_answer(question: str, about_me: bool) -> None:
    reg = default_registry(demo=True)
    d = route_by_rules(question, reg.for_scopes(["basic"]), reg.all())
    assert (d.reason == "asks what the assistant is or can do") is about_me
    if about_me and "你" in question:
        assert d.reply.startswith("我是本公司的客服助手，可以帮您处理：calculator and current time")
    elif about_me:  # the tenant's own tools, not the server's
        assert d.reply == ("I'm this company's customer-service assistant. I can help you with: calculator and current "
                           "time. What can I do for you?")


@pytest.mark.parametrize("question", [
    "2025年4月1日到4月30日之间，GR-200的库存一共变动了多少？",
    "从2025年4月1日至30日，GR-200的库存一共变了多少？",
    "How much did the stock of GR-200 change in total between April 1 and April 30, 2025?",
    "What was the total stock change of GR-200 from 1 April 2025 to 30 April 2025?",
])
def test_dates_as_people_write_them_go_to_the_date_taking_tool_not_the_calculator(question: str) -> None:
    reg = default_registry()
    d = route_by_rules(question, reg.for_scopes(DEMO_SCOPES), reg.all())
    assert d.first_step == ["inventory_changes"] and "calculator" not in d.tools, d.reason
    assert d.bindings["inventory_changes"]["start_date"] == ["2025-04-01", "2025-04-30"]


def test_the_model_gets_the_written_dates_as_the_grammars_iso_values() -> None:
    eng = ScriptedEngine([call("inventory_changes", start_date="2025-04-01", end_date="2025-04-30", sku="GR-200"),
                          final("GR-200 的库存变动了 -3。")])
    result = _run(Agent(eng, _registry(), config=AgentConfig()), "2025年4月1日到4月30日，GR-200的库存一共变动了多少？")
    schema = json.dumps(eng.calls[0][1].json_schema)
    assert '"2025-04-01"' in schema and '"2025-04-30"' in schema
    assert [(c.name, c.status) for c in result.tool_calls] == [("inventory_changes", "ok")]


def test_a_date_without_a_year_is_never_given_one() -> None:
    reg = default_registry()
    d = route_by_rules("How did GR-200 stock change between April 1 and April 30?", reg.for_scopes(DEMO_SCOPES), reg.all())
    assert "start_date" not in d.bindings.get("inventory_changes", {})


@pytest.mark.parametrize(("question", "first", "reply"), [
    ("KT-17 从2025-09-01到10月31日库存变了多少", ["inventory_changes"], ""),  # the year of the ISO date before it
    ("1347块三个人平摊，每人要出多少？", ["calculator"], ""),  # 三个人: a count in Chinese numerals
    ("帮我把订单104455的收货地址改成柏林", [], "抱歉，我这里无法修改订单的配送"),
    ("订单104208坏了，我要退款", [], "抱歉，我这里无法办理退款"),
    ("订单104208的退款多少钱？", ["order_status"], ""),  # a question about a refund is no request for one
    ("请问订单104318的退款进度？", ["order_status"], ""),  # the progress of a refund: a look-up
    ("我想知道退款什么时候到账", [], ""),
    ("可以查一下订单104318的补发情况吗", ["order_status"], ""),
    ("我换了新地址，订单104318还能送到吗", ["order_status"], ""),  # a new address mentioned, no change asked
    ("能不能给我补发一个", [], "抱歉，我这里无法安排换货"),
    ("B-2208的显示屏是谁家供的货？", ["batch_info"], ""),  # who supplied: the batch's parts, not its orders
])
def test_chinese_dates_counts_and_requests_are_read_as_their_english_forms(question: str, first: list[str], reply: str) -> None:
    reg = default_registry()
    d = route_by_rules(question, reg.for_scopes(DEMO_SCOPES), reg.all())
    assert d.first_step == first and d.reply.startswith(reply), d.reason
    if first == ["inventory_changes"]:
        assert d.bindings["inventory_changes"]["end_date"] == ["2025-09-01", "2025-10-31"]


def test_ids_another_tool_takes_are_no_calculator_operands() -> None:
    reg = default_registry()
    tools = reg.for_scopes(DEMO_SCOPES)
    d = route_by_rules("quick check on two orders: 104318 and 104343 - where is each one at?", tools, reg.all())
    assert d.first_step == ["order_status"] and "calculator" not in d.scores
    assert route_by_rules("How much is 3 x 449 EUR each?", tools, reg.all()).first_step == ["calculator"]


def test_every_look_up_a_compound_question_names_is_called_by_the_rules() -> None:
    """An order and a customer: both look-ups run in step 1 without an engine step; the model's only call
    is the answer, with both observations in its prompt."""
    eng = ScriptedEngine([final("Order 104400 was shipped; C-1011 had ticket T-1110.")])
    result = _run(Agent(eng, _registry(), config=AgentConfig()),
                  "What's the status of order 104400, and has customer C-1011 opened any support tickets before?")
    assert sorted((c.name, c.status) for c in result.tool_calls) == [("order_status", "ok"), ("ticket_history", "ok")]
    assert len(eng.calls) == 1
    prompt = "\n".join(m.content for m in eng.calls[0][0])
    assert "Observation(order_status)" in prompt and "Observation(ticket_history)" in prompt
    # a candidate with a free argument (a search query) leaves the step to the model
    eng = ScriptedEngine([call("order_status", order_id="104400"), final("Shipped.")])
    _run(Agent(eng, _registry(), config=AgentConfig(max_steps=2)),
         "Is order 104400 shipped? And search the knowledge base for a weak steam wand.")
    assert eng.calls[0][1].json_schema is not None and "memory_search" in json.dumps(eng.calls[0][1].json_schema)


def test_a_customer_asking_what_is_on_file_or_about_earlier_cases_gets_their_tickets() -> None:
    """A question naming a customer id and asking what is on file, or about previous cases, routes to
    the customer's ticket history (the one tool taking a customer id)."""
    reg = default_registry()
    tools = reg.for_scopes(DEMO_SCOPES)
    for q in ("I'm customer C-1004, what do you have on file for me?",
              "The fan of my machine rattles. Any previous cases like this? Customer C-1002 here."):
        d = route_by_rules(q, tools, reg.all())
        assert "ticket_history" in d.tools and d.bindings["ticket_history"]["customer_id"] == ["C-1004" if "C-1004" in q else "C-1002"], q
