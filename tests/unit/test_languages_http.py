"""Chinese through the HTTP API (issue 39): memory search, context-mode, and E-CoT, beside English.

A recording engine stands in for the model (the pipeline's rendering is what is tested: every
assertion is on the HTTP answer or on the messages the engine received). Memory search runs the
real hybrid retriever over in-process shards with the hashing embedder, so the ranking comes
from the BM25 side's Chinese analysis (``bench languages`` measures the real embedders).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.bench._bilingual_set import BILINGUAL_SET
from recallserve.memory_shards.retrieval import RetrievalParams, local_hybrid_coordinator
from recallserve.serve.agent import Agent, AgentConfig, default_registry
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.context import ContextConfig, ContextManager, LLMSummariser, SessionStore
from recallserve.serve.context.router import build_router as session_router
from recallserve.serve.engine import ChatMessage, GenerationParams
from recallserve.serve.experience import ExperienceConfig, ExperienceService
from recallserve.serve.experience import build_router as experience_router
from recallserve.serve.memory_api import MemoryService
from recallserve.serve.memory_api import build_router as memory_router
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings
from tests.unit.agent.conftest import ScriptedEngine
from tests.unit.test_turn_prompt import RecordingEngine

KEYS = {"sk-acme": "acme", "sk-globex": "globex"}
AUTH = {"Authorization": "Bearer sk-acme"}
# The first message: an id, a titled name, a currency rule and a do-not-call rule.
FIRST = "我是张总，我们公司的客户编号是 KH-60317，所有报价必须用人民币，而且不要在上午十点前给我打电话。"
# The seed's (002) experience, as its JSON gives it: a bank product, rule 27 and three steps.
SEED_CONTEXT = ("某银行发行理财产品A，募集规模50亿元，其中30亿元投资于国债，20亿元投资于企业债。根据《商业银行理财业务监督管理办法》"
                "第二十七条，非标资产投资余额不得超过理财产品净资产的35%。")
SEED_STEPS = ["根据规则第二十七条，需计算非标资产占理财产品净资产的比例。", "企业债属于标准化债权类资产，不属于非标资产范畴。",
              "因此非标资产余额为0，比例为0%，低于35%阈值。"]
# A Chinese segmented reply without labels: the parser reads it by 根据 / 验证 / 综上.
ZH_REPLY = ("某理财产品募集40亿元，25亿元投资国债，15亿元投资企业债。根据《商业银行理财业务监督管理办法》第二十七条，"
            "非标资产不得超过净资产的35%。企业债属于标准化债权类资产。因此非标资产余额为0。验证：0/40=0。综上，不违反比例限制。")


class ChineseEngine(RecordingEngine):
    """Records every prompt; answers segmented calls with :data:`ZH_REPLY`, others with a short text."""

    def _next(self, messages: Sequence[ChatMessage], params: GenerationParams) -> str:
        self.calls.append((list(messages), params))
        if messages and messages[0].content.startswith("Solve the problem"):
            return ZH_REPLY
        if params.json_schema is not None:
            return json.dumps({"tools": []})
        return "好的，已记录。"


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[TestClient, ChineseEngine, ContextManager]]:
    emb = HashingEmbedder(384)
    engine = ChineseEngine()
    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim)

    async def embed(texts: list[str]):  # type: ignore[no-untyped-def]
        return await asyncio.to_thread(emb.embed, texts)

    memory = MemoryService(coord, embed, top_k=8, threshold=0.0)
    context = ContextManager(SessionStore(tmp_path / "sessions.sqlite3"), ContextConfig(summary_keep_recent=2),
                             embed=emb.embed)
    experiences = ExperienceService(ExperienceConfig(data_dir=tmp_path / "exp", max_tokens=96, min_similarity=0.1),
                                    emb.embed)
    auth = Authenticator(KEYS)
    settings = PipelineSettings(write_back=False, agent_overhead_tokens=400)
    pipeline = ChatPipeline(engine, settings, memory=memory, context=context, experiences=experiences)
    routers = [memory_router(memory, auth), experience_router(experiences, auth), session_router(context, auth)]
    with TestClient(create_app(pipeline, auth, routers=routers)) as c:
        yield c, engine, context
    experiences.close()


def _chat(c: TestClient, messages: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    r = c.post("/v1/chat/completions", headers=AUTH,
               json={"model": "recallserve", "user": "u1", "max_tokens": 64, "metadata": meta, "messages": messages})
    assert r.status_code == 200, r.text
    return r.json()


def _text(messages: list[ChatMessage]) -> str:
    return "\n".join(f"{m.role}: {m.content}" for m in messages)


def _recall_at_3(c: TestClient, key: str, lang: int) -> float:
    """Post the set's records of one language as ``key``'s tenant, ask its questions; share right within 3."""
    auth = {"Authorization": f"Bearer {key}"}
    memories = [{"text": pair[lang], "source_id": f"r{i}", "kind": "text"} for i, pair in enumerate(BILINGUAL_SET)]
    assert c.post("/v1/memories", headers=auth, json={"memories": memories}).status_code == 200
    hits = 0
    for i, pair in enumerate(BILINGUAL_SET):
        r = c.post("/v1/memories/search", headers=auth, json={"query": pair[lang + 1], "k": 3, "threshold": -1.0})
        assert r.status_code == 200, r.text
        hits += f"r{i}" in [h["source_id"] for h in r.json()["data"]]
    return hits / len(BILINGUAL_SET)


def test_chinese_memory_search_ranks_as_well_as_the_english_counterpart(rig: Any) -> None:
    """The same 32 records and paraphrased questions, Chinese for one tenant, English for another."""
    c, _, _ = rig
    zh = _recall_at_3(c, "sk-acme", 0)
    en = _recall_at_3(c, "sk-globex", 2)
    # NOTE: before issue 39 a Chinese clause was one BM25 term: 2 of 32 within 3 (bench languages, bm25/whole).
    assert zh >= en - 0.05 and zh >= 0.75, (zh, en)
    # Each tenant sees its own records only: the English question finds nothing among acme's Chinese ones.
    only = c.post("/v1/memories/search", headers=AUTH, json={"query": "printer error E-31", "k": 3, "threshold": -1.0})
    assert all(h["text"] in [p[0] for p in BILINGUAL_SET] for h in only.json()["data"])


def _crosslingual_recall_at_3(retrieval: RetrievalParams) -> float:
    """The set's English records in one tenant, its Chinese questions asked through ``POST /v1/memories/search``."""
    emb = HashingEmbedder(384)
    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim)

    async def embed(texts: list[str]):  # type: ignore[no-untyped-def]
        return await asyncio.to_thread(emb.embed, texts)

    memory = MemoryService(coord, embed, top_k=8, threshold=0.0, retrieval=retrieval)
    auth = Authenticator(KEYS)
    pipeline = ChatPipeline(ChineseEngine(), PipelineSettings(write_back=False), memory=memory)
    with TestClient(create_app(pipeline, auth, routers=[memory_router(memory, auth)])) as c:
        memories = [{"text": pair[2], "source_id": f"r{i}", "kind": "text"} for i, pair in enumerate(BILINGUAL_SET)]
        assert c.post("/v1/memories", headers=AUTH, json={"memories": memories}).status_code == 200
        hits = 0
        for i, pair in enumerate(BILINGUAL_SET):
            r = c.post("/v1/memories/search", headers=AUTH, json={"query": pair[1], "k": 3, "threshold": -1.0})
            assert r.status_code == 200, r.text
            hits += f"r{i}" in [h["source_id"] for h in r.json()["data"]]
    return hits / len(BILINGUAL_SET)


