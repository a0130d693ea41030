"""Ingestion through a real cluster, per embedder setting, in one run: ``recallserve bench ingest --url``.

``python -m loadtests.ingest_cluster --scratch /tmp/ingest-cluster --port 8741 \\
    --setting 'bulk={}' --setting 'before={"bulk_min_texts": 100000}' -- --locomo FILE --batches 20 --chat "..."``

Starts ``recallserve up`` from this checkout on the ``cpu-local`` profile with its folders under
``--scratch`` and HTTP on 127.0.0.1:``--port``; for each ``--setting LABEL=JSON`` (JSON merged
over the profile's ``embedder`` section) rolls the running cluster to it with ``recallserve
deploy`` (only the deployments whose arguments changed restart), waits until the reasoner is
idle (the ingress's prompt warm-up), runs ``bench ingest --url`` with the arguments after ``--``,
and finally stops the cluster (SIGTERM to its PID, SIGKILL after 60 s). The reports go to
``--out`` (JSON) with a Markdown table beside it, settings in the order given, so a before and an
after are measured on the same cluster minutes apart. ``{"bulk_min_texts": 100000}`` never makes
a bulk call: the embedder as it was before bulk calls existed.

Run it under the machine's lock for heavy work: one Ray cluster and 2 cores per machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["main", "parse_setting"]

_ROOT = Path(__file__).resolve().parents[1]
# NOTE: the CLI of this checkout with this interpreter (``python -m``), not whichever ``recallserve`` is on PATH.
_CLI = ["-m", "recallserve.deployments.cli"]


def parse_setting(text: str) -> tuple[str, dict[str, Any]]:
    """``LABEL=JSON`` -> (label, embedder overrides); raises ValueError naming the bad part."""
    label, sep, raw = text.partition("=")
    if not sep or not label.strip():
        raise ValueError(f"--setting: expected LABEL=JSON, got {text!r}")
    try:
        overrides = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"--setting {label}: not JSON ({exc})") from None
    if not isinstance(overrides, dict):
        raise ValueError(f"--setting {label}: expected a JSON object, got {raw!r}")
    return label.strip(), overrides


def _write_profile(scratch: Path, port: int, embedder: dict[str, Any]) -> Path:
    import yaml

    from recallserve.deployments.config import PROFILES_DIR, load_config

    data = yaml.safe_load((PROFILES_DIR / "cpu-local.yaml").read_text())
    data["server"] = {**data.get("server", {}), "host": "127.0.0.1", "port": port}
    data["memory"] = {**data.get("memory", {}), "data_dir": str(scratch / "memory")}
    data["state_dir"] = str(scratch / "state")
    data["ray"] = {**data.get("ray", {}), "temp_dir": str(scratch / "ray")}
    data["embedder"] = {**data.get("embedder", {}), **embedder}
    path = scratch / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    load_config(path=path)  # NOTE: a bad setting fails here, before a cluster starts
    return path


def _wait_reasoner_idle(limit_s: float) -> None:
    """Wait (at most ``limit_s``) until the reasoner replica uses < 5% of a core over 5 s (warm-up done)."""
    import psutil

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        procs = [p for p in psutil.process_iter(["cmdline"])
                 if (p.info["cmdline"] or [""])[0].startswith("ray::ServeReplica") and "reasoner" in p.info["cmdline"][0]]
        try:
            t0 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
            time.sleep(5)
            share = (sum(p.cpu_times().user + p.cpu_times().system for p in procs) - t0) / 5
        except psutil.NoSuchProcess:
            continue
        if share < 0.05:
            return
        print(f"reasoner busy ({share:.2f} cores), waiting", flush=True)


def _cli(*argv: str, log: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *_CLI, *argv], cwd=_ROOT, text=True, check=False,
                          stdout=subprocess.PIPE if log is None else log.open("a"), stderr=subprocess.STDOUT)


@contextmanager
def running_up(scratch: Path, port: int, embedder: dict[str, Any], start_timeout_s: float) -> Iterator[Path]:
    """``recallserve up`` on ``scratch``'s profile (:func:`_write_profile`) until the block ends; yields the profile.

    Waits for the log's "ready in" line (at most ``start_timeout_s``; an ``up`` that exits or does not get ready
    ends the run with its log's tail), then stops the cluster on the way out: SIGTERM to its PID, SIGKILL after 60 s.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    log = scratch / "up.log"
    profile = _write_profile(scratch, port, embedder)
    # NOTE: unbuffered, so the log holds the last words of an `up` that dies.
    up = subprocess.Popen([sys.executable, *_CLI, "up", "--config", str(profile)], cwd=_ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        while "ready in" not in log.read_text():
            if up.poll() is not None or time.monotonic() - started > start_timeout_s:
                print(log.read_text()[-3000:], file=sys.stderr)
                raise SystemExit(f"recallserve up did not get ready (exit status {up.poll()})")
            time.sleep(2)
        print(f"cluster ready after {time.monotonic() - started:.0f} s", flush=True)
        yield profile
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()


def main(argv: list[str] | None = None) -> int:
    """Start, measure every setting, stop; see the module docstring."""
    argv = list(sys.argv[1:] if argv is None else argv)
    bench = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m loadtests.ingest_cluster", description=__doc__.splitlines()[0])
    p.add_argument("--scratch", type=Path, required=True, help="folder for the cluster's memory, state and Ray files")
    p.add_argument("--port", type=int, default=8741, help="HTTP port on 127.0.0.1 (default 8741)")
    p.add_argument("--setting", action="append", required=True, help="LABEL=JSON over the embedder section (repeatable)")
    p.add_argument("--start-timeout-s", type=float, default=420, help="most seconds for `up` to be ready")
    p.add_argument("--out", type=Path, default=Path("loadtests/results/memory-ingest-cluster-cpu-local.json"))
    args = p.parse_args(own)
    settings = [parse_setting(s) for s in args.setting]
    # NOTE: a SIGTERM (e.g. from `timeout`) becomes SystemExit, so the cluster is still stopped below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scratch = args.scratch.resolve()
    reports: list[tuple[str, dict[str, Any]]] = []
    with running_up(scratch, args.port, settings[0][1], args.start_timeout_s) as profile:
        for i, (label, overrides) in enumerate(settings):
            if i:
                _write_profile(scratch, args.port, overrides)
                t0 = time.monotonic()
                done = _cli("deploy", "--config", str(profile))
                if done.returncode:
                    raise SystemExit(f"deploy {label} failed: {done.stdout[-2000:]}")
                print(f"deployed {label} in {time.monotonic() - t0:.0f} s", flush=True)
            _wait_reasoner_idle(300)
            out = scratch / f"{label}.json"
            done = _cli("bench", "ingest", "--url", f"http://127.0.0.1:{args.port}", "--label", label, "--out", str(out),
                        *bench)
            print(done.stdout[-3000:], flush=True)
            if done.returncode:
                raise SystemExit(f"bench ingest {label} failed")
            reports.append((label, {**json.loads(out.read_text()), "embedder_overrides": overrides}))
            _write_reports(args.out, argv, reports)  # NOTE: after each setting, so a cut-off run keeps what it measured
    return 0


def _write_reports(out: Path, argv: list[str], reports: list[tuple[str, dict[str, Any]]]) -> None:
    from recallserve.deployments.cli._bench_ingest_cluster import render

    table = render(reports)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python -m loadtests.ingest_cluster " + shlex.join(argv)
    out.write_text(json.dumps({"command": command,
                               "reports": [{"label": lab, **r} for lab, r in reports]}, indent=2) + "\n")
    out.with_suffix(".md").write_text(
        f"# Ingestion through the cluster\n\n`{command}`\n\n{table}")
    print(table, flush=True)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
