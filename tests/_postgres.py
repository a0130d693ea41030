"""A real PostgreSQL 15 server for the tests: initdb + pg_ctl in a temp folder, on a free loopback port.

Debian's ``postgresql`` package (installed by ``scripts/system_deps.sh``) puts the server binaries
under ``/usr/lib/postgresql/15/bin``; ``RECALLSERVE_PG_BIN`` names another folder. initdb refuses
to run as root, so as root the server runs as the ``postgres`` system user (the folder is handed
to it). The server listens on 127.0.0.1 only, trusts local connections (a throwaway cluster) and
runs with ``fsync=off`` (its data dies with the test session anyway).

:func:`fresh_schema_dsn` gives each test its own schema (``search_path`` in the DSN), so tests
share one server yet never see each other's tables, and each schema starts at migration version 0.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["PG_BIN", "fresh_schema_dsn", "postgres_server", "stop_server"]

PG_BIN = Path(os.environ.get("RECALLSERVE_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextmanager
def postgres_server(root: Path, options: str = "") -> Iterator[str]:
    """Start a server with its data under ``root`` (``root/data``; ``options``: more ``-c name=value``
    settings); yields the DSN of its ``postgres`` database; stops it."""
    if not (PG_BIN / "initdb").exists():
        raise RuntimeError(f"PostgreSQL server binaries not found in {PG_BIN}: run scripts/system_deps.sh")
    data, sock = root / "data", root / "sock"
    root.mkdir(parents=True, exist_ok=True)
    sock.mkdir(exist_ok=True)
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        for p in (root, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    subprocess.run(_as_server_user([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                                    "-E", "UTF8", "--no-sync", "--no-instructions"]),
                   check=True, capture_output=True, timeout=120)
    port = _free_port()
    opts = (f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=200 -c shared_buffers=64MB " + options)
    subprocess.run(_as_server_user([str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"),
                                    "-w", "-t", "60", "start"]), check=True, capture_output=True, timeout=90)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_server_user([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def stop_server(dsn: str) -> None:
    """Stop the server of ``dsn`` at once (``pg_ctl stop -m immediate``, as a crash): a test of the outage."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        data = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
    subprocess.run(_as_server_user([str(PG_BIN / "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop"]),
                   check=True, capture_output=True, timeout=60)


def fresh_schema_dsn(dsn: str) -> str:
    """A DSN on the same server whose ``search_path`` is a new, empty schema."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return f"{dsn}?options=-csearch_path%3D{name}"