def test_a_chinese_question_finds_the_english_record_through_its_gloss() -> None:
    """Chinese questions over English records (a Chinese customer, English tickets): the query's English gloss
    (CC-CEDICT) is searched beside it; with the gloss off the BM25 side has no shared term to rank by."""
    on = _crosslingual_recall_at_3(RetrievalParams())
    off = _crosslingual_recall_at_3(RetrievalParams(gloss_weight=0.0))
    # NOTE: the hashing embedder carries no meaning across languages: what ranks is the gloss's BM25 list.
    assert on >= 0.5 and on >= off + 0.3, (on, off)


def test_a_chinese_chat_question_gets_the_english_record_in_the_prompt(rig: Any) -> None:
    """The turn's recall searches the Chinese question's gloss too: the English record reaches the model."""
    c, engine, _ = rig
    memories = [{"text": pair[2], "source_id": f"r{i}", "kind": "text"} for i, pair in enumerate(BILINGUAL_SET)]
    assert c.post("/v1/memories", headers=AUTH, json={"memories": memories}).status_code == 200
    found = 0
    for pair in BILINGUAL_SET:
        engine.calls.clear()
        _chat(c, [{"role": "user", "content": pair[1]}])
        found += pair[2] in _text(engine.calls[-1][0])
    # NOTE: 19 of 32 measured with the gloss, 3 with it off (the hashing embedder reads no meaning).
    assert found >= 16, found


