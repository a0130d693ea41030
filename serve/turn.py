"""One chat turn: built once from the request, rendered into every engine prompt by one pure function.

A request changes form once, at the edge (:meth:`recallserve.serve.pipeline.ChatPipeline.build_turn`,
the one builder: HTTP, ``recallserve eval agent``, ``recallserve demo`` and ``recallserve eval
retention`` all go through it), into a frozen :class:`Turn`: the budgeted history, the context-mode
block, the analysed images and the recalled memories are all in it before any engine call, and
nothing writes into it afterwards. The agent (router, loop steps, direct answers), the plain path,
streaming and segmented reasoning all call :func:`render_prompt` on it, which returns the prompt and
changes nothing. So whatever a feature adds to the turn (the client's system prompt, the
context-mode block, the budgeted history, the recalled memories, the image notes) reaches the model
on every path, and a test of the prompt the engine receives tests the feature.

The rendered prompt, in order (a stable prefix first, for llama.cpp's prompt cache and vLLM's
prefix cache)::

    system:    <head: the path's fixed instructions>
               Instructions from the client: <client system/developer messages, verbatim>
               <context-mode block: pinned constraints, rolling summary, entity table, retrieved turns>
    ...        <history: the earlier messages the token budget kept, verbatim, original roles>
    user:      Recalled memories ... / Attached image: ... / Question: <the question>
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ConfigDict, Field, field_validator

from recallserve.kernels import StrictModel
from recallserve.serve.context import MESSAGE_OVERHEAD, MessageIn, ModeName, ResolvedMode, Session, TokenBreakdown
from recallserve.serve.engine import ChatMessage
from recallserve.serve.memory import MemoryBackend, MemoryHit, cites_of, is_derived
from recallserve.serve.tokens import TokenCounter

if TYPE_CHECKING:  # NOTE: typing only; serve.agent imports this module.
    from recallserve.serve.agent.images import ImageUnit

__all__ = ["similar_key", "RecallConfig", "Turn", "TurnContext", "TurnTimings", "recall_memories", "recall_query", "relevance_cut",
           "relevance_patterns", "topic_codes", "format_memories", "memory_line", "render_prompt", "prompt_tokens",
           "memory_meta", "question_parts", "RECALL_KINDS", "CLIENT_HEADER"]

log = logging.getLogger("recallserve.turn")

#: Memory kinds recalled for a turn unless ``RecallConfig.recall_exchanges``: everything but the
#: agent's own write-backs (kind ``message``).
RECALL_KINDS = ("text", "image", "table", "tool_result", "experience")
#: Header of the client's own system prompt inside the rendered system message.
CLIENT_HEADER = "Instructions from the client application (follow them unless they conflict with the rules above):"


class RecallConfig(StrictModel):
    """How one turn recalls memories and shows them to the model.

    How many and how similar come from the memory tier (``memory.top_k``, ``memory.threshold``
    of the profile: one top-k for the chat, the agent and ``/v1/memories/search``).
    """

    enabled: bool = Field(default=True, description="Recall memories for each chat turn.")
    recall_exchanges: bool = Field(
        default=False,
        description="Also recall the agent's own earlier exchanges (kind 'message'). Off by default: an old answer "
        "is stale next to live tools, and a wrong one recalled for the same question repeats itself.",
    )
    relative_cut: float = Field(
        default=0.85, ge=0.0, le=1.0,
        description="Relevance cut: keep a recalled memory only when its similarity (cosine) is at least this share "
        "of the best one's (0 = keep the memory tier's whole top-k). A memory far below the best match is usually "
        "about another topic; scripts/recall_cut.py reports what each cut keeps on the tuned and held-out questions.",
    )
    min_similarity: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description="Absolute floor: a recalled memory whose similarity (cosine) to the query is below this is not "
        "shown, whatever found it (BM25's best match included). None = the memory tier's own threshold "
        "(memory.threshold, 0.35 cosine by design); scripts/recall_cut.py reports what each floor keeps on the "
        "tuned and held-out demo questions.",
    )
    id_pattern: str | None = Field(
        default=r"\b(?:[A-Z]{1,4}-\d{3,}|\d{6,})\b",
        description="Regular expression of an identifier (order, ticket, customer id). A memory that names an id the "
        "query names passes the absolute floor whatever its cosine: it is about the thing asked. None = no id rule.",
    )
    topic_code_pattern: str | None = Field(
        default=r"\bE-?\d{2,3}\b",
        description="Regular expression of a code that names one of several mutually exclusive topics (a device's "
        "fault code by default; dashes are folded, so 'E-42' and 'E42' are one code). When the query names codes "
        "and some memory names one of them, the memories naming none are dropped. None = no code rule.",
    )
    item_chars: int = Field(default=400, ge=40, le=8000, description="Most characters of one memory in the prompt.")
    prompt_chars: int = Field(
        default=3000, ge=0, le=100_000, description="Most characters of all recalled memories in the prompt."
    )
    timeout_s: float = Field(default=10.0, gt=0, le=600, description="Deadline of the recall step; then no memories.")
    max_parts: int = Field(
        default=4, ge=1, le=8,
        description="Most sentences of a message asking several questions searched as parts of their own, besides the whole "
        "message (see serve.turn.question_parts); 1 = one search of the whole message.",
    )
    max_derived: int = Field(
        default=2, ge=0, le=8,
        description="Most derived conclusions (written-back answers citing a recalled source) shown after the "
        "sources; 0 = none.",
    )

    @field_validator("id_pattern", "topic_code_pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        """A pattern that does not compile is refused at load, not at the first turn."""
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from exc
        return value


class TurnContext(StrictModel):
    """What context-mode did for the turn (the ``context`` field of the response metadata and the trace).

    ``breakdown.total`` is the token count of the prompt the engine receives (the path's first
    reasoner call, rendered by :func:`render_prompt`), the figure the budget is checked against;
    the other parts are context-mode's, and ``breakdown.system`` is the rest of that prompt (the
    path's head, the client's instructions, the block's framing, recalled memories, image notes).
    """

    model_config = ConfigDict(frozen=True)

    session_id: str | None = Field(default=None, description="Server-side session of the turn (None: client-sent history).")
    mode: ResolvedMode = Field(description="Context mode used.")
    requested_mode: ModeName = Field(description="Mode asked for (request, session or config default).")
    budget: int = Field(ge=0, description="History budget = context_window - reserved - system - pending, tokens.")
    breakdown: TokenBreakdown = Field(description="Tokens per part; total = the rendered prompt's tokens.")
    dropped_messages: int = Field(ge=0, description="History messages left out (covered by summary or dropped).")
    latency_ms: float = Field(ge=0, description="Assembly time, milliseconds.")


@dataclass(frozen=True)
class TurnTimings:
    """Durations of the turn's steps before the answer, milliseconds."""

    images_ms: float = 0.0
    recall_ms: float = 0.0

    def as_dict(self) -> dict[str, float]:
        """``{"images": ms, "recall": ms}`` (the trace's ``timings_ms``)."""
        return {"images": self.images_ms, "recall": self.recall_ms}


