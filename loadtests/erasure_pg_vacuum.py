"""What an erasure's ``VACUUM FULL`` costs with state in PostgreSQL, and why plain VACUUM is not enough.

On the ``turns`` table (the largest state table: each trace keeps the rendered prompt), through the
real :class:`~recallserve.serve.traces.TraceStore` (``erase_user`` = DELETE, then
``Database.release_erased`` = ``VACUUM (FULL) turns``). ``--users`` users hold ``--rows`` traces
in all (bodies of ~1.5 KB, stored inline, so their bytes are greppable), and user ``ublk`` as many
in one contiguous run (whole pages of one user); ``u1`` (scattered) and ``ublk`` are erased.

Figures, for each table size:

* ``delete_s`` / ``vacuum_full_s``: the DELETE, and the VACUUM FULL after it;
* ``reader_max_ms`` / ``reader_p50_ms``: a concurrent reader of another tenant's traces
  (``TraceStore.recent``) during the VACUUM FULL: its ACCESS EXCLUSIVE lock queues every read;
* ``plain_vacuum_files`` / ``full_vacuum_files``: files under ``base/`` that still hold each erased
  user's marker (``[u1, ublk]``) after DELETE + plain VACUUM + CHECKPOINT, then after VACUUM FULL + CHECKPOINT.

Needs a superuser DSN of a throwaway server (CHECKPOINT, ``data_directory``) on this machine, e.g. the
test helper's: ``python -c "from tests._postgres import postgres_server; ..."``; see docs/erasure.md.

Run: ``flock /tmp/rs-heavy.lock nice -n 5 python -m loadtests.erasure_pg_vacuum --dsn postgresql://postgres@127.0.0.1:PORT/postgres --out loadtests/results/erasure-pg-vacuum.json``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from recallserve.serve.statedb import PostgresDatabase
from recallserve.serve.traces import TraceConfig, TraceStore


def _files_holding(folder: Path, needle: bytes) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes())


def _fill(dsn: str, rows: int, users: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE turns")
        # NOTE: rpad fills with md5 text: ~1.5 KB, under the TOAST threshold, so stored inline uncompressed.
        conn.execute(
            "INSERT INTO turns (tenant, id, created_at, session_id, user_id, summary, context, body) "
            "SELECT CASE WHEN g %% 10 = 0 AND u <> 'ublk' THEN 'globex' ELSE 'acme' END, 't' || g, extract(epoch from now()) + g, "
            "'s' || (g %% 50), u, '{}', '{}', rpad('zqmark-' || u || ' ', 1500, md5(g::text)) "
            "FROM (SELECT g, CASE WHEN g > %s AND g <= %s THEN 'ublk' ELSE 'u' || (g %% %s) END AS u "
            "FROM generate_series(1, %s) g) x",
            (rows // 2, rows // 2 + rows // users, users, rows))


def _one(dsn: str, data: Path, rows: int, users: int) -> dict[str, Any]:
    _fill(dsn, rows, users)
    db = PostgresDatabase(dsn, pool_size=4)
    store = TraceStore(config=TraceConfig(), db=db)
    markers = (b"zqmark-u1 ", b"zqmark-ublk ")
    with psycopg.connect(dsn, autocommit=True) as conn:
        size = conn.execute("SELECT pg_total_relation_size('turns')").fetchone()[0]  # type: ignore[index]
        conn.execute("CHECKPOINT")
        written = [_files_holding(data / "base", m) for m in markers]  # NOTE: the control: on disk before
        # NOTE: plain VACUUM first, on the same rows: does it clear the bytes?
        start = time.perf_counter()
        deleted = conn.execute("DELETE FROM turns WHERE tenant = 'acme' AND user_id IN ('u1', 'ublk')").rowcount
        delete_s = time.perf_counter() - start
        conn.execute("VACUUM turns")
        conn.execute("CHECKPOINT")
    plain = [_files_holding(data / "base", m) for m in markers]
    _fill(dsn, rows, users)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    waits: list[float] = []
    stop = threading.Event()

    def reader() -> None:
        async def loop() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                await store.count("globex")
                waits.append((time.perf_counter() - t0) * 1000)
                await asyncio.sleep(0.005)
        asyncio.run(loop())

    async def erase() -> tuple[int, float, float]:
        t0 = time.perf_counter()
        n = await store.db.call(lambda c: c.execute("DELETE FROM turns WHERE tenant = ? AND user_id IN (?, ?)",
                                                    ("acme", "u1", "ublk")).rowcount, True)
        t1 = time.perf_counter()
        await asyncio.to_thread(store.db.release_erased, ("turns",))
        return n, t1 - t0, time.perf_counter() - t1

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.3)
    before = len(waits)
    n, _, full_s = asyncio.run(erase())
    during = waits[before:]
    stop.set()
    thread.join()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    full = [_files_holding(data / "base", m) for m in markers]
    db.close()
    return {"rows": rows, "users": users, "table_bytes": size, "erased_rows": deleted, "erased_rows_full": n,
            "delete_s": round(delete_s, 4), "vacuum_full_s": round(full_s, 3),
            "reader_reads_during": len(during), "reader_p50_ms": round(statistics.median(during), 2) if during else None,
            "reader_max_ms": round(max(during), 1) if during else None,
            "reader_p50_ms_before": round(statistics.median(waits[:before]), 2) if before else None,
            "files_before": written, "plain_vacuum_files": plain, "full_vacuum_files": full}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", required=True, help="superuser DSN of a throwaway server on this machine")
    p.add_argument("--rows", type=int, nargs="+", default=[20_000, 100_000], help="table sizes (traces)")
    p.add_argument("--users", type=int, default=20, help="users the traces belong to (one is erased)")
    p.add_argument("--out", type=Path, default=None, help="write the figures here (JSON)")
    args = p.parse_args(argv)
    db = PostgresDatabase(args.dsn, pool_size=1)
    TraceStore(db=db)  # NOTE: the schema, as the service migrates it
    db.close()
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        data = Path(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
    results = [_one(args.dsn, data, rows, args.users) for rows in args.rows]
    out = {"server": f"PostgreSQL {version}", "results": results}
    for r in results:
        print(f"{r['rows']:>7} traces ({r['table_bytes'] / 1e6:.0f} MB), erase {r['erased_rows']}: DELETE "
              f"{r['delete_s']:.3f} s, VACUUM FULL {r['vacuum_full_s']:.2f} s; another tenant's reads during it "
              f"p50 {r['reader_p50_ms']} ms, max {r['reader_max_ms']} ms (before: p50 {r['reader_p50_ms_before']} ms); "
              f"files holding the erased text [u1, ublk] before: {r['files_before']}, after plain VACUUM: "
              f"{r['plain_vacuum_files']}, after FULL: "
              f"{r['full_vacuum_files']}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