def test_a_chinese_rule_is_pinned_and_the_titled_name_kept_once_the_session_grows(rig: Any) -> None:
    c, engine, _ = rig
    sid = "zh-1"
    _chat(c, [{"role": "user", "content": FIRST}], session_id=sid, agent="off")
    filler = "我家的咖啡机最近煮出来的咖啡有点酸，是研磨粗细、粉量还是水温的问题？"
    for i in range(12):
        _chat(c, [{"role": "user", "content": f"第{i}个问题：{filler * 4}"}], session_id=sid, agent="off")
    engine.calls.clear()
    body = _chat(c, [{"role": "user", "content": "报价应该用什么货币？"}], session_id=sid, agent="off",
                 context_mode="summary")
    ctx = body["recallserve"]["context"]
    # The symptom was 0 constraint tokens: the rule was not recognised.
    assert ctx["mode"] == "summary" and ctx["breakdown"]["constraints"] > 0, ctx
    prompt = _text(engine.prompts[-1])
    # The rule is pinned verbatim (a constraint), and 张总 and the id are in the entity table.
    assert FIRST in prompt, prompt
    assert "张总" in prompt and "KH-60317" in prompt and "上午十点" in prompt
    table = c.get(f"/v1/sessions/{sid}", headers=AUTH, params={"user": "u1"})
    assert table.status_code == 200, table.text
    kinds = {(e["kind"], e["value"]) for e in table.json()["entities"]}
    assert {("name", "张总"), ("id", "KH-60317"), ("time", "上午十点")} <= kinds, kinds


def test_the_seed_experience_is_posted_verified_retrieved_and_injected_and_a_chinese_answer_is_segmented(rig: Any) -> None:
    c, engine, _ = rig
    record = {
        "metadata": {"source_model": engine.model_name, "task_domain": "financial_compliance",
                     "topic": "compliance/non-standard-assets"},
        "context": {"raw_text": SEED_CONTEXT, "quantities": [
            {"name": "total_fund", "value": 50, "unit": "billion_cny"},
            {"name": "govt_bond", "value": 30, "unit": "billion_cny"},
            {"name": "corp_bond", "value": 20, "unit": "billion_cny"}]},
        "reasoning": [{"step_id": i + 1, "text": t, "principle": p} for i, (t, p) in enumerate(zip(
            SEED_STEPS, ["regulatory_compliance_principle", "asset_classification_principle",
                         "quantitative_comparison_principle"]))],
        # The seed's boundary test, its amounts as the cleaned context states them (50亿元 = 5000000000).
        "verification": [{"type": "boundary_test", "target": "(5000000000 - 3000000000 - 2000000000) / 5000000000",
                          "expected": "[0, 0.35]"}],
        "outcome": {"answer": "不违反", "confidence": "high", "explanation": "企业债不属于非标资产，故不违反比例限制"},
    }
    posted = c.post("/v1/experiences", headers=AUTH, json=record)
    assert posted.status_code == 201, posted.text
    exp_id = posted.json()["record"]["metadata"]["id"]
    # Verified by code (the check ran and passed), but a yes/no answer is computed by no check: it waits
    # for a reviewer, who labels it correct as the seed's evaluation does; then it is active.
    check = posted.json()["record"]["verification"][0]
    assert (check["status"], check["actual"]) == ("pass", 0.0) and posted.json()["tier"] == "review"
    labelled = c.post(f"/v1/experiences/{exp_id}/label", headers=AUTH, json={"label": "correct"})
    assert labelled.status_code == 200 and labelled.json()["tier"] == "active", labelled.text
    question = "某理财产品募集40亿元，其中25亿元投资国债，15亿元投资企业债，非标资产比例是否超过35%？"
    found = c.post("/v1/experiences/search", headers=AUTH, json={"query": question, "source_model": engine.model_name})
    assert found.status_code == 200 and exp_id in [h["experience"]["record"]["metadata"]["id"] for h in found.json()["hits"]]
    engine.calls.clear()
    body = _chat(c, [{"role": "user", "content": question}], reasoning="segmented",
                 task_domain="financial_compliance")
    meta = body["recallserve"]["experience"]
    assert exp_id in meta["injected"], meta
    prompt = _text(engine.prompts[-1])
    assert SEED_STEPS[2] in prompt, prompt
    # The reply had no labels: read by 根据 / 验证 / 综上 into four segments, the answer after 综上.
    assert meta["parsed"] is True, meta
    assert body["choices"][0]["message"]["content"].strip()


