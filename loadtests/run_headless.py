"""Bounded headless locust run against a local cluster, with a JSON + markdown report.

Usage (a cluster from ``recallserve up`` on 127.0.0.1:8000)::

    python -m loadtests.run_headless --users 4 --spawn-rate 1 --run-time 60
    python -m loadtests.run_headless --sweep 1,2,4,8 --run-time 45 --kinds chat
    python -m loadtests.run_headless --kinds chat,memory_write,memory_search

The report (``report.json`` and ``report.md`` in ``--out``) gives, per endpoint and aggregated:
requests, failures, requests/s, error rate, p50/p95/p99 and max latency (ms). With ``--sweep`` it
runs each user count in turn and names the highest throughput whose error rate stays below
``--max-error-rate`` (default 1%).

Bounds (NOTE: this machine has 2 shared cores): at most 64 users, a spawn rate of at most the user
count, 5-900 s per run, and the host must be 127.0.0.1/localhost.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from loadtests._guard import HostRefused, check_host  # noqa: E402

__all__ = ["EndpointStats", "parse_stats_csv", "run_locust", "build_report", "to_markdown", "main"]

MAX_USERS = 64
MIN_RUN_S, MAX_RUN_S = 5, 900
KINDS = ("chat", "agent", "memory_write", "memory_search")


@dataclass(frozen=True)
class EndpointStats:
    """One row of locust's ``*_stats.csv`` (latencies in milliseconds)."""

    method: str
    name: str
    requests: int
    failures: int
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    avg_ms: float

    @property
    def error_rate(self) -> float:
        """failures / requests (0 when nothing was sent)."""
        return self.failures / self.requests if self.requests else 0.0


def _num(row: dict[str, str], key: str) -> float:
    value = (row.get(key) or "").strip()
    return float(value) if value not in ("", "N/A") else 0.0


def parse_stats_csv(path: Path) -> list[EndpointStats]:
    """Rows of a locust ``<prefix>_stats.csv``; the ``Aggregated`` row is last.

    Raises:
        ValueError: the file lacks a column this report needs (a locust format change).
    """
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        needed = {"Type", "Name", "Request Count", "Failure Count", "Requests/s", "50%", "95%", "99%", "Max Response Time", "Average Response Time"}
        missing = needed - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: locust stats CSV lacks columns {sorted(missing)}")
        rows = [
            EndpointStats(
                method=r["Type"] or "",
                name=r["Name"],
                requests=int(_num(r, "Request Count")),
                failures=int(_num(r, "Failure Count")),
                rps=_num(r, "Requests/s"),
                p50_ms=_num(r, "50%"),
                p95_ms=_num(r, "95%"),
                p99_ms=_num(r, "99%"),
                max_ms=_num(r, "Max Response Time"),
                avg_ms=_num(r, "Average Response Time"),
            )
            for r in reader
        ]
    rows.sort(key=lambda s: s.name == "Aggregated")
    return rows


def run_locust(host: str, users: int, spawn_rate: float, run_time_s: int, kinds: list[str], out_prefix: Path,
               env: dict[str, str] | None = None) -> int:
    """Run locust headless in a subprocess; returns its exit code (stats land at ``out_prefix``)."""
    cmd = [
        sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py"), "--headless",
        "-u", str(users), "-r", str(spawn_rate), "-t", f"{run_time_s}s", "--host", host,
        "--csv", str(out_prefix), "--only-summary", "--stop-timeout", "30", "--loglevel", "WARNING",
    ]
    full_env = {**os.environ, **(env or {}), "RECALLSERVE_LOAD_USERS": ",".join(kinds),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    log = out_prefix.with_suffix(".log")
    with log.open("w") as f:
        # NOTE: hard wall-clock bound: run time + spawn + 30 s stop timeout + 60 s start margin.
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT,
                              timeout=run_time_s + 30 + 60 + users / max(spawn_rate, 0.1))
    return proc.returncode


def build_report(levels: list[dict[str, Any]], meta: dict[str, Any], max_error_rate: float) -> dict[str, Any]:
    """The report: every level run and the best one under the error budget."""
    best = None
    for level in levels:
        agg = level["aggregated"]
        if agg["requests"] and agg["error_rate"] < max_error_rate and (best is None or agg["rps"] > best["aggregated"]["rps"]):
            best = level
    return {"meta": meta, "max_error_rate": max_error_rate, "levels": levels,
            "best_users": best["users"] if best else None}


def _level(users: int, rows: list[EndpointStats], exit_code: int) -> dict[str, Any]:
    def d(s: EndpointStats) -> dict[str, Any]:
        return {**asdict(s), "error_rate": round(s.error_rate, 5)}

    agg = [s for s in rows if s.name == "Aggregated"]
    return {"users": users, "locust_exit_code": exit_code,
            "endpoints": [d(s) for s in rows if s.name != "Aggregated"],
            "aggregated": d(agg[0]) if agg else d(EndpointStats("", "Aggregated", 0, 0, 0, 0, 0, 0, 0, 0))}


