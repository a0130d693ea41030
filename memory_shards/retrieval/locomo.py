"""LoCoMo evidence recall@k: load conversations, index their turns, ask the questions, score.

Data: LoCoMo (Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM Agents",
ACL 2024; CC BY-NC 4.0, evaluation use only). A file is a list of conversations with
``conversation`` (``speaker_a``, ``speaker_b``, ``session_N`` turn lists, ``session_N_date_time``)
and ``qa`` (``question``, ``evidence`` dia_ids, ``category`` 1 multi-hop, 2 temporal,
3 open-domain, 4 single-hop, 5 adversarial).

Each turn becomes one memory of the conversation's tenant (``source_id`` = dia_id, created at its
session's time) written and searched through the hybrid service path. The memory's main text is
the turn as said ("<speaker> said on <date>: <text>", plus "[shares a photo of <caption>]"), and
a second part holds the neighbouring turns (``context_window`` each side, same session), so a
reply like "Yes, last Sunday!" is found by the question its neighbour asked (the shard keeps the
best part; BM25 indexes both parts and the metadata: speaker and date as written).

Recall of one question = |evidence ∩ top-k source ids| / |evidence|, averaged per category and
over categories 1-4 (macro over questions). Malformed evidence ids (``"D8:6; D9:17"``,
``"D:11:26"``, ``"D30:05"``) are split and normalised to ``D<session>:<turn>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import Field

from recallserve.kernels import StrictModel

from ..records import MemoryPart, MemoryRecord

__all__ = [
    "CATEGORIES",
    "IndexOptions",
    "LocomoQuestion",
    "LocomoTurn",
    "LocomoConversation",
    "load_locomo",
    "normalise_evidence",
    "parse_session_time",
    "turn_records",
    "question_recall",
    "summarise_recall",
    "evaluate_locomo",
]

CATEGORIES: dict[int, str] = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
"""Categories asked (5, adversarial, has no answer and is skipped)."""

_DIA = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)", re.IGNORECASE)


class IndexOptions(StrictModel):
    """How a turn is written as a memory (all on by default; each measured on the dev file)."""

    speaker: bool = Field(default=True, description="Prefix the text with the speaker's name.")
    date: bool = Field(default=True, description="Add the session date in words to the text.")
    caption: bool = Field(default=True, description="Append the shared image's caption.")
    # NOTE: 2 measured best on the dev file (recall@10 0.753 vs 0.736 with 1 and 0.743 with 3).
    context_window: int = Field(default=2, ge=0, le=8, description="Neighbouring turns each side stored as a second part (0 = none).")


class LocomoTurn(StrictModel):
    """One utterance."""

    dia_id: str = Field(description="Normalised dialogue id D<session>:<turn>.")
    speaker: str = Field(description="Who said it.")
    text: str = Field(description="What was said.")
    caption: str | None = Field(default=None, description="BLIP caption of a shared image.")
    session: int = Field(ge=1, description="Session number.")
    time: float = Field(description="Session start, epoch seconds (UTC).")
    date_text: str = Field(description="Session date as written in the file.")


class LocomoQuestion(StrictModel):
    """One question with its evidence."""

    question: str = Field(description="Question text.")
    evidence: list[str] = Field(description="Normalised evidence dia_ids.")
    category: int = Field(ge=1, le=5, description="LoCoMo category.")


class LocomoConversation(StrictModel):
    """A conversation's turns (in order) and questions."""

    sample_id: str = Field(description="Conversation id (used as the tenant).")
    turns: list[LocomoTurn] = Field(description="All turns, session by session.")
    questions: list[LocomoQuestion] = Field(description="All questions.")


def normalise_evidence(raw: Sequence[Any]) -> list[str]:
    """Evidence ids as ``D<session>:<turn>`` without leading zeros, malformed ones repaired.

    Example:
        >>> normalise_evidence(["D8:6; D9:17", "D:11:26", "D30:05"])
        ['D8:6', 'D9:17', 'D11:26', 'D30:5']
    """
    out: list[str] = []
    for item in raw:
        for piece in re.split(r"[;,\s]+(?=D)", str(item)):
            m = _DIA.search(piece)
            if m:
                norm = f"D{int(m.group(1))}:{int(m.group(2))}"
                if norm not in out:
                    out.append(norm)
    return out