@pytest.mark.parametrize(("line", "chinese"), [("user (fact): 我的订单号是DD4246154361，下周三之前必须发货。", True),
                                              ("user (fact): My order number is ORD-4246154 and it must ship by Friday.", False)])
def test_the_rolling_summary_is_asked_for_in_the_conversations_language(line: str, chinese: bool) -> None:
    engine = ScriptedEngine(["- 订单 DD4246154361" if chinese else "- order ORD-4246154"])
    asyncio.run(LLMSummariser(engine).summarise("", [f"[2026-03-01 10:02] {line}"], 200))
    system = engine.calls[0][0][0].content
    assert ("简体中文" in system) is chinese


class AgentEngine(ScriptedEngine):
    """A model that follows the grammar it is given: calls the one allowed tool, then answers in Chinese."""

    def __init__(self) -> None:
        super().__init__([])

    def _next(self, messages: Sequence[ChatMessage], params: GenerationParams) -> str:
        self.calls.append((list(messages), params))
        if params.json_schema is None:
            return "你好！"
        if "Observation(order_status)" in _text(list(messages)):
            return json.dumps({"thought": "已查到", "type": "final", "answer": "订单104208已送达。"}, ensure_ascii=False)
        return json.dumps({"thought": "查订单", "type": "tool_call", "name": "order_status", "args": {"order_id": "104208"}})


def _ask_agent(question: str) -> tuple[dict[str, Any], AgentEngine]:
    """The JSON answer of ``POST /v1/chat/completions`` (agent on, demo tools, no router model) and the engine."""
    engine = AgentEngine()
    agent = Agent(engine, default_registry(demo=True), config=AgentConfig(max_steps=3, use_router=False))
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), agent=agent)
    with TestClient(create_app(pipeline, Authenticator(KEYS))) as c:
        return _chat(c, [{"role": "user", "content": question}], agent="auto"), engine


def test_a_chinese_question_is_routed_to_its_tool_with_the_id_bound_and_the_answer_comes_back() -> None:
    body, engine = _ask_agent("订单104208现在是什么状态？")
    route = body["recallserve"]["agent"]["route"]
    assert route["route"] == "tools" and route["first_step"] == ["order_status"], route
    # The id written against Chinese text is bound: the rules make the call themselves, with that id.
    assert route["bindings"] == {"order_status": {"order_id": ["104208"]}}
    actions = [st for st in body["recallserve"]["agent"]["steps"] if st["kind"] == "action"]
    assert actions[0]["data"]["calls"][0]["args"] == {"order_id": "104208"}
    # The tool ran on the demo world and its observation reached the model; its prompt asks for the user's language.
    assert any("Observation(order_status)" in _text(m) and "delivered" in _text(m) for m, _ in engine.calls)
    assert all("language of the user's question" in m[0].content for m, _ in engine.calls)
    # After the (English) observation the question is asked again in Chinese, last, with the answer's language.
    last = [m for m, _ in engine.calls if "Observation(order_status)" in _text(m)][-1][-1].content
    assert last.endswith("用中文回答下面这个问题的每一部分（编号和代码照原样写）：订单104208现在是什么状态？"), last
    assert "Using these observations" not in last
    assert body["choices"][0]["message"]["content"] == "订单104208已送达。"


def test_an_order_id_typed_full_width_is_bound_and_read_as_the_same_id() -> None:
    """"订单１０４２０８" (a Chinese input method's full-width digits) is order 104208 to the rules, the tool,
    the model's prompt and the id check: routed, looked up and answered, not cut as an unknown id."""
    body, engine = _ask_agent("订单１０４２０８现在是什么状态？")
    assert body["recallserve"]["agent"]["route"]["bindings"] == {"order_status": {"order_id": ["104208"]}}
    assert any("订单104208现在是什么状态" in _text(m) for m, _ in engine.calls)
    assert body["choices"][0]["message"]["content"] == "订单104208已送达。"


def test_an_order_id_typed_in_two_groups_is_bound_as_one() -> None:
    """"单号是104-208" (read out over the phone in two groups) is order 104208: routed and bound as such."""
    body, _ = _ask_agent("客户来电报的单号是104-208，现在什么状态？")
    route = body["recallserve"]["agent"]["route"]
    assert route["first_step"] == ["order_status"] and route["bindings"] == {"order_status": {"order_id": ["104208"]}}, route
    assert body["choices"][0]["message"]["content"] == "订单104208已送达。"