@dataclass(frozen=True)
class Turn:
    """What one chat turn carries from the request to every prompt; frozen, complete when built.

    Attributes:
        question: text of the last user message (what is asked).
        instructions: the client's system / developer messages, joined ('' = none).
        context: the context-mode block (constraints, summary, entities, retrieved turns; '' = none).
        history: earlier messages the token budget kept, oldest first (roles user/assistant/tool).
        image_urls: image data URLs of the question's message.
        images: the analysed images, one per URL (a bad image is the request's 400, never here).
        memories: the turn's one recall, most relevant first.
        memory_error: why recall failed ('' = it did not).
        session: the server-side session (None without ``metadata.session_id``).
        pending: the request's new messages, appended to the session after the answer.
        report: what context-mode did (None for a turn not built from a request, e.g. a warm-up).
        timings: durations of the image and recall steps.
        started: ``time.perf_counter()`` when the turn's building started (the trace's total time).
        uncached: the turn neither reads nor fills the recall and tool caches (its user, or the tenant,
            was asked to be erased lately: an entry cached before or during the erasure may hold
            erased rows; see ``ChatPipeline._recently_erased``).
    """

    question: str
    instructions: str = ""
    context: str = ""
    history: tuple[ChatMessage, ...] = ()
    image_urls: tuple[str, ...] = ()
    images: tuple[ImageUnit, ...] = ()
    memories: tuple[MemoryHit, ...] = ()
    memory_error: str = ""
    session: Session | None = None
    pending: tuple[MessageIn, ...] = ()
    report: TurnContext | None = None
    timings: TurnTimings = field(default_factory=TurnTimings)
    started: float = field(default_factory=time.perf_counter)
    uncached: bool = False

    @property
    def asked(self) -> str:
        """The question as shown to the model (a placeholder when only an image, or nothing, was sent).

        NOTE: the placeholder named an attached image whatever was sent: an empty user message
        (which OpenAI accepts) told the model to look at an image that was not there.
        """
        if self.question.strip():
            return self.question.strip()
        return "(no text; see the attached image)" if self.image_urls else "(an empty message)"

    def recall_query(self) -> str:
        """The recall query of this turn (see :func:`recall_query`)."""
        return recall_query(self.question, self.images)

    def image_notes(self) -> list[str]:
        """One prompt line per analysed image."""
        return [u.note() for u in self.images]