def parse_session_time(text: str) -> float:
    """``"1:56 pm on 8 May, 2023"`` -> epoch seconds (taken as UTC).

    Raises:
        ValueError: naming the text when it does not parse.
    """
    cleaned = " ".join(text.replace(",", " , ").split()).replace(" ,", ",")
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%H:%M on %d %B, %Y"):
        try:
            return datetime.strptime(cleaned, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    raise ValueError(f"session date_time: cannot parse {text!r}")


def load_locomo(path: str | Path) -> list[LocomoConversation]:
    """Read a LoCoMo-format JSON file.

    Raises:
        ValueError: unreadable file or a missing field, named with its conversation.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of conversations")
    out = []
    for ci, conv in enumerate(data):
        where = f"{path}[{ci}]"
        if not isinstance(conv, dict) or not isinstance(conv.get("conversation"), dict):
            raise ValueError(f"{where}.conversation: missing")
        body = conv["conversation"]
        sessions = sorted(
            int(m.group(1)) for key in body if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(body[key], list)
        )
        turns = []
        for s in sessions:
            date_text = body.get(f"session_{s}_date_time")
            if not isinstance(date_text, str):
                raise ValueError(f"{where}.conversation.session_{s}_date_time: missing")
            when = parse_session_time(date_text)
            for ti, turn in enumerate(body[f"session_{s}"]):
                try:
                    dia = normalise_evidence([turn["dia_id"]])
                    turns.append(LocomoTurn(
                        dia_id=dia[0] if dia else f"D{s}:{ti + 1}", speaker=str(turn["speaker"]), text=str(turn["text"]),
                        caption=turn.get("blip_caption") or None, session=s, time=when, date_text=date_text,
                    ))
                except (KeyError, TypeError) as exc:
                    raise ValueError(f"{where}.conversation.session_{s}[{ti}]: missing field {exc}") from None
        questions = []
        for qi, qa in enumerate(conv.get("qa", [])):
            try:
                questions.append(LocomoQuestion(question=str(qa["question"]), evidence=normalise_evidence(qa.get("evidence", [])),
                                                category=int(qa["category"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{where}.qa[{qi}]: {exc}") from None
        out.append(LocomoConversation(sample_id=str(conv.get("sample_id", f"conv-{ci}")), turns=turns, questions=questions))
    return out


def _date_words(turn: LocomoTurn) -> str:
    dt = datetime.fromtimestamp(turn.time, tz=timezone.utc)
    return f"{dt.day} {dt.strftime('%B')} {dt.year}"


def _utterance(turn: LocomoTurn, opts: IndexOptions) -> str:
    text = turn.text.strip() or "(no text)"
    if opts.caption and turn.caption:
        text = f"{text} [shares a photo of {turn.caption.strip()}]"
    if opts.speaker and opts.date:
        return f"{turn.speaker} said on {_date_words(turn)}: {text}"
    if opts.speaker:
        return f"{turn.speaker}: {text}"
    if opts.date:
        return f"On {_date_words(turn)}: {text}"
    return text


def turn_records(conv: LocomoConversation, tenant: str, opts: IndexOptions | None = None) -> list[MemoryRecord]:
    """One memory per turn of ``conv`` for ``tenant`` (see the module docstring)."""
    opts = opts or IndexOptions()
    records = []
    turns = conv.turns
    for i, turn in enumerate(turns):
        parts = []
        if opts.context_window > 0:
            lo, hi = max(0, i - opts.context_window), min(len(turns), i + opts.context_window + 1)
            # NOTE: context stays inside the session: a neighbour from another day is another topic.
            window = [t for t in turns[lo:hi] if t.session == turn.session]
            if len(window) > 1:
                ctx = " ".join(f"{t.speaker}: {t.text.strip()}" + (f" [photo of {t.caption}]" if opts.caption and t.caption else "")
                               for t in window)
                parts.append(MemoryPart(name="context", kind="message", text=ctx[:32_000]))
        records.append(MemoryRecord(
            tenant=tenant, source_id=turn.dia_id, kind="message", text=_utterance(turn, opts)[:32_000], parts=parts,
            metadata={"speaker": turn.speaker, "session": turn.session, "date": turn.date_text},
            created_at=turn.time, topic_path=f"locomo/{conv.sample_id}/session-{turn.session}",
        ))
    return records


def question_recall(ranked_sources: Sequence[str], evidence: Sequence[str], ks: Sequence[int]) -> dict[int, float]:
    """Share of ``evidence`` found in the first k of ``ranked_sources``, for each k."""
    if not evidence:
        raise ValueError("evidence: empty")
    gold = set(evidence)
    return {k: len(gold & set(ranked_sources[:k])) / len(gold) for k in ks}


def summarise_recall(rows: Sequence[tuple[int, dict[int, float]]], ks: Sequence[int]) -> dict[str, dict[str, float]]:
    """Mean recall per category name and ``overall`` from ``(category, {k: recall})`` rows.

    Returns ``{"overall": {"n": .., "recall@1": ..}, "multi-hop": {...}, ...}``.
    """
    groups: dict[str, list[dict[int, float]]] = {"overall": []}
    for cat, rec in rows:
        groups["overall"].append(rec)
        groups.setdefault(CATEGORIES.get(cat, str(cat)), []).append(rec)
    out: dict[str, dict[str, float]] = {}
    for name in ["overall", *CATEGORIES.values()]:
        recs = groups.get(name, [])
        if not recs:
            continue
        out[name] = {"n": float(len(recs)), **{f"recall@{k}": sum(r[k] for r in recs) / len(recs) for k in ks}}
    return out


async def evaluate_locomo(
    conversations: Sequence[LocomoConversation],
    write: Callable[[list[MemoryRecord]], Awaitable[Any]],
    search: Callable[[str, str, int], Awaitable[list[str]]],
    ks: Sequence[int] = (1, 5, 10, 20, 50),
    index: IndexOptions | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, dict[str, float]]:
    """Index every conversation (tenant = its sample id), ask its category 1-4 questions, score.

    Args:
        conversations: from :func:`load_locomo`.
        write: ``write(records)`` stores records (tenant set on each) durably: the service's write path.
        search: ``search(tenant, question, k)`` -> ranked source ids (the service's search path).
        ks: cut-offs.
        index: how turns become memories.
        progress: called with (questions done, questions total).

    Returns:
        :func:`summarise_recall` of all asked questions.
    """
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"ks: need positive cut-offs, got {list(ks)}")
    ks = sorted(set(ks))
    asked = [(c, q) for c in conversations for q in c.questions if q.category in CATEGORIES and q.evidence]
    for conv in conversations:
        recs = turn_records(conv, conv.sample_id, index)
        # NOTE: batches of 256 bound one WAL append and one embedder call.
        for start in range(0, len(recs), 256):
            await write(recs[start : start + 256])
    rows = []
    for i, (conv, q) in enumerate(asked):
        ranked = await search(conv.sample_id, q.question, max(ks))
        rows.append((q.category, question_recall(ranked, q.evidence, ks)))
        if progress is not None:
            progress(i + 1, len(asked))
    return summarise_recall(rows, ks)
