"""Time to erase one end user with a few thousand items, beside other users' data (issue 41's 60 s target).

In-process, on the same code the ingress runs (``ErasureService.erase_now`` over hybrid shards with
WAL + snapshots and the SQLite stores), with HashingEmbedder vectors (the embedder is not on the
erasure path). The erased user holds ``--memories`` memories, ``--sessions`` sessions of
``--messages`` messages and ``--traces`` turn traces; ``--others`` other users hold as much each.
Prints the figures and writes them to ``--out`` (JSON).

Run: ``flock /tmp/rs-heavy.lock nice -n 5 python -m loadtests.erasure_time --out loadtests/results/erasure-time.json``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.retrieval import local_hybrid_coordinator
from recallserve.serve.context import SessionStore
from recallserve.serve.context._types import Message
from recallserve.serve.erasure import ErasureLog, ErasureService
from recallserve.serve.memory_api import MemoryService
from recallserve.serve.memory_api.schemas import MemoryIn
from recallserve.serve.traces import TraceStore
from recallserve.serve.traces._models import TurnTrace


async def _fill(memory: MemoryService, sessions: SessionStore, traces: TraceStore, user: str, args) -> None:  # type: ignore[no-untyped-def]
    for start in range(0, args.memories, 200):
        await memory.add("acme", [MemoryIn(text=f"{user} note {i} about the quarterly plan and the new office",
                                           user=user) for i in range(start, min(start + 200, args.memories))])
    for s in range(args.sessions):
        session = await sessions.open("acme", user, f"{user}-s{s}")
        msgs = [Message(role="user" if m % 2 == 0 else "assistant", content=f"{user} message {m} of session {s}",
                        tokens=8) for m in range(args.messages)]
        await sessions.append(session, msgs, [[] for _ in msgs])
    now = time.time()
    for t in range(args.traces):
        await traces.put("acme", TurnTrace(id=f"{user}-t{t}", created_at=now, user=user, question=f"{user} q {t}",
                                           answer="a", path="plain", finish_reason="stop"))


async def main(args: argparse.Namespace) -> dict:
    emb = HashingEmbedder(384)

    async def embed(texts: list[str]):  # type: ignore[no-untyped-def]
        return await asyncio.to_thread(emb.embed, texts)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=root / "memory")
        memory = MemoryService(coord, embed, threshold=0.0)
        sessions = SessionStore(root / "sessions.sqlite3")
        # NOTE: a cap above what the run writes (the default keeps 10,000 traces per tenant).
        traces = TraceStore(root / "turns.sqlite3")
        users = ["target"] + [f"other{i}" for i in range(args.others)]
        t0 = time.perf_counter()
        for user in users:
            await _fill(memory, sessions, traces, user, args)
        fill_s = time.perf_counter() - t0
        service = ErasureService(ErasureLog(root / "erasures.sqlite3"), memory.coordinators(),
                                 {"sessions": sessions, "turns": traces})
        t0 = time.perf_counter()
        counts = await service.erase_now("acme", "target")
        erase_s = time.perf_counter() - t0
        wal_bytes = sum(p.stat().st_size for p in (root / "memory").rglob("wal-*.log"))
        for c in coord.shards:
            c.shard.close()
        sessions.close()
        traces.close()
    return {"erase_s": round(erase_s, 3), "fill_s": round(fill_s, 1), "counts": counts,
            "items_of_user": args.memories + args.sessions * args.messages + args.traces,
            "other_users": args.others, "wal_bytes_after": wal_bytes, "target_s": 60}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memories", type=int, default=2000)
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--messages", type=int, default=20)
    p.add_argument("--traces", type=int, default=500)
    p.add_argument("--others", type=int, default=4)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    report = asyncio.run(main(a))
    print(json.dumps(report, indent=1))
    if a.out is not None:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
