"""Multi-hop query decomposition by the router model, measured by ``recallserve eval locomo --decompose``.

Not on the serving path: leave-one-conversation-out on the LoCoMo dev file found no recall gain
beyond the folds' spread for seconds of model time per search on cpu-local
(loadtests/results/locomo-decompose.md), so the memory search has no such option (the project's
rule: an option never chosen by leave-one-out is deleted). What stays is the measurement: this
module and the eval that runs it through the memory service's search.

A multi-hop question ("What did the friend who taught Tom to surf study?") needs memories that
each hold one part of the answer. The router model (cpu-local: the reasoner's llama.cpp model)
writes at most ``max_queries`` short search queries, one per line; the eval searches each of them
besides the question itself (``MemoryService.search_request(..., sub_queries=...)``) and the lists
are fused by reciprocal rank with the question's (see :mod:`recallserve.memory_shards.retrieval.hybrid`).

Bounds: one call of at most ``max_tokens`` generated tokens and ``timeout_s`` of wall time, at most
``max_queries`` sub-queries of at most ``max_query_chars`` characters. A call that fails or runs out
of time gives no sub-queries. Decompositions are kept in a JSON file (:class:`DecompositionCache`)
so repeated eval runs do not re-run the model.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Callable
from typing import NamedTuple

from pydantic import Field
from recallserve.kernels import StrictModel
from recallserve.serve.answer_cache import AnswerCache
from recallserve.serve.engine import (
    ChatMessage,
    EngineError,
    GenerationParams,
    LLMEngine,
)

__all__ = ["DECOMPOSE_SYSTEM", "CachedDecomposer", "DecomposeConfig", "Decomposition", "DecompositionCache", "QueryDecomposer",
           "parse_subqueries", "prompt_key"]

log = logging.getLogger(__name__)

# NOTE: the instruction and the two examples are generic (no LoCoMo question): the examples show
# the form (names kept, one thing per line, no answer guessed). They form one fixed system prompt
# (> 64 tokens), so the engine's saved prompt state and prefix cache keep its prefill across calls.
DECOMPOSE_SYSTEM = (
    "You turn a question about a chat history into search queries for that history. Write 3 short "
    "queries, one per line, each looking for a different part of the answer, worded as the people in "
    "the chat would have said it. Keep every name of the question. Do not answer, do not number the lines.\n\n"
    "Question: Which country is the friend who taught Tom to surf from?\n"
    "Tom learned to surf\nmy friend taught me surfing\nmy friend grew up in\n\n"
    "Question: What does Anna do to relax?\n"
    "Anna relaxes\nI unwind by\nmy favourite hobby"
)

_BULLET = re.compile(r"^\s*(?:[-*\u2022]+|\d+[.)]|query\s*\d*\s*:|q\d*\s*:)\s*", re.IGNORECASE)


class DecomposeConfig(StrictModel):
    """Bounds of one decomposition."""

    max_queries: int = Field(default=3, ge=1, le=5, description="Most sub-queries taken from the model's answer.")
    max_tokens: int = Field(default=48, ge=8, le=256, description="Most tokens the model generates.")
    max_query_chars: int = Field(default=160, ge=16, le=512, description="A longer sub-query is cut to this length.")
    timeout_s: float = Field(default=10.0, gt=0, le=120,
                             description="Wall-time bound of the model call; past it the search runs on the question alone.")


class Decomposition(NamedTuple):
    """The sub-queries of one question and what the model call cost."""

    queries: list[str]
    model_ms: float
    completion_tokens: int


def parse_subqueries(text: str, question: str, max_queries: int = 3, max_chars: int = 160) -> list[str]:
    """The model's answer as at most ``max_queries`` distinct sub-queries (the question itself excluded).

    One query per non-empty line; list marks ("1.", "-", "Query 2:") and surrounding quotes are
    dropped, a "Question:" line (the model echoing the prompt's form) is skipped, and a line longer
    than ``max_chars`` is cut there.

    Example:
        >>> parse_subqueries("1. Tom learned to surf\\n- \\"friend's country\\"\\n\\nTom learned to surf", "Q?")
        ['Tom learned to surf', "friend's country"]
    """
    out: list[str] = []
    seen = {question.strip().lower().rstrip("?").strip()}
    for line in text.splitlines():
        if len(out) == max_queries:
            break
        q = _BULLET.sub("", line).strip().strip("\"'`").strip()
        if not q or q.lower().startswith("question:"):
            continue
        q = q[:max_chars].strip()
        key = q.lower().rstrip("?").strip()
        if key and key not in seen:
            seen.add(key)
            out.append(q)
    return out


def prompt_key(model: str, question: str) -> str:
    """A cache key of one decomposition: the model, the prompt and the question (SHA-256)."""
    return hashlib.sha256(f"{model}\0{DECOMPOSE_SYSTEM}\0{question}".encode()).hexdigest()


class QueryDecomposer:
    """``await decomposer(question)`` -> :class:`Decomposition` through ``engine`` (the router role).

    Args:
        engine: the router model (on cpu-local the reasoner's llama.cpp process).
        config: bounds of the call.
    """

    def __init__(self, engine: LLMEngine, config: DecomposeConfig | None = None) -> None:
        self.engine = engine
        self.config = config or DecomposeConfig()

    @property
    def model_name(self) -> str:
        """The router model's name (part of a cached decomposition's key)."""
        return self.engine.model_name

    async def __call__(self, question: str) -> Decomposition:
        cfg = self.config
        messages = [ChatMessage(role="system", content=DECOMPOSE_SYSTEM),
                    ChatMessage(role="user", content=f"Question: {question.strip()}")]
        params = GenerationParams(max_tokens=cfg.max_tokens, temperature=0.0, stop=["\n\n", "Question:"])
        t0 = time.perf_counter()
        try:
            result = await asyncio.wait_for(self.engine.chat(messages, params), timeout=cfg.timeout_s)
        except (TimeoutError, EngineError) as exc:
            # NOTE: the question is not logged (message content never goes to logs).
            log.warning("query decomposition failed (%s); searching the question alone", type(exc).__name__)
            return Decomposition([], (time.perf_counter() - t0) * 1000, 0)
        ms = (time.perf_counter() - t0) * 1000
        return Decomposition(parse_subqueries(result.text, question, cfg.max_queries, cfg.max_query_chars), ms,
                             result.completion_tokens)


class DecompositionCache(AnswerCache):
    """The decompositions stored in ``path`` (created on the first save)."""

    what = "decomposition cache"

    def get(self, model: str, question: str) -> Decomposition | None:
        """The stored decomposition of ``question`` by ``model``, or None."""
        e = self.entry(prompt_key(model, question))
        if e is None:
            return None
        return Decomposition([str(q) for q in e["queries"]], float(e["model_ms"]), int(e["completion_tokens"]))

    def put(self, model: str, question: str, d: Decomposition) -> None:
        """Store ``d`` and rewrite the file."""
        self.store(prompt_key(model, question), {
            "question": question, "queries": d.queries, "model_ms": round(d.model_ms, 1),
            "completion_tokens": d.completion_tokens, "model": model})


class CachedDecomposer:
    """A decomposer reading ``cache`` first; a miss builds the real one (``load()``: loads the model) and stores its answer.

    Attributes:
        hits, misses: counts of this run.
    """

    def __init__(self, cache: DecompositionCache, model: str, load: Callable[[], QueryDecomposer]) -> None:
        self.cache = cache
        self.model = model
        self._load = load
        self._inner: QueryDecomposer | None = None
        self.hits = 0
        self.misses = 0

    async def __call__(self, question: str) -> Decomposition:
        got = self.cache.get(self.model, question)
        if got is not None:
            self.hits += 1
            return got
        if self._inner is None:
            self._inner = self._load()
        d = await self._inner(question)
        self.misses += 1
        self.cache.put(self.model, question, d)
        return d

