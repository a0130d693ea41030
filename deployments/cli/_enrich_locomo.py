"""LoCoMo turns as the enricher's windows, and the facts a filled cache holds for them.

Used by ``recallserve eval locomo --enrich`` and ``python -m loadtests.locomo_enrich_cost`` (which
fills the cache ahead): both build the same windows, so the cache keys match.

A window is ``size`` consecutive turns of one session (a session is one day's conversation; its
turns share the session's time). The fill order is fixed before any result is seen: session 1 of
every conversation, then session 2 of every conversation, and so on, so a pass stopped anywhere has
enriched the first sessions of all three conversations alike (questions are never looked at).
"""

from __future__ import annotations

from collections.abc import Sequence

from recallserve.memory_shards.retrieval.locomo import LocomoConversation, LocomoQuestion
from recallserve.serve.enrich import EnrichConfig, EnrichmentCache, Exchange

__all__ = ["session_windows", "fill_order", "cached_facts", "covered_questions"]


def session_windows(conv: LocomoConversation, size: int) -> dict[int, list[list[Exchange]]]:
    """Each session's turns as windows of at most ``size`` consecutive exchanges (record id = dia_id)."""
    out: dict[int, list[list[Exchange]]] = {}
    for t in conv.turns:
        text = t.text.strip() + (f" [shares a photo of {t.caption.strip()}]" if t.caption else "")
        wins = out.setdefault(t.session, [])
        if not wins or len(wins[-1]) == size:
            wins.append([])
        wins[-1].append(Exchange(t.dia_id, text or "(no text)", t.time, t.speaker))
    return out


def fill_order(convs: Sequence[LocomoConversation], size: int) -> list[tuple[str, int, list[Exchange]]]:
    """``(sample_id, session, window)`` in the fill order: session 1 of every conversation, then session 2, ..."""
    per = {c.sample_id: session_windows(c, size) for c in convs}
    most = max((max(s, default=0) for s in per.values()), default=0)
    return [(c.sample_id, s, w) for s in range(1, most + 1) for c in convs for w in per[c.sample_id].get(s, [])]


def cached_facts(cache: EnrichmentCache, model: str, conv: LocomoConversation,
                 config: EnrichConfig) -> tuple[dict[str, list[str]], set[int]]:
    """The facts the cache holds for ``conv``'s turns (dia_id -> facts) and the sessions wholly enriched."""
    facts: dict[str, list[str]] = {}
    done: set[int] = set()
    for session, wins in session_windows(conv, config.window).items():
        got = [cache.get(model, w, config) for w in wins]
        if all(g is not None for g in got):
            done.add(session)
        for w, g in zip(wins, got):
            if g is not None:
                facts.update({e.record_id: fs for e, fs in zip(w, g.facts) if fs})
    return facts, done


def covered_questions(questions: Sequence[LocomoQuestion], sessions: set[int]) -> list[LocomoQuestion]:
    """The questions whose evidence turns all lie in ``sessions``."""
    return [q for q in questions if q.evidence and all(int(e[1:].split(":")[0]) in sessions for e in q.evidence)]
