"""Write-time enrichment: a stored exchange -> atomic facts, kept as parts of the record they came from.

What the leading memory systems do at write time: a model reads each stored exchange and writes
the facts it states as short standalone sentences (names, not pronouns), with relative dates
resolved against the time it was said. Here the model (the router role; cpu-local: the reasoner's
llama.cpp model) writes the facts of a short window of consecutive exchanges of one conversation
in one call (the fixed prompt is paid once per window), each line tagged with the number of the
exchange it came from; the code then

* keeps at most ``max_facts`` facts per exchange, each cut to ``max_fact_chars``;
* resolves relative dates ("yesterday", "last Saturday", "two weeks ago", "next month") against
  the exchange's own time (:func:`recallserve.memory_shards.retrieval.when.resolve_relative_dates`:
  the arithmetic is done in code, not trusted to a 1.5B model);
* stores the facts as parts named ``fact`` of their source record (:func:`with_facts`).

A fact is a part of its source, not a record of its own: the shard scores a record by its best
row (text or any part) and BM25 reads every part, so a search hit on a fact's wording returns the
source record with score max(own, facts') with no collapse step, and erasing or overwriting the
source removes its facts with it (a separate fact record would outlive an erased source).

Bounds: one call of at most ``max_tokens`` generated tokens and ``timeout_s`` of wall time; a
call that fails or runs late gives no facts (the records stay as they were). Windows and their
facts are kept in a JSON file (:class:`EnrichmentCache`, keyed by model + prompt + input) so a
re-run (the eval, the resumable job) does not ask the model again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from pydantic import Field

from recallserve.kernels import StrictModel
from recallserve.memory_shards.records import MAX_PARTS, MemoryPart, MemoryRecord
from recallserve.memory_shards.retrieval.when import resolve_relative_dates
from recallserve.serve.answer_cache import AnswerCache
from recallserve.serve.engine import ChatMessage, EngineError, GenerationParams, LLMEngine

__all__ = ["ENRICH_SYSTEM", "FACT_PART", "EnrichConfig", "Exchange", "Enrichment", "FactEnricher", "EnrichmentCache",
           "CachedEnricher", "parse_facts", "render_window", "window_key", "with_facts", "facts_of"]

log = logging.getLogger(__name__)

#: Name of the record parts that hold facts.
FACT_PART = "fact"

# NOTE: the instruction and the example are generic (no LoCoMo conversation): they show the form
# (one fact per line tagged with its message number, names instead of pronouns, time words kept as
# said for the code to resolve, small talk skipped). One fixed system prompt, so the engine's saved
# prompt state keeps its prefill across calls.
ENRICH_SYSTEM = (
    "You extract facts from a chat. For each numbered message, write the facts it states about the people "
    "(what they did, plan, own, like, feel, where they went, who they met), each as a short sentence on its own line, "
    "starting with the message number and a colon. Use people's names, never I, you, he, she or they. Keep time "
    "words exactly as said (yesterday, last week, two years ago). Skip greetings, thanks and questions. "
    "At most 2 facts per message; write nothing for a message without facts.\n\n"
    "Example:\n"
    "1. Tom: Hi Ana, how are you?\n"
    "2. Ana: Good! My sister Eva just adopted a puppy named Rex.\n"
    "3. Tom: Cute! I ran my first marathon last Sunday, in Lisbon.\n"
    "4. Ana: Wow, well done!\n"
    "Facts:\n"
    "2: Ana's sister Eva adopted a puppy named Rex.\n"
    "3: Tom ran his first marathon last Sunday.\n"
    "3: Tom's first marathon was in Lisbon."
)

_LINE = re.compile(r"^\s*[-*\u2022]?\s*\[?(\d{1,2})\]?\s*[:.)\-]\s*(.+?)\s*$")


class EnrichConfig(StrictModel):
    """Bounds of one enrichment call."""

    window: int = Field(default=4, ge=1, le=8, description="Consecutive exchanges of one conversation read in one call.")
    max_facts: int = Field(default=2, ge=1, le=4, description="Most facts kept per exchange.")
    max_fact_chars: int = Field(default=200, ge=32, le=500, description="A longer fact is cut to this length.")
    max_input_chars: int = Field(default=600, ge=64, le=4000, description="An exchange longer than this is cut for the model.")
    tokens_per_exchange: int = Field(default=40, ge=8, le=200,
                                     description="Generated-token budget per exchange of the window (max_tokens = this x window).")
    timeout_s: float = Field(default=60.0, gt=0, le=600,
                             description="Wall-time bound of one call; past it the window gets no facts.")


class Exchange(NamedTuple):
    """One stored exchange as the enricher reads it."""

    record_id: str
    text: str
    time: float
    speaker: str = ""


class Enrichment(NamedTuple):
    """The facts of each exchange of one window (same order) and what the call cost."""

    facts: list[list[str]]
    model_ms: float
    prompt_tokens: int
    completion_tokens: int
    text: str = ""
    failed: bool = False  # the call timed out or the engine failed: never cached, asked again next run


def render_window(window: Sequence[Exchange], max_input_chars: int = 600) -> str:
    """The user message of one call: the date of the first exchange, then one numbered line per exchange."""
    first = time.gmtime(window[0].time)
    head = f"Date: {first.tm_mday} {time.strftime('%B %Y', first)}"
    lines = [f"{i}. {(e.speaker + ': ') if e.speaker else ''}{' '.join(e.text.split())[:max_input_chars]}"
             for i, e in enumerate(window, 1)]
    return "\n".join([head, *lines, "Facts:"])


_WORD = re.compile(r"[a-z0-9]+")
# NOTE: function words and chat fillers only (a closed list, no domain word): they say nothing of
# which exchange a fact came from.
_STOP = frozenset("""a an the and or but if of to in on at by for with from into about as is are was were be been
being am do does did have has had having i me my mine you your yours he him his she her hers it its we us our they them
their this that these those there here so very really just too also not no yes what which who whom when where why how
all any some much many more most can could will would shall should may might must let get got gets going gonna go
went s t ll re ve d m that's it's im ive youre thats like yeah oh wow hey hi hello thanks thank great good nice cool
love awesome amazing totally sure""".split())


def _content(text: str) -> set[str]:
    """Content words of ``text`` (lower case, a trailing plural/possessive 's' dropped, function words out)."""
    return {w[:-1] if len(w) > 4 and w.endswith("s") else w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 2}


def parse_facts(text: str, window: Sequence[Exchange], max_facts: int = 2, max_chars: int = 200) -> list[list[str]]:
    """The model's answer as the facts of each exchange (relative dates resolved against its time).

    A line counts only when it starts with a number ("2: ...", "2. ...", "[2] ..."). The small
    model often numbers facts in order rather than by the message they come from, so the number is
    only a tie-break: a fact belongs to the exchange of the window sharing most content words with
    it (speakers' names and function words left out), and a fact sharing none with any exchange
    (copied from the prompt's example or made up) is dropped. Repeats (case-insensitive) and facts
    past ``max_facts`` per exchange are dropped.

    Example:
        >>> w = [Exchange("r1", "Hi!", 1683504000.0, "Tom"), Exchange("r2", "I ran a race yesterday", 1683504000.0, "Tom")]
        >>> parse_facts("1: Tom ran a race yesterday.\\n1: Tom ran a race yesterday.\\n2: Ana adopted a puppy.", w)
        [[], ['Tom ran a race yesterday (7 May 2023).']]
    """
    out: list[list[str]] = [[] for _ in window]
    names = {w for e in window for w in _WORD.findall(e.speaker.lower())}
    words = [_content(e.text) - names for e in window]
    seen: set[str] = set()
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        tagged = int(m.group(1)) - 1
        fact = m.group(2).strip().strip("\"'`").strip()[:max_chars].strip()
        if len(fact) < 8 or fact.lower() in seen:
            continue
        mine = _content(fact) - names
        overlap = [len(mine & ws) for ws in words]
        best = max(overlap, default=0)
        if best == 0:
            continue
        n = tagged if 0 <= tagged < len(window) and overlap[tagged] == best else overlap.index(best)
        if len(out[n]) >= max_facts:
            continue
        seen.add(fact.lower())
        out[n].append(resolve_relative_dates(fact, window[n].time))
    return out


def window_key(model: str, rendered: str) -> str:
    """A cache key of one call: the model, the prompt and the input (SHA-256)."""
    return hashlib.sha256(f"{model}\0{ENRICH_SYSTEM}\0{rendered}".encode()).hexdigest()


class FactEnricher:
    """``await enricher(window)`` -> :class:`Enrichment` through ``engine`` (the router role)."""

    def __init__(self, engine: LLMEngine, config: EnrichConfig | None = None) -> None:
        self.engine = engine
        self.config = config or EnrichConfig()

    @property
    def model_name(self) -> str:
        """The model's name (part of a cached window's key)."""
        return self.engine.model_name

    async def __call__(self, window: Sequence[Exchange]) -> Enrichment:
        cfg = self.config
        if not 1 <= len(window) <= cfg.window:
            raise ValueError(f"window: 1..{cfg.window} exchanges, got {len(window)}")
        messages = [ChatMessage(role="system", content=ENRICH_SYSTEM),
                    ChatMessage(role="user", content=render_window(window, cfg.max_input_chars))]
        params = GenerationParams(max_tokens=cfg.tokens_per_exchange * len(window), temperature=0.0,
                                  stop=["\n\n", "Example:", "Date:"])
        t0 = time.perf_counter()
        try:
            result = await asyncio.wait_for(self.engine.chat(messages, params), timeout=cfg.timeout_s)
        except (TimeoutError, EngineError) as exc:
            # NOTE: the exchanges are not logged (message content never goes to logs).
            log.warning("enrichment call failed (%s); the window gets no facts", type(exc).__name__)
            return Enrichment([[] for _ in window], (time.perf_counter() - t0) * 1000, 0, 0, failed=True)
        ms = (time.perf_counter() - t0) * 1000
        return Enrichment(parse_facts(result.text, window, cfg.max_facts, cfg.max_fact_chars), ms,
                          result.prompt_tokens, result.completion_tokens, result.text)


class EnrichmentCache(AnswerCache):
    """The enriched windows stored in ``path``: the model's raw answer and what the call cost."""

    what = "enrichment cache"

    def get(self, model: str, window: Sequence[Exchange], config: EnrichConfig | None = None) -> Enrichment | None:
        """The stored enrichment of ``window`` by ``model``, or None; the facts are parsed again from the
        stored answer (``config``'s bounds), so a change of the parsing needs no model call."""
        cfg = config or EnrichConfig()
        e = self.entry(window_key(model, render_window(window, cfg.max_input_chars)))
        if e is None:
            return None
        raw = str(e.get("text", ""))
        facts = parse_facts(raw, window, cfg.max_facts, cfg.max_fact_chars) if raw else [[] for _ in window]
        return Enrichment(facts, float(e["model_ms"]), int(e["prompt_tokens"]), int(e["completion_tokens"]), raw)

    def put(self, model: str, window: Sequence[Exchange], got: Enrichment, config: EnrichConfig | None = None) -> None:
        """Store ``got`` and rewrite the file."""
        cfg = config or EnrichConfig()
        self.store(window_key(model, render_window(window, cfg.max_input_chars)), {
            "ids": [e.record_id for e in window], "text": got.text, "facts": got.facts, "model_ms": round(got.model_ms, 1),
            "prompt_tokens": got.prompt_tokens, "completion_tokens": got.completion_tokens, "model": model})


class CachedEnricher:
    """An enricher reading ``cache`` first; a miss builds the real one (``load()``: loads the model) and stores its answer."""

    def __init__(self, cache: EnrichmentCache, model: str, load: Callable[[], FactEnricher],
                 config: EnrichConfig | None = None) -> None:
        self.cache = cache
        self.model = model
        self._load = load
        self._inner: FactEnricher | None = None
        self.config = config or EnrichConfig()
        self.hits = 0
        self.misses = 0

    async def __call__(self, window: Sequence[Exchange]) -> Enrichment:
        got = self.cache.get(self.model, window, self.config)
        if got is not None:
            self.hits += 1
            return got
        if self._inner is None:
            self._inner = self._load()
        got = await self._inner(window)
        self.misses += 1
        if not got.failed:
            self.cache.put(self.model, window, got, self.config)
        return got


def facts_of(record: MemoryRecord) -> list[str]:
    """The facts stored on ``record`` (its ``fact`` parts)."""
    return [p.text for p in record.parts if p.name == FACT_PART]


def with_facts(record: MemoryRecord, facts: Sequence[str]) -> MemoryRecord:
    """``record`` with its fact parts replaced by ``facts`` (other parts kept first; at most ``MAX_PARTS`` parts in all)."""
    kept = [p for p in record.parts if p.name != FACT_PART]
    room = max(MAX_PARTS - len(kept), 0)
    new = [MemoryPart(name=FACT_PART, kind="text", text=f) for f in dict.fromkeys(facts) if f.strip()][:room]
    return record.model_copy(update={"parts": [*kept, *new]})