def recall_query(question: str, images: Sequence[ImageUnit]) -> str:
    """The recall query: the question plus the text OCR read in its images (<= 1000 chars).

    NOTE: 1000 characters: the embedder reads at most 256 tokens (MiniLM), ~1000 characters of English.
    """
    ocr = [u.ocr_text for u in images if u.ocr_text]
    return " ".join([question, *ocr]).strip()[:1000]


class _Cache(Protocol):
    def get(self, key: str) -> tuple[bool, Any]: ...

    def put(self, key: str, value: Any) -> None: ...


_SPACES = re.compile(r"\s+")
_END_MARKS = re.compile(r"[\s?!.。？！]+$")


def _loosen(x: Any) -> Any:
    """Strings case-folded, runs of spacing folded to one space, closing ?/!/. dropped; containers
    recursively. NOTE: nothing else: an operator is meaning ("2*3" and "2+3" must not share a key)."""
    if isinstance(x, str):
        return _END_MARKS.sub("", _SPACES.sub(" ", x.casefold()).strip())
    if isinstance(x, dict):
        return {str(k): _loosen(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_loosen(v) for v in x]
    return x


def similar_key(scope: str | tuple[str | None, ...], *parts: Any) -> str:
    """The cache key of a tool or retrieval result: ``scope`` (the tenant, or the tenant and the end
    user) exact, every string of
    ``parts`` case-folded, with spacing folded and closing question marks dropped.

    000 reuses results for "the same or highly similar" queries within 5-10 minutes; queries that
    differ only in case, spacing or a closing mark ("Reset the router?" / "reset the router") are the
    similar ones a key can match exactly. The scope is never loosened (one tenant or end user never
    reads another's cached results), and nothing is fuzzy beyond that (a near-miss is a miss).

    Example:
        >>> similar_key("acme", "search", {"q": "Reset  the Router?"}) == similar_key("acme", "search", {"q": "reset the router"})
        True
    """
    return json.dumps([scope, *_loosen(list(parts))], sort_keys=True, separators=(",", ":"), default=str)


async def recall_memories(memory: MemoryBackend | None, tenant: str, query: str, config: RecallConfig,
                          cache: _Cache | None = None, user: str | None = None) -> tuple[list[MemoryHit], str]:
    """The turn's one recall: the tenant's top-k for ``query`` (k and threshold: the memory tier's).

    Steps (the searches of one step run at once; every one is bounded by ``config.timeout_s``):

    1. one search per query of :func:`question_parts`: the whole query, and for a compound
       question each of its parts; the source records of each list (:data:`RECALL_KINDS`, no
       write-back) get their own :func:`relevance_cut` (its best match, its ids and codes); a
       part's memory stays only when its similarity is at least ``relative_cut`` x the best of the
       whole message's list; the lists are merged in turn (:func:`_merge`), no memory twice, each
       with its highest similarity over the lists that kept it (the query it answers best: a
       ticket's cosine with the sentence telling its fault, not with the whole compound message);
    2. ``config.max_derived`` > 0: the derived conclusions of the whole query's list
       (:func:`recallserve.serve.memory.is_derived`: written-back answers) above the floor are
       shown after the sources, and only when one cites a source step 1 kept: it adds what an
       earlier answer concluded from a record and never stands in for it. The same search finds
       them (one search for a one-part question).

    NOTE: per part because the relevance cut assumes one topic: a message about a fault code and a
    second, code-less fault keeps only the code's memories (the code rule drops every memory naming
    no code, and the relative cut whatever is far below the best match); the second sentence
    searched alone recalls its own record.

    ``user`` (the request's stored user key) scopes it to that end user's memories and the
    tenant's unowned ones: one user's turn never sees (nor copies into its trace) another's.

    Results are cached per (tenant, query, kinds) when a cache is given (CoT 3.0: retrieval results
    of the same or a similar query, :func:`similar_key`, are reused for minutes); an empty result is
    not cached (a recall made before the memories were written would otherwise hide them for the
    cache's lifetime). A failing or slow memory tier degrades to no memories; the reason comes back
    (reported in the response metadata, so the degradation is visible, never silent).
    """
    if memory is None or not config.enabled or not query.strip():
        return [], ""
    kinds = None if config.recall_exchanges or config.max_derived else RECALL_KINDS
    key = "recall\x00" + similar_key((tenant, user), query, kinds, config.max_parts, config.max_derived)
    if cache is not None:
        found, hits = cache.get(key)
        if found:
            return list(hits), ""
    queries = question_parts(query, config.max_parts)
    try:
        async with asyncio.timeout(config.timeout_s):
            found_lists = await asyncio.gather(*(memory.search(tenant, q, None, kinds=kinds, user=user)
                                                 for q in queries))
    except Exception as exc:  # noqa: BLE001 - any memory failure must not fail the chat
        log.warning("memory recall failed: %s", exc)
        return [], f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    # NOTE: one threshold for the tier's dense cut and the prompt's floor unless the recall sets its own.
    floor = config.min_similarity if config.min_similarity is not None else getattr(memory, "threshold", None)
    floor_value = -1.0 if floor is None else float(floor)
    id_pattern, code_pattern = relevance_patterns(config)
    def source(h: MemoryHit) -> bool:
        # NOTE: recall_exchanges recalls the write-backs themselves, derived or not, as records.
        return config.recall_exchanges or (not is_derived(h) and h.kind in RECALL_KINDS)

    kept = [relevance_cut([h for h in found if source(h)], config.relative_cut, floor_value, q,
                          id_pattern=id_pattern, topic_code_pattern=code_pattern)
            for q, found in zip(queries, found_lists, strict=True)]
    if len(kept) > 1 and kept[0]:
        # NOTE: the relative cut spans the parts: a part's memory joins when it is as close to its
        # part as the message's own kept memories are to the message. A sentence that only sets the
        # scene (names the product, points at a photo) matches every record of that product loosely
        # and would bring its other faults back past the code the message names.
        bar = config.relative_cut * max(h.similarity for h in kept[0])
        kept = [kept[0], *([h for h in part if h.similarity >= bar] for part in kept[1:])]
    hits = _merge(kept)
    sources = {h.source_id for h in hits}
    derived = [h for h in found_lists[0] if is_derived(h) and h.similarity >= floor_value and set(cites_of(h)) & sources
               and h.source_id not in sources]
    hits += derived[: config.max_derived]
    if cache is not None and hits:
        cache.put(key, hits)
    return hits, ""


def _merge(lists: Sequence[Sequence[MemoryHit]]) -> list[MemoryHit]:
    """The lists taken in turn (round robin: every list's best before any list's second), each memory once,
    with the highest ``similarity`` it has in any list (``max_q cos(q, record)`` over the queries that kept it).

    NOTE: the highest, not the first list's: the whole compound message dilutes a record's cosine
    with the sentences about other things; what the turn reads from it (a record close enough to be
    the question's fault in other words, ``recallserve.serve.agent.grounding.CLOSE_COSINE``, chosen
    offline over the whole question and its parts) is the cosine of the part it answers. Only the
    similarity: its ``score`` stays the one of the list it is taken from (that list's rank fusion).

    NOTE: round robin, not the whole message's list first: the prompt shows memories up to
    ``prompt_chars``, and a part's best match placed after a long list of the other part's fell out.
    """
    best: dict[str, float] = {}
    for x in lists:
        for h in x:
            best[h.id] = max(best.get(h.id, h.similarity), h.similarity)
    out: list[MemoryHit] = []
    seen: set[str] = set()
    for i in range(max((len(x) for x in lists), default=0)):
        for x in lists:
            if i < len(x) and x[i].id not in seen:
                seen.add(x[i].id)
                hit = x[i]
                out.append(hit if hit.similarity >= best[hit.id] else hit.model_copy(update={"similarity": best[hit.id]}))
    return out


_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")


def question_parts(query: str, max_parts: int) -> list[str]:
    """The recall queries of ``query``: itself, plus each of its sentences when it asks several questions.

    A message with two or more question sentences (ending in ``?``) is compound; each of its
    sentences (statements too: "it is from batch <id>", the photo's OCR text) is searched alone
    besides the whole message, so that every part gets its own best match, ids and codes in the
    relevance cut; a sentence that names nothing a memory holds recalls nothing (the floor). At
    most ``max_parts`` sentences (the first ones) besides the whole message; 1 = no parts.

    NOTE: a part is one sentence, not a question with the statements before it: on two-topic
    messages of the compound question set, a second part carrying the first topic's fault-code
    statement lost its own record to the topic-code rule again.
    """
    sentences = [x.strip() for x in _SENTENCE_SPLIT.split(query) if x and x.strip()]
    if sum(x.endswith("?") for x in sentences) < 2 or max_parts < 2:
        return [query]
    return [query, *sentences[:max_parts]]


def relevance_cut(
    hits: Sequence[MemoryHit],
    relative: float,
    floor: float = -1.0,
    query: str = "",
    *,
    id_pattern: re.Pattern[str] | None = None,
    topic_code_pattern: re.Pattern[str] | None = None,
) -> list[MemoryHit]:
    """The hits worth showing for ``query``, in the given order.

    Rules, applied in this order:

    1. Floor: keep ``h`` when ``h.similarity >= floor``, or when it names an id (``id_pattern``)
       that ``query`` names: such a memory is about the thing asked whatever its wording.
    2. Topic codes: when ``query`` names codes (``topic_code_pattern``, dashes folded) and some
       hit names one of them, drop the hits that name none (they are about another topic). When
       no hit names the code, nothing is dropped.
    3. Relative cut: keep ``h`` when ``h.similarity >= relative * best`` (``best`` = the largest
       similarity left), or when it is the hybrid retriever's best lexical match
       (``lexical_rank == 1``: an exact id or code is what BM25 finds and a small embedder may
       miss). ``relative <= 0`` keeps all.

    Relative, not absolute: how high the best cosine gets depends on the query's length and
    wording; what marks a memory as another topic is its distance below the best match.

    NOTE: on the hit's ``similarity`` (the query-record cosine), not its ``score``: through the
    memory tier the score is the hybrid retriever's reciprocal-rank fusion, which compresses any
    top four into a narrow band, so a cut on it keeps nearly everything.

    NOTE: the code rule runs before the relative cut, so the best is taken among the hits that
    share the query's code. A query that carries a product name (a photo's OCR text) lifts every
    memory about that product into one cosine band, which the relative cut alone cannot split.
    """
    ids: set[str] = set()
    codes: set[str] = set()
    if query and id_pattern is not None:
        ids = set(id_pattern.findall(query))
    if query and topic_code_pattern is not None:
        codes = topic_codes(query, topic_code_pattern)

    def names_an_id(h: MemoryHit) -> bool:
        return bool(ids) and any(i in h.record.text for i in ids)

    hits = [h for h in hits if h.similarity >= floor or names_an_id(h)]
    if codes and topic_code_pattern is not None:
        same_topic = [h for h in hits if topic_codes(h.record.text, topic_code_pattern) & codes]
        hits = same_topic or hits
    if not hits or relative <= 0:
        return hits
    best = max(h.similarity for h in hits)
    cut = relative * best if best > 0 else best
    return [h for h in hits if h.similarity >= cut or getattr(h, "lexical_rank", None) == 1]


def topic_codes(text: str, pattern: re.Pattern[str]) -> set[str]:
    """The codes ``pattern`` finds in ``text``, dashes folded (``"E-42"`` and ``"E42"`` are one code)."""
    return {code.replace("-", "") for code in pattern.findall(text)}


def relevance_patterns(config: RecallConfig) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
    """``config``'s id and topic-code patterns, compiled (None where switched off)."""
    return (
        None if config.id_pattern is None else re.compile(config.id_pattern),
        None if config.topic_code_pattern is None else re.compile(config.topic_code_pattern),
    )


def memory_line(n: int, kind: str, source_id: str, created_at: float, text: str, item_chars: int) -> str:
    """One recalled memory as a prompt line: ``[n] (source_id, date) text`` (``(kind source_id,
    date)`` for a kind other than ``text``), the text whitespace-folded and cut to ``item_chars``
    (the turn's recall and the memory_search tool).

    No score: through the memory tier it is the hybrid retriever's rank fusion (0.08-0.12 for any
    top ten), which tells the model nothing the order does not, and it cost 6 prompt tokens a
    memory (Qwen's tokenizer spends one token a digit).
    """
    text = " ".join(text.split())
    if len(text) > item_chars:
        text = text[: item_chars - 3] + "..."
    when = time.strftime("%Y-%m-%d", time.gmtime(created_at))
    label = source_id if kind == "text" else f"{kind} {source_id}"
    return f"[{n}] ({label}, {when}) {text}"


def format_memories(hits: Sequence[MemoryHit], *, item_chars: int, total_chars: int) -> str:
    """Recalled memories as one prompt block, most relevant first ('' when none fit).

    Each memory is one :func:`memory_line`; lines stop before ``total_chars`` would be passed.
    """
    lines: list[str] = []
    used = 0
    for i, h in enumerate(hits, 1):
        # NOTE: a derived memory is shown as what it is, an earlier answer, with the records it cited.
        kind, label = ("earlier answer", "citing " + ", ".join(cites_of(h))) if is_derived(h) else (h.kind, h.source_id)
        line = memory_line(i, kind, label, h.created_at, h.text, item_chars)
        if used + len(line) > total_chars:
            break
        lines.append(line)
        used += len(line)
    if not lines:
        return ""
    return "Recalled memories (most relevant first; may be irrelevant; cite them by [n] when used):\n" + "\n".join(lines)


def render_prompt(turn: Turn, head: str, recall: RecallConfig, *, question: str | None = None) -> list[ChatMessage]:
    """The engine prompt of ``turn`` under the system text ``head`` (see the module docstring): a pure
    function of its arguments (a new list each call; the turn is not touched).

    Args:
        turn: the turn.
        head: the path's fixed instructions (agent protocol + tools, direct answer, segmented format,
            the server's system prompt); first, so engines reuse its prompt cache across requests.
        recall: how memories are shown (characters per memory and in all).
        question: the user message's last part instead of ``Question: <turn.asked>`` (segmented
            reasoning puts its rules and past experiences there).
    """
    system = [head.strip()] if head.strip() else []
    if turn.instructions.strip():
        system.append(f"{CLIENT_HEADER}\n{turn.instructions.strip()}")
    if turn.context.strip():
        system.append(turn.context.strip())
    messages = [ChatMessage(role="system", content="\n\n".join(system))] if system else []
    messages += turn.history
    parts = []
    memories = format_memories(turn.memories, item_chars=recall.item_chars, total_chars=recall.prompt_chars)
    if memories:
        parts.append(memories)
    parts += [f"Attached image: {note}" for note in turn.image_notes()]
    parts.append(question if question is not None else f"Question: {turn.asked}")
    messages.append(ChatMessage(role="user", content="\n\n".join(parts)))
    return messages


async def prompt_tokens(messages: Sequence[ChatMessage], counter: TokenCounter) -> int:
    """Tokens of a rendered prompt: ``sum(count(content) + MESSAGE_OVERHEAD)`` over its messages.

    The same count context-mode's budget uses (``MESSAGE_OVERHEAD`` for each message's role and
    separators), so the check ``prompt_tokens + max_tokens <= context_window`` is in the units the
    history was fitted in.
    """
    return sum([await counter.count(m.content) + MESSAGE_OVERHEAD for m in messages])


def memory_meta(hits: Sequence[MemoryHit], error: str) -> dict[str, object]:
    """Response metadata of the recall step."""
    meta: dict[str, object] = {
        "memories": [{"id": h.id, "source_id": h.source_id, "kind": h.kind, "score": round(h.score, 4)} for h in hits]
    }
    if error:
        meta["memory_error"] = error
    return meta
