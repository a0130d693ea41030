"""Hybrid shard + retriever: lexical rescue, weak-overlap rejection, RRF order, isolation, sharding."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from recallserve.kernels import ScoreParams
from recallserve.memory_shards import HashingEmbedder, MemoryRecord, embed_records
from recallserve.memory_shards.retrieval import HybridRetriever, RetrievalParams, local_hybrid_coordinator
from recallserve.memory_shards.records import EmbeddedRecord

DIM = 16


def _unit(i: int, j: int | None = None, w: float = 0.0) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i] = 1.0
    if j is not None:
        v[j] = w
    return v / np.linalg.norm(v)


class _Designed:
    """Test double isolating fusion from embedding quality: fixed vectors per text."""

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    async def __call__(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts])


def _setup(records: list[tuple[str, str, str, np.ndarray]], query: str, qvec: np.ndarray, shards: int = 2):
    coord = local_hybrid_coordinator(shards, "designed", DIM)
    items = [EmbeddedRecord(MemoryRecord(tenant=t, source_id=s, text=x, created_at=1e9), v[None, :]) for t, s, x, v in records]
    asyncio.run(coord.upsert(items))
    retriever = HybridRetriever(coord, _Designed({query: qvec}))
    return coord, retriever


def _search(retriever, tenant, query, k=10, hybrid=True, threshold=0.35):
    params = retriever.params if hybrid else retriever.params.model_copy(update={"lexical_candidates": 0})
    return asyncio.run(retriever.search(tenant, query, k, ScoreParams(decay="none", threshold=threshold), params=params,
                                        touch=False))


def test_lexical_rescues_an_exact_id_the_embedder_misses() -> None:
    q = "status of ZX-9913"
    _, r = _setup([
        ("acme", "t1", "Ticket ZX-9913 escalated to tier two", _unit(5)),        # cos 0 with the query
        ("acme", "t2", "Printer status page shows toner low", _unit(0, 1, 0.5)),  # cos 0.89
        ("acme", "t3", "General status update for the week", _unit(0, 2, 2.0)),  # cos 0.45
    ], q, _unit(0))
    # NOTE: the main lists' RRF alone (the default second hop would add its own list's terms; test_retrieval_hop).
    r.params = r.params.model_copy(update={"hop_hits": 0})
    dense_only = [h.record.source_id for h in _search(r, "acme", q, hybrid=False)]
    assert dense_only == ["t2", "t3"]
    hits = _search(r, "acme", q)
    by = {h.record.source_id: h for h in hits}
    assert set(by) == {"t1", "t2", "t3"}
    assert by["t1"].lexical_rank == 1 and by["t1"].dense_rank is None and by["t1"].similarity == pytest.approx(0.0, abs=1e-6)
    # t3 is in both lists (dense 2, lexical: "status"), so it outranks the lexical-only t1
    p = r.params
    assert by["t3"].score == pytest.approx(p.dense_weight / (p.rrf_k + 2) + p.lexical_weight / (p.rrf_k + by["t3"].lexical_rank))
    assert by["t1"].score == pytest.approx(p.lexical_weight / (p.rrf_k + 1))
    assert [h.record.source_id for h in hits].index("t3") < [h.record.source_id for h in hits].index("t1")


def test_weak_lexical_only_overlap_is_dropped() -> None:
    q = "zebra crossing velvet lane"
    _, r = _setup([
        ("acme", "strong", "zebra crossing on velvet lane", _unit(0)),
        ("acme", "weak", "a lane somewhere", _unit(7)),  # one common word, cos 0
    ], q, _unit(0))
    assert [h.record.source_id for h in _search(r, "acme", q)] == ["strong"]
    loose = r.params.model_copy(update={"lexical_min_ratio": 0.0})
    hits = asyncio.run(r.search("acme", q, 10, ScoreParams(decay="none"), params=loose, touch=False))
    assert [h.record.source_id for h in hits] == ["strong", "weak"]


def test_other_tenants_never_appear_shared_does() -> None:
    q = "reset the router"
    _, r = _setup([
        ("acme", "a", "reset the router by unplugging it", _unit(0)),
        ("globex", "g", "reset the router with the pin", _unit(0)),
        ("shared", "manual", "manual: reset the router in settings", _unit(0, 1, 0.2)),
    ], q, _unit(0), shards=3)
    for hybrid in (True, False):
        got = {h.record.source_id for h in _search(r, "acme", q, hybrid=hybrid, threshold=-1)}
        assert got == {"a", "manual"}
        got = {h.record.source_id for h in _search(r, "globex", q, hybrid=hybrid, threshold=-1)}
        assert got == {"g", "manual"}


def test_upsert_by_source_replaces_the_lexical_entry_and_delete_removes_it() -> None:
    q = "llama"
    coord, r = _setup([("acme", "s", "the llama ate hay", _unit(3))], q, _unit(0))
    newer = MemoryRecord(tenant="acme", source_id="s", text="the alpaca ate hay", created_at=1e9)
    asyncio.run(coord.upsert([EmbeddedRecord(newer, _unit(3)[None, :])]))
    assert _search(r, "acme", q, threshold=0.5) == []
    r.embed.table["alpaca"] = _unit(0)
    assert [h.record.id for h in _search(r, "acme", "alpaca", threshold=0.5)] == [newer.id]
    asyncio.run(coord.delete("acme", [newer.id]))
    assert _search(r, "acme", "alpaca", threshold=-1) == []


def test_sharded_hybrid_equals_one_shard() -> None:
    emb = HashingEmbedder(64)
    rng = np.random.default_rng(3)
    words = "printer toner refund invoice router modem llama wifi password laptop screen battery".split()
    recs = [MemoryRecord(tenant=f"t{i % 3}", source_id=f"s{i}", text=" ".join(rng.choice(words, 5)), created_at=1e9 + i)
            for i in range(120)]

    async def embed(texts):
        return emb.embed(texts)

    results = []
    for shards in (1, 4):
        coord = local_hybrid_coordinator(shards, emb.model_id, emb.dim)
        asyncio.run(coord.upsert(embed_records(emb, recs)))
        r = HybridRetriever(coord, embed, RetrievalParams(dense_candidates=20, lexical_candidates=20))
        results.append([[(h.record.id, round(h.score, 9)) for h in
                         asyncio.run(r.search(t, "printer toner refund", 10, ScoreParams(decay="none", threshold=0.0),
                                              touch=False))] for t in ("t0", "t1", "t2")])
    assert results[0] == results[1]
    assert all(len(x) == 10 for x in results[0])


def test_returned_records_get_their_last_access_renewed() -> None:
    q = "renew me"
    coord, r = _setup([("acme", "x", "renew me please", _unit(0))], q, _unit(0))
    hits = asyncio.run(_search_and_drain(r, q))
    assert hits
    asyncio.run(coord.flush())
    rec = asyncio.run(coord.get("acme", hits[0].record.id))
    assert rec.last_access_at == pytest.approx(2e9)


async def _search_and_drain(r, q):
    hits = await r.search("acme", q, 5, ScoreParams(decay="none"), now=2e9)
    await r.drain()
    return hits


def test_the_time_window_narrows_the_request_filters_and_never_widens_them() -> None:
    from datetime import datetime, timezone

    from recallserve.memory_shards.config import SearchFilters

    now = datetime(2023, 8, 20, tzinfo=timezone.utc).timestamp()
    may, june = (datetime(2023, m, 1, tzinfo=timezone.utc).timestamp() for m in (5, 6))
    p = RetrievalParams(date_weight=1.0, date_slack_days=0)
    window = HybridRetriever._window_filters
    f = window("what happened in May 2023?", SearchFilters(kinds=["text"]), now, p)
    assert f is not None and (f.created_after, f.created_before, f.kinds) == (may, june, ["text"])
    # the request's own range wins where it is narrower; an empty intersection asks nothing more
    assert window("in May 2023", SearchFilters(created_after=may + 86_400), now, p).created_after == may + 86_400
    assert window("in May 2023", SearchFilters(created_before=may), now, p) is None
    assert window("in May 2023", None, now, p.model_copy(update={"date_slack_days": 30})).created_before == june + 30 * 86_400
    assert window("in May 2023", None, now, p.model_copy(update={"date_weight": 0.0})) is None
    assert window("no time named here", None, now, p) is None


def test_a_memory_inside_the_named_window_moves_up() -> None:
    from datetime import datetime, timezone

    t = lambda m: datetime(2023, m, 10, tzinfo=timezone.utc).timestamp()  # noqa: E731
    coord = local_hybrid_coordinator(2, "designed", DIM)
    q = "dinner at the harbour in March 2023"
    items = [EmbeddedRecord(MemoryRecord(tenant="acme", source_id=s, text=x, created_at=c), v[None, :])
             for s, x, c, v in [("june", "dinner at the harbour", t(6), _unit(0)),
                                ("march", "dinner with Anna", t(3), _unit(0, 1, 0.5))]]
    asyncio.run(coord.upsert(items))
    retriever = HybridRetriever(coord, _Designed({q: _unit(0)}))
    now = t(8)
    on = asyncio.run(retriever.search("acme", q, 2, ScoreParams(decay="none"), now=now, touch=False))
    off = asyncio.run(retriever.search("acme", q, 2, ScoreParams(decay="none"), now=now, touch=False,
                                       params=RetrievalParams(date_weight=0.0)))
    assert [h.record.source_id for h in off] == ["june", "march"]
    assert [h.record.source_id for h in on] == ["march", "june"]
    # the hit keeps the ranks of the main lists (the window lists only add to its score)
    assert on[0].dense_rank == 2 and on[0].score > off[0].score


def _count_touches(coord) -> list[list[str]]:
    calls: list[list[str]] = []
    for shard in coord.shards:
        original = shard.touch

        async def touch(ids, at, original=original):
            calls.append(list(ids))
            await original(ids, at)

        shard.touch = touch
    return calls


def test_renewals_of_many_searches_leave_in_one_batch_off_the_request_path() -> None:
    """A renewal call per search was one more shard hop per search; they are queued and sent together."""
    q = "renew me"
    coord, r = _setup([("acme", "x", "renew me please", _unit(0)), ("acme", "y", "renew me too", _unit(0, 1, 0.3))],
                      q, _unit(0), shards=1)
    calls = _count_touches(coord)

    async def run() -> None:
        for i in range(6):
            assert await r.search("acme", q, 5, ScoreParams(decay="none"), now=2e9 + i)
        assert calls == []  # nothing sent while the searches answered
        await r.drain()

    asyncio.run(run())
    assert len(calls) == 1 and sorted(calls[0]) == sorted({h for h in calls[0]})
    asyncio.run(coord.flush())
    assert all(asyncio.run(coord.get("acme", i)).last_access_at == pytest.approx(2e9 + 5) for i in calls[0])


def test_queued_renewals_are_sent_by_a_timer_when_searches_stop() -> None:
    q = "renew me"
    coord, r = _setup([("acme", "x", "renew me please", _unit(0))], q, _unit(0), shards=1)
    coord.touch_every_seconds = 0.05
    calls = _count_touches(coord)

    async def run() -> None:
        assert await r.search("acme", q, 5, ScoreParams(decay="none"), now=2e9)
        for _ in range(100):  # NOTE: up to 5 s on a loaded machine; the timer fires after 0.05 s
            if calls:
                break
            await asyncio.sleep(0.05)

    asyncio.run(run())
    assert len(calls) == 1