def to_markdown(report: dict[str, Any]) -> str:
    """The report as markdown tables (one per user level)."""
    m = report["meta"]
    lines = [f"# recallserve load test ({m['started_utc']})", "",
             f"host {m['host']}, user kinds {', '.join(m['kinds'])}, {m['run_time_s']} s per level, "
             f"spawn rate {m['spawn_rate']}/s, max_tokens {m['max_tokens']}", ""]
    for level in report["levels"]:
        lines += [f"## {level['users']} users", "",
                  "| endpoint | requests | req/s | errors | p50 ms | p95 ms | p99 ms | max ms |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for e in level["endpoints"] + [level["aggregated"]]:
            name = f"{e['method']} {e['name']}".strip()
            lines.append(f"| {name} | {e['requests']} | {e['rps']:.2f} | {100 * e['error_rate']:.1f}% | "
                         f"{e['p50_ms']:.0f} | {e['p95_ms']:.0f} | {e['p99_ms']:.0f} | {e['max_ms']:.0f} |")
        lines.append("")
    best = report["best_users"]
    lines.append(f"Highest throughput with < {100 * report['max_error_rate']:.0f}% errors: "
                 + (f"{best} users." if best is not None else "none (every level over the error budget)."))
    return "\n".join(lines) + "\n"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="http://127.0.0.1:8000", help="cluster URL (127.0.0.1/localhost only)")
    p.add_argument("--users", type=int, default=2, help=f"concurrent users (1-{MAX_USERS})")
    p.add_argument("--sweep", default=None, help="comma list of user counts to run in turn, e.g. 1,2,4,8")
    p.add_argument("--spawn-rate", type=float, default=1.0, help="users started per second")
    p.add_argument("--run-time", type=int, default=60, help=f"seconds per level ({MIN_RUN_S}-{MAX_RUN_S})")
    p.add_argument("--kinds", default="chat", help=f"user kinds: comma list of {', '.join(KINDS)}")
    p.add_argument("--max-tokens", type=int, default=16, help="max_tokens of chat requests")
    p.add_argument("--max-error-rate", type=float, default=0.01, help="error budget for the best level")
    p.add_argument("--out", type=Path, default=None, help="report folder (default bench-results/loadtest-<time>)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        host = check_host(args.host)
    except HostRefused as exc:
        print(f"run_headless: error: {exc}", file=sys.stderr)
        return 2
    levels = [int(x) for x in args.sweep.split(",")] if args.sweep else [args.users]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    problems = [f"users: {u} not in 1..{MAX_USERS}" for u in levels if not 1 <= u <= MAX_USERS]
    problems += [f"kinds: unknown {k!r}" for k in kinds if k not in KINDS] or ([] if kinds else ["kinds: empty"])
    if not MIN_RUN_S <= args.run_time <= MAX_RUN_S:
        problems.append(f"run-time: {args.run_time} not in {MIN_RUN_S}..{MAX_RUN_S} s")
    if args.spawn_rate <= 0:
        problems.append(f"spawn-rate: must be > 0, got {args.spawn_rate}")
    if problems:
        print("run_headless: error: " + "; ".join(problems), file=sys.stderr)
        return 2
    out = args.out or ROOT / "bench-results" / time.strftime("loadtest-%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    meta = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": host, "kinds": kinds,
            "run_time_s": args.run_time, "spawn_rate": args.spawn_rate, "max_tokens": args.max_tokens}
    results = []
    for users in levels:
        prefix = out / f"u{users}"
        print(f"run_headless: {users} users for {args.run_time} s ...", flush=True)
        code = run_locust(host, users, min(args.spawn_rate, users), args.run_time, kinds, prefix,
                          env={"RECALLSERVE_LOAD_MAX_TOKENS": str(args.max_tokens)})
        stats = prefix.parent / f"{prefix.name}_stats.csv"
        if not stats.is_file():
            print(f"run_headless: error: locust wrote no stats (exit {code}); see {prefix.with_suffix('.log')}", file=sys.stderr)
            return 1
        level = _level(users, parse_stats_csv(stats), code)
        results.append(level)
        agg = level["aggregated"]
        print(f"  {agg['requests']} requests, {agg['rps']:.2f} req/s, errors {100 * agg['error_rate']:.1f}%, "
              f"p50 {agg['p50_ms']:.0f} ms, p95 {agg['p95_ms']:.0f} ms, p99 {agg['p99_ms']:.0f} ms", flush=True)
    report = build_report(results, meta, args.max_error_rate)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(to_markdown(report))
    print(f"run_headless: report in {out}/report.md and report.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
