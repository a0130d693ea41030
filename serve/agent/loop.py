"""The agent loop (CoT 3.0): recall first, route, then Thought -> Action -> Observation -> answer.

One :class:`Agent` serves many requests; :meth:`Agent.stream` yields trace events and answer
pieces as they happen, :meth:`Agent.run` returns the finished :class:`AgentResult`. The write-back
of the exchange (PII-masked) is returned as ``result.memory_writes`` for the caller to schedule
off the request path with :meth:`Agent.write_back`.

Per request, on the :class:`~recallserve.serve.turn.Turn` the pipeline built (its images already
described and OCR'd, its one memory recall already made: the agent reads them, never redoes them):
1. the images and the recalled memories become trace steps;
2. the routing rules (:mod:`recallserve.serve.agent.routing`), or the router model when they are undecided,
   decide ``direct`` or ``tools``, which tools (a subset of the tenant's scopes) and which ones
   the first step must call;
3. up to ``max_steps`` reasoner steps, each one JSON object constrained by a schema; bad JSON is
   retried once, then reported back as an observation; calls run through :class:`StepExecutor`,
   and the rules' bindings decide which calls are left (:mod:`recallserve.serve.agent._calls`);
4. out of steps or time -> a partial answer stating what is known and what is missing. Every
   engine call runs under the request deadline and adds to its usage
   (:class:`recallserve.serve.agent._metered.MeteredCalls`).

Every prompt is the turn rendered by :func:`recallserve.serve.turn.render_prompt` under the call's head
(protocol + tools, direct answer, router): the client's system prompt, the context-mode block and
the history the token budget kept reach every engine call; the agent cuts no history of its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from recallserve.serve.agent._cache import TTLCache
from recallserve.serve.agent._calls import determined_calls, spent_tools
from recallserve.serve.agent._executor import StepExecutor
from recallserve.serve.agent._metered import Deadline, MeteredCalls
from recallserve.serve.agent._prompts import PARTIAL_INSTRUCTION, RETRY_INSTRUCTION, ROUTER_INSTRUCTION, direct_prompt, \
    system_prompt
from recallserve.serve.agent._protocol import FINAL_WRAPPER_TOKENS, THOUGHT_MAX_CHARS, AnswerStream, ParsedCall, ParsedStep, \
    StepParseError, is_final_only, parse_json_object, parse_step, router_schema, step_schema
from recallserve.serve.agent.builtin import DERIVED_KIND
from recallserve.serve.agent.config import AgentConfig
from recallserve.serve.agent.grounding import CLOSE_COSINE, NOT_SEARCHED, NOT_SHOWN, Search, list_note, no_record_note, record_note, status_note, \
    turn_searches, unfound_topic, unstated_absence, unsupported_absence, unsupported_presence
from recallserve.serve.agent.guards import AnswerCheck, wrap_untrusted
from recallserve.serve.agent.images import ImageDescriber
from recallserve.serve.agent.routing import route_by_rules
from recallserve.serve.agent.schemas import AgentEvent, AgentRequest, AgentResult, AgentUsage, RouteDecision, ToolCallRecord, \
    TraceStep
from recallserve.serve.agent.tools import ToolContext, ToolRegistry, ToolSet
from recallserve.serve.engine import ChatMessage, EngineError, GenerationParams, LLMEngine
from recallserve.serve.language import language_of
from recallserve.serve.memory import MemoryBackend, MemoryWrite, cited_sources, derived_metadata, is_derived
from recallserve.serve.pii import apply_pii, for_write_back
from recallserve.serve.turn import RecallConfig, Turn, render_prompt

__all__ = ["Agent"]

log = logging.getLogger("recallserve.serve.agent")

#: What a turn that must not use the cache gets: a TTL of 0 stores nothing and finds nothing.
_NO_CACHE = TTLCache(0, 1)


class Agent:
    """Router + reasoner + tools + memory, wired for one deployment.

    Args:
        reasoner: engine of the loop steps.
        tools: every tool of the server; each request gets the subset its scopes allow.
        router: engine of the routing decision (default: the reasoner).
        memory: memory backend for recall and the ``memory_search`` tool (None = no memory).
        config: loop settings.
        recall: how memories are shown in the prompt (the pipeline recalled them with the same settings).
        describer: vision model for image captions (GPU profiles); None = pixel description.

    Example:
        >>> agent = Agent(engine, registry, memory=backend)  # doctest: +SKIP
        >>> turn, _ = await pipeline.build_turn(chat_request, ctx)  # doctest: +SKIP
        >>> result = await agent.run(AgentRequest(tenant="t1"), turn)  # doctest: +SKIP
    """

    def __init__(
        self, reasoner: LLMEngine, tools: ToolRegistry, *, router: LLMEngine | None = None,
        memory: MemoryBackend | None = None, config: AgentConfig | None = None,
        recall: RecallConfig | None = None, describer: ImageDescriber | None = None, cache: TTLCache | None = None,
    ) -> None:
        self.reasoner = reasoner
        self.router = router or reasoner
        self.tools = tools
        self.memory = memory
        self.config = config or AgentConfig()
        self.recall = recall or RecallConfig()
        self.describer = describer
        self.cache = cache if cache is not None else TTLCache(self.config.cache_ttl_s, self.config.cache_max_entries)

    async def run(self, request: AgentRequest, turn: Turn) -> AgentResult:
        """Run the loop to the end and return the result (see :meth:`stream`)."""
        result: AgentResult | None = None
        async for event in self.stream(request, turn):
            if event.type == "done":
                result = event.result
        assert result is not None  # NOTE: stream() always ends with a done event.
        return result

    async def stream(self, request: AgentRequest, turn: Turn) -> AsyncIterator[AgentEvent]:
        """Yield ``trace`` events, ``answer_delta`` pieces of the final answer, then ``done``.

        Args:
            request: who asks, the scopes and the mode.
            turn: the turn :meth:`recallserve.serve.pipeline.ChatPipeline.build_turn` built (budgeted
                history, context block, analysed images, recalled memories).
        """
        async for event in _Run(self, request, turn).events():
            yield event

    async def warm_up(self, scopes: list[str]) -> float:
        """Evaluate the stable system prefix of ``scopes``' tool set once (fills the prompt cache).

        Call it at deployment start: the first request otherwise pays the whole prefix prefill
        (~1.3k tokens, ~9 s for the 1.5B model on 2 idle cores). Returns the seconds it took.
        """
        t = time.perf_counter()
        tools = self.tools.for_scopes(scopes)
        # NOTE: the direct prompt first, the tool prompt last: the live cache then holds the tool
        # prefix and the engine's saved states (deployments.engines._prefix_states) hold both.
        for system in (direct_prompt(tools), system_prompt(tools)):
            msgs = render_prompt(Turn(question="hello"), system, self.recall)
            await self.reasoner.chat(msgs, GenerationParams(max_tokens=1, temperature=0.0))
        return time.perf_counter() - t

    def first_prompt(self, turn: Turn, request: AgentRequest) -> list[ChatMessage]:
        """The prompt of the run's first reasoner call, before routing: a direct answer's when the
        request allows no tool (mode ``off``, or no tool in its scopes), else a loop step's over all
        its tools (the largest a routed step can get: routing only narrows the tools).
        """
        tools = self.tools.for_scopes(request.scopes)
        if request.mode == "off" or not tools:
            return render_prompt(turn, direct_prompt(tools), self.recall)
        return render_prompt(turn, system_prompt(tools), self.recall)

    async def write_back(self, tenant: str, result: AgentResult) -> list[str]:
        """Store ``result.memory_writes`` (already PII-masked); call it off the request path."""
        if self.memory is None or not result.memory_writes:
            return []
        return await self.memory.write(tenant, result.memory_writes)


class _Run:
    """State of one request."""

    def __init__(self, agent: Agent, request: AgentRequest, turn: Turn) -> None:
        self.a = agent
        self.cfg = agent.config
        self.req = request
        self.turn = turn
        self.prompt: list[ChatMessage] = []  # NOTE: what the reasoner call received before any step (the trace's)
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + self.cfg.request_timeout_s
        self.trace: list[TraceStep] = []
        self.calls: list[ToolCallRecord] = []
        self.usage = AgentUsage()
        self.engine = MeteredCalls(self.deadline, self.cfg.engine_timeout_s, self.usage)
        self.first_token_ms: float | None = None
        self._streamed = ""
        self._cut = False  # NOTE: the direct answer's generation stopped at max_tokens
        self._pending_note = ""  # NOTE: NOT_SEARCHED, added after an answer whose claim of absence was left out
        self.question = self.turn.asked

    def _ms(self, since: float) -> float:
        return round((time.perf_counter() - since) * 1e3, 2)

    def _guard(self, step: int, check: AnswerCheck) -> AgentEvent:
        """The trace step of a stopped answer: why, and the invented id or the repeated sentence."""
        data = {"invented": check.invented} if check.invented is not None else {"repeated": (check.repeated or "")[:200]}
        return self._add(step, "guard", check.reason, **data)

    def _add(self, step: int, kind: str, content: str, elapsed_ms: float = 0.0, **data: Any) -> AgentEvent:
        item = TraceStep(step=step, kind=kind, content=content, elapsed_ms=elapsed_ms, data=data)
        self.trace.append(item)
        return AgentEvent(type="trace", step=item)

    # -- engine calls ---------------------------------------------------------------------------
    def _searches(self) -> list[Search]:
        """The turn's record of searches so far: its recall (when it ran) and the tool calls made."""
        ran = self.a.memory is not None and self.a.recall.enabled and not self.turn.memory_error
        return turn_searches(ran, [h.text for h in self.turn.memories], self.calls, self._close())

    def _close(self) -> list[str]:
        """The recalled source records as close to the question as a paraphrase (cosine >= :data:`CLOSE_COSINE`)."""
        return [h.text for h in self.turn.memories if not is_derived(h) and h.similarity >= CLOSE_COSINE]

    def _tool_words(self) -> list[str]:
        """The descriptions of the agent's tools: the words of a question's live-data part, which say
        nothing about the fault a history question asks for (:func:`~recallserve.serve.agent.grounding.fault_words`)."""
        return [t.description for t in self.a.tools.all()]

    def _answer_check(self, messages: list[ChatMessage]) -> AnswerCheck | None:
        """An :class:`AnswerCheck` whose evidence is ``messages`` (the prompt) and whose claims of
        absence are checked against the searches made so far, or None when its rules are off."""
        if not (self.cfg.check_ids or self.cfg.stop_repeats or self.cfg.check_absence):
            return None
        claims = None
        if self.cfg.check_absence:
            searches = self._searches()
            known = self._tool_words()
            claims = lambda sentence: bool(unsupported_absence(sentence, searches, self.question, known)  # noqa: E731
                                           or unsupported_presence(sentence, searches, self.question, known))
        return AnswerCheck("\n".join(m.content for m in messages), ids=self.cfg.check_ids,
                           repeats=self.cfg.stop_repeats, claims=claims)

    def _record_note(self, answer: str) -> str:
        """The quote of the record a history question or the turn's memory search rests on (:func:`record_note`), "" when none."""
        if not self.cfg.quote_record:
            return ""
        sources = [(h.source_id, h.text) for h in self.turn.memories if not is_derived(h)]
        searched = False
        for call in self.calls:
            if call.name == "memory_search" and call.status in ("ok", "cached") and isinstance(call.result, list):
                searched = True
                sources += [(str(h.get("id", "")), str(h.get("text", ""))) for h in call.result
                            if isinstance(h, dict) and h.get("kind") != DERIVED_KIND]
        known = self._tool_words()
        return record_note(self.question, sources, answer, searched=searched, known=known,
                           unfound=unfound_topic(self._searches(), self.question, known), close=self._close())

    def _list_note(self, answer: str) -> str:
        """What code renders from the turn's observations after the answer, "" when none: the listings a
        "which / list / how many" question asked for (:func:`list_note`) and the statuses of looked-up
        records the answer does not state (:func:`status_note`)."""
        listings = []
        for call in self.calls:
            tool = self.a.tools.get(call.name)
            if call.status in ("ok", "cached") and tool is not None:
                listings.append((call.name, call.result, wrap_untrusted(tool.summarise(call.result))[0]))
        notes = [list_note(self.question, listings, answer), status_note(self.question, [(n, r) for n, r, _ in listings], answer)]
        return "\n".join(n for n in notes if n)

    def _not_searched(self, step: int, check: AnswerCheck) -> AgentEvent | None:
        """After an answer whose claims of absence were left out: the trace step, and when no search
        ran at all, the sentence saying the agent did not look (streamed, in the answer); after a claim
        of an earlier case that no search supports (:func:`unsupported_presence`), the sentence saying
        that no record searched names the question's code or holds its fault's words, which an answer to
        a history question about such a fault also gets when it does not say so itself (:func:`unstated_absence`)."""
        searches, known = self._searches(), self._tool_words()
        if not check.dropped:
            if self.cfg.check_absence and unstated_absence(check.answer, searches, self.question, known):
                self._pending_note = no_record_note(self.question, unfound_topic(searches, self.question, known))
                return self._add(step, "guard", "the answer does not say that no record searched holds what the question asks about")
            return None
        if any(unsupported_presence(d, searches, self.question, known) for d in check.dropped):
            self._pending_note = no_record_note(self.question, unfound_topic(searches, self.question, known))
            return self._add(step, "guard", "left out a claim of an earlier case no search of this turn supports",
                             dropped=[d[:200] for d in check.dropped])
        if not any(s.ran for s in searches):
            self._pending_note = NOT_SEARCHED
        elif not check.answer:
            self._pending_note = NOT_SHOWN
        return self._add(step, "guard", "left out a claim of absence no search of this turn supports",
                         dropped=[d[:200] for d in check.dropped])

    def _step_tokens(self, schema: dict[str, Any]) -> int:
        """Most tokens a step may generate: ``agent.step_max_tokens``, and when the step can only be
        the answer, the client's ``max_tokens`` plus the JSON around the answer.

        NOTE: measured on cpu-local (bench chat "demo", max_tokens 200): the answer step ran to the
        step cap of 320 tokens, ~25 s of generation the client had not asked for.
        """
        if self.req.max_answer_tokens and is_final_only(schema):
            return min(self.cfg.step_max_tokens, self.req.max_answer_tokens + FINAL_WRAPPER_TOKENS)
        return self.cfg.step_max_tokens

    def _params(self, schema: dict[str, Any] | None, max_tokens: int, *, client: bool = True) -> GenerationParams:
        """Sampling of one call: the client's temperature, top_p, seed and penalties where it writes the answer
        (``client``: a step, a direct answer), else (the router) the agent's own."""
        temperature, seed = self.cfg.temperature, self.cfg.seed
        extra: dict[str, Any] = {}
        if client:
            temperature = self.req.temperature if self.req.temperature is not None else temperature
            seed = self.req.seed if self.req.seed is not None else seed
            extra = {"top_p": self.req.top_p} if self.req.top_p is not None else {}
            extra.update(presence_penalty=self.req.presence_penalty, frequency_penalty=self.req.frequency_penalty)
        return GenerationParams(max_tokens=max_tokens, temperature=temperature, seed=seed, json_schema=schema, **extra)

    # -- phases ---------------------------------------------------------------------------------
    def _images(self) -> list[AgentEvent]:
        """The turn's analysed images as trace steps."""
        ms = self.turn.timings.images_ms
        return [self._add(0, "image", unit.note(), ms, index=i, sha256=unit.sha256, ocr_chars=len(unit.ocr_text))
                for i, unit in enumerate(self.turn.images)]

    def _recall(self) -> list[AgentEvent]:
        """The turn's recalled memories as one trace step (none without a memory tier or with recall off)."""
        if self.a.memory is None or not self.a.recall.enabled:
            return []
        hits = self.turn.memories
        return [self._add(0, "memory", f"{len(hits)} memories recalled", self.turn.timings.recall_ms,
                          error=self.turn.memory_error or None,
                          hits=[{"source_id": h.source_id, "kind": h.kind, "score": round(h.score, 4)} for h in hits])]

    async def _route(self, tools: ToolSet, base: list[ChatMessage]) -> RouteDecision:
        t = time.perf_counter()
        if not tools:
            return RouteDecision(route="direct", source="no_tools")
        if self.req.mode == "off":
            return RouteDecision(route="direct", source="mode")
        if self.req.mode == "on":
            return RouteDecision(route="tools", tools=list(tools), source="mode")
        if self.cfg.routing_rules:
            rules = route_by_rules(self.turn.recall_query(), tools, self.a.tools.all())
            if rules.route != "undecided":
                return RouteDecision(route=rules.route, tools=rules.tools, source="rules", first_step=rules.first_step,
                                     bindings=rules.bindings, reason=rules.reason, advice=rules.advice,
                                     reply=rules.reply if self.cfg.rule_replies else "", elapsed_ms=self._ms(t))
        if not self.cfg.use_router:
            return RouteDecision(route="tools", tools=list(tools), source="mode")
        msgs = base[:-1] + [ChatMessage(role="user", content=base[-1].content + ROUTER_INSTRUCTION)]
        try:
            params = self._params(router_schema(tools), self.cfg.router_max_tokens, client=False)
            text = await self.engine.chat(self.a.router, msgs, params)
            obj = parse_json_object(text)
            listed = obj.get("tools")
            if not isinstance(listed, list):
                raise StepParseError(f"tools: expected a list, got {type(listed).__name__}")
        except (StepParseError, EngineError) as exc:
            log.warning("router failed (%s); running the loop with all tools", exc)
            return RouteDecision(route="tools", tools=list(tools), source="fallback", elapsed_ms=self._ms(t))
        # NOTE: names outside the tenant's tools are dropped: the router can narrow, never widen.
        names = list(dict.fromkeys(n for n in listed if isinstance(n, str) and n in tools))
        if listed and not names:
            names = list(tools)
        return RouteDecision(route="tools" if names else "direct", tools=names, source="router",
                             elapsed_ms=self._ms(t))

    def _base_messages(self, tools: ToolSet) -> list[ChatMessage]:
        return render_prompt(self.turn, system_prompt(tools), self.a.recall)

    # -- the run --------------------------------------------------------------------------------
    async def events(self) -> AsyncIterator[AgentEvent]:
        # NOTE: the question's size, never its text: message content stays out of logs (an erasure
        # cannot reach a log line; issue 41).
        log.info("agent request tenant=%s question_chars=%d", self.req.tenant, len(self.question))
        for ev in [*self._images(), *self._recall()]:
            yield ev
        toolset = self.a.tools.for_scopes(self.req.scopes)
        messages = self._base_messages(toolset)
        self.prompt = list(messages)
        answer: str | None = None
        finish = "final"
        try:
            route = await self._route(toolset, messages)
        except Deadline:
            route = RouteDecision(route="direct", source="fallback")
            answer, finish = self._partial_text("the time limit was reached"), "timeout"
        yield self._add(0, "route", f"{route.route} {route.tools}", route.elapsed_ms, route=route.route,
                        tools=route.tools, source=route.source, first_step=route.first_step, reason=route.reason)
        if answer is None and route.route == "direct":
            try:
                async for ev in self._answer_directly(messages, route):
                    yield ev
                answer = self._streamed.strip() or self._partial_text("the model returned an empty answer")
            except Deadline:
                finish, answer = "timeout", self._partial_text("the time limit was reached")
            except EngineError as exc:
                finish, answer = "engine_error", self._partial_text(f"the model failed ({exc})")
        if answer is None:
            allowed = toolset.subset(route.tools)
            if self.turn.memories and route.source == "rules":
                # NOTE: recall already searched the memories with the question (and the photo's
                # text); a second search the model words itself is offered only when the user
                # asked for one (the rules' first step). Measured on the demo with its photo: two
                # memory_search steps (~25 s) recalled nothing the recalled E42 tickets lacked.
                allowed = ToolSet(t for n, t in allowed.items() if not t.covered_by_recall or n in route.first_step)
            tools_ctx = ToolContext(self.req.tenant, frozenset(self.req.scopes), self.a.memory, self.req.user)
            # NOTE: a turn of a lately erased user reads and fills no cache (Turn.uncached).
            cache = _NO_CACHE if self.turn.uncached else self.a.cache
            executor = StepExecutor(allowed, tools_ctx, cache, self.cfg.observation_max_chars,
                                    evidence="\n".join(m.content for m in messages))
            parallel = self.cfg.allow_parallel_calls
            bindings = route.bindings if route.source == "rules" else None
            schema = step_schema(allowed, allow_parallel=parallel and len(allowed) > 0, bindings=bindings)
            first_step = list(route.first_step)
            recalled = self._searches()[0].ran
            if route.source == "rules" and not recalled and "memory_search" in allowed and first_step:
                # NOTE: the question asks for history (memory_search's rule matched) and the turn's
                # recall did not run (it failed): the first step may search rather than answer from
                # live data alone, which left "it has not happened before" resting on no search.
                first_step.append("memory_search")
            first = allowed.subset(first_step)
            # NOTE: the rules found evidence for these tools (an id, numbers to compute): the first
            # step must call one of them rather than answer from the model's own guess.
            first_schema = step_schema(first, allow_parallel=parallel, allow_final=False, bindings=bindings) \
                if first else schema
            max_steps = self.req.max_steps or self.cfg.max_steps
            fixed = determined_calls(first, bindings, several=parallel, candidates=allowed.subset(route.tools)) \
                if bindings is not None and self.cfg.rule_first_call else []
            try:
                for step in range(1, max_steps + 1):
                    parsed: ParsedStep | None = None
                    steps = self._rule_step(fixed, messages) if step == 1 and fixed \
                        else self._step(step, messages, first_schema if step == 1 else schema)
                    async for ev in steps:
                        if isinstance(ev, ParsedStep):
                            parsed = ev
                        else:
                            yield ev
                    if parsed is None:
                        continue  # NOTE: the parse error went back as an observation; the step is spent.
                    if parsed.type == "final":
                        answer = parsed.answer
                        yield self._add(step, "final", answer)
                        break
                    t = time.perf_counter()
                    records = await executor.run_step(step, parsed.calls)
                    self.calls.extend(records)
                    if all(r.status == "refused" for r in records):
                        # NOTE: a step of refused calls only (repeats, tools out of scope) cannot make
                        # progress by calling again; the next step may only answer (measured: the 1.5B
                        # model otherwise repeats a not-found lookup until the step limit).
                        schema = step_schema(ToolSet([]), allow_parallel=False)
                    else:
                        spent = spent_tools(allowed, bindings or {}, self.calls)
                        if spent:
                            # NOTE: a tool whose calls used every value the question gives for it
                            # leaves the grammar (measured: the 1.5B model repeated a successful
                            # call once before answering, ~14 s).
                            left = ToolSet(t for n, t in allowed.items() if n not in spent)
                            schema = step_schema(left, allow_parallel=parallel and len(left) > 0, bindings=bindings)
                    obs_lines = []
                    for rec in records:
                        obs_lines.append(f"Observation({rec.name}): {rec.observation}")
                        yield self._add(step, "observation", obs_lines[-1], rec.elapsed_ms, call_id=rec.id,
                                        status=rec.status)
                    observed = "\n".join(obs_lines)
                    messages.append(ChatMessage(role="user", content=observed + self._reminder()))
                    log.info("step %d calls=%s in %.0f ms", step, [(r.name, r.status) for r in records], self._ms(t))
                else:
                    finish = "max_steps"
                    answer = await self._forced_final(messages)
            except Deadline:
                finish, answer = "timeout", self._partial_text("the time limit was reached")
            except EngineError as exc:
                finish, answer = "engine_error", self._partial_text(f"the model failed ({exc})")
        if finish == "final" and route.route == "direct":
            finish = "direct"
        assert answer is not None
        if finish in ("timeout", "engine_error", "max_steps"):
            yield self._add(len(self.trace), "partial", answer, reason=finish)
        # NOTE: the streamed text can differ from the parsed answer by surrounding whitespace only.
        if not self._streamed.strip():
            yield self._delta(answer)
        elif answer.startswith(self._streamed) and len(answer) > len(self._streamed):
            yield self._delta(answer[len(self._streamed) :])
        result = AgentResult(
            answer=answer, finish_reason=finish, partial=finish in ("timeout", "engine_error", "max_steps"),
            cut_by_length=self._cut and finish == "direct",
            route=route, steps=self.trace, tool_calls=self.calls,
            memory_hits=[{"id": h.id, "source_id": h.source_id, "kind": h.kind, "score": round(h.score, 4),
                          "text": h.text[:300]} for h in self.turn.memories],
            usage=self.usage, elapsed_ms=self._ms(self.t0), first_token_ms=self.first_token_ms,
            memory_writes=self._writes(answer, partial=finish in ("timeout", "engine_error", "max_steps")),
            prompt=self.prompt,
            searches=[{"source": s.source, "ran": s.ran, "found": [f[:300] for f in s.found[:16]]}
                      for s in self._searches()],
        )
        yield AgentEvent(type="done", result=result)

    async def _answer_directly(self, messages: list[ChatMessage], route: RouteDecision) -> AsyncIterator[AgentEvent]:
        """A direct route: one plain-text answer over the same history and user turn (memories,
        image notes), without the JSON protocol or the tool list; streamed as it is generated."""
        if route.reply:
            # NOTE: measured: advised to ask for a 6-digit id, the 1.5B model still answered "No,
            # order 10423 is not delivered"; told to decline a cancel, it invented a reason. The
            # rule's own text cannot contradict the rule, and costs no engine call.
            yield self._delta(route.reply)
            yield self._add(1, "final", route.reply, 0.0)
            return
        msgs = render_prompt(self.turn, direct_prompt(self.a.tools.for_scopes(self.req.scopes), route.advice),
                             self.a.recall)
        self.prompt = list(msgs)
        params = self._params(None, self.req.max_answer_tokens or self.cfg.step_max_tokens)
        t = time.perf_counter()
        check = self._answer_check(msgs)
        async with aclosing(self.engine.stream(self.a.reasoner, msgs, params)) as deltas:
            begun = False  # NOTE: text was generated (the check may hold it back from the stream)
            async for piece in deltas:
                if not begun and not piece.strip():
                    continue  # NOTE: no leading whitespace in the answer
                piece = piece.lstrip() if not begun else piece
                begun = True
                safe = check.feed(piece) if check is not None else piece
                if safe:
                    yield self._delta(safe)
                if check is not None and check.stopped:
                    break
        self._cut = self.engine.last_finish == "length"
        if check is not None:
            rest = check.flush()
            if rest:
                yield self._delta(rest)
            if check.stopped:
                self._streamed = check.answer
                self._cut = False
                yield self._guard(1, check)
            note = self._not_searched(1, check)
            if note is not None:
                yield note
            if self._pending_note:
                yield self._delta((" " if self._streamed.strip() else "") + self._pending_note)
        quote = self._record_note(self._streamed) if self._streamed.strip() else ""
        if quote:
            yield self._delta("\n\n" + quote)
        yield self._add(1, "final", self._streamed.strip(), self._ms(t))

    def _reminder(self) -> str:
        """The question again after the observations.

        NOTE: measured on the demo: after one observation the 1.5B model answered only the last
        sentence of a three-part question and ignored the recalled tickets (far above in the
        prompt); restating the question at the end, where small models attend most, fixes that.
        """
        if language_of(self.question) == "zh":
            # NOTE: in Chinese, and saying so: after English observations and records the 1.5B model answered a
            # Chinese question in English in 136 of 290 eval runs' answers (sessions 6-9, the step prompt's
            # "the language of the user's question" notwithstanding: it is far above).
            memories = "和上面召回的记忆" if self.turn.memories else ""
            return f"\n\n请根据这些观察结果{memories}，用中文回答下面这个问题的每一部分（编号和代码照原样写）：{self.question[:600]}"
        memories = " and the recalled memories above" if self.turn.memories else ""
        return f"\n\nUsing these observations{memories}, answer every part of: {self.question[:600]}"

    def _delta(self, text: str) -> AgentEvent:
        if self.first_token_ms is None:
            self.first_token_ms = self._ms(self.t0)
        self._streamed += text
        return AgentEvent(type="answer_delta", text=text)

    async def _step(self, step: int, messages: list[ChatMessage], schema: dict[str, Any]) -> AsyncIterator[Any]:
        """One reasoner step with one retry on a bad reply; yields events and finally the ParsedStep."""
        attempt_msgs = list(messages)
        error = ""
        for attempt in (0, 1):
            t = time.perf_counter()
            extractor = AnswerStream()
            check = self._answer_check(attempt_msgs)
            async with aclosing(self.engine.stream(self.a.reasoner, attempt_msgs, self._params(schema, self._step_tokens(schema)))) as deltas:
                async for piece in deltas:
                    new = extractor.feed(piece)
                    safe = check.feed(new) if check is not None and new else new
                    if safe:
                        yield self._delta(safe)
                    if check is not None and check.stopped:
                        break  # NOTE: stops the generation: nothing after an invented id or a repeat is kept
            text = extractor.buf
            try:
                parsed = parse_step(text)
            except StepParseError as exc:
                error = str(exc)
                yield self._add(step, "parse_error", error, self._ms(t), attempt=attempt, raw=text[:500])
                attempt_msgs = messages + [ChatMessage(role="assistant", content=text[:2000] or "(empty)"),
                                           ChatMessage(role="user", content=RETRY_INSTRUCTION.format(error=error))]
                continue
            if parsed.thought:
                yield self._add(step, "thought", parsed.thought, self._ms(t))
            if parsed.type == "final" and check is not None:
                rest = check.flush()
                if rest:
                    yield self._delta(rest)
                note = self._not_searched(step, check)
                if note is not None:
                    yield note
                    parsed.answer = check.answer
                    if self._pending_note:
                        parsed.answer = f"{parsed.answer} {self._pending_note}".strip()
                        yield self._delta((" " if self._streamed.strip() else "") + self._pending_note)
                if check.stopped:
                    parsed.answer = check.answer or self._partial_text(check.reason)
                    if note is not None and self._pending_note:  # NOTE: the note streamed above stays in the answer
                        parsed.answer = f"{parsed.answer} {self._pending_note}".strip()
                    yield self._guard(step, check)
            if parsed.type == "final" and parsed.answer.strip():
                listed = self._list_note(parsed.answer)
                if listed:
                    parsed.answer = f"{parsed.answer.rstrip()}\n\n{listed}"
                    yield self._delta("\n\n" + listed)
                quote = self._record_note(parsed.answer)
                if quote:
                    parsed.answer = f"{parsed.answer.rstrip()}\n\n{quote}"
                    yield self._delta("\n\n" + quote)
            if parsed.type != "final":
                yield self._add(step, "action", json.dumps([{"name": c.name, "args": c.args} for c in parsed.calls]),
                                calls=[{"id": c.id, "name": c.name, "args": c.args} for c in parsed.calls])
            messages.append(ChatMessage(role="assistant", content=text.strip()))
            yield parsed
            return
        messages.append(ChatMessage(role="assistant", content=text[:2000] or "(empty)"))
        messages.append(ChatMessage(role="user", content=f"Observation(parser): error: {error}. "
                                    "Reply with exactly one JSON object as the protocol says."))

    async def _rule_step(self, calls: list[ParsedCall], messages: list[ChatMessage]) -> AsyncIterator[Any]:
        """Step 1 when the rules determined its calls: no engine call, the same events and history.

        The calls go into the history as the JSON step the model would have written (thought
        included: one ``tool_call``, or a ``tool_calls`` step for several), so the next step's prompt
        reads as if the model had made it. NOTE: measured on cpu-local, the model's own step 1 here
        generated ~60 tokens (a thought plus the call the grammar allowed) and re-evaluated the user
        turn: 4-8 s of a one-tool turn on 2 idle cores.
        """
        given = "; ".join(", ".join(f"{k} {v}" for k, v in c.args.items()) or "no arguments" for c in calls)
        names = " and ".join(dict.fromkeys(c.name for c in calls))
        thought = f"The question gives {given}: call {names}."[:THOUGHT_MAX_CHARS]
        if len(calls) == 1:
            step: dict[str, Any] = {"thought": thought, "type": "tool_call", "name": calls[0].name, "args": calls[0].args}
        else:
            step = {"thought": thought, "type": "tool_calls",
                    "calls": [{"id": c.id, "name": c.name, "args": c.args} for c in calls]}
        yield self._add(1, "thought", thought, 0.0, source="rules")
        yield self._add(1, "action", json.dumps([{"name": c.name, "args": c.args} for c in calls]),
                        calls=[{"id": c.id, "name": c.name, "args": c.args} for c in calls], source="rules")
        messages.append(ChatMessage(role="assistant", content=json.dumps(step, ensure_ascii=False)))
        yield ParsedStep(type="tool_call" if len(calls) == 1 else "tool_calls", thought=thought, calls=calls)

    async def _forced_final(self, messages: list[ChatMessage]) -> str:
        if not self.cfg.model_partial_answer:
            return self._partial_text(f"the step limit ({self.req.max_steps or self.cfg.max_steps}) was reached")
        msgs = messages + [ChatMessage(role="user", content=PARTIAL_INSTRUCTION)]
        schema = step_schema(ToolSet([]), allow_parallel=False)
        try:
            text = await self.engine.chat(self.a.reasoner, msgs, self._params(schema, self._step_tokens(schema)))
            parsed = parse_step(text)
            if parsed.type == "final":
                return parsed.answer
        except (StepParseError, EngineError) as exc:
            log.warning("forced final answer failed: %s", exc)
        return self._partial_text(f"the step limit ({self.req.max_steps or self.cfg.max_steps}) was reached")

    def _partial_text(self, reason: str) -> str:
        known = [f"- {c.name}({json.dumps(c.args, ensure_ascii=False)}): {c.observation[:200]}"
                 for c in self.calls if c.status in ("ok", "cached")]
        known_text = "\n".join(known) if known else "- nothing confirmed by tools yet"
        return (f"I could not finish because {reason}. What I found so far:\n{known_text}\n"
                f"Still missing: a verified answer to \"{self.question[:200]}\".")

    def _writes(self, answer: str, *, partial: bool) -> list[MemoryWrite]:
        """Image units always; the exchange only when the loop reached a real answer (a partial
        "I could not finish" text is not worth remembering)."""
        session = self.req.session_id
        writes = [u.to_memory_write(session) for u in self.turn.images]
        if partial:
            return writes
        tools_used = ",".join(sorted({c.name for c in self.calls if c.status in ("ok", "cached")}))
        text = apply_pii(f"User asked: {self.question}\nAgent answered: {answer}", for_write_back(self.req.pii))
        digest = hashlib.sha256(f"{session}|{self.question}|{answer}".encode()).hexdigest()[:16]
        # NOTE: the answer is a conclusion, stored as derived with the records it cited: the memory tier
        # ranks it below every source record, and the chat recall shows it only beside a cited one.
        searched = [h["id"] for c in self.calls if c.status in ("ok", "cached") and isinstance(c.result, list)
                    for h in c.result if isinstance(h, dict) and isinstance(h.get("id"), str)]
        meta: dict[str, Any] = {"tools": tools_used, "images": ",".join(u.sha256 for u in self.turn.images),
                                **derived_metadata(cited_sources(answer, self.turn.memories, searched))}
        if session:
            meta["session_id"] = session
        writes.append(MemoryWrite(text=text, kind="message", source_id=f"exchange:{digest}", metadata=meta))
        return writes
