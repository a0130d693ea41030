"""What every embedded SQLite store does so that a deleted row leaves the files, not only the answers.

Two settings, one place (the session, experience and trace stores call both):

* :func:`harden` turns on ``PRAGMA secure_delete``: SQLite then overwrites a deleted row's bytes
  with zeros in its page (and a freed page), instead of leaving them in free space until reuse.
* :func:`checkpoint` runs ``PRAGMA wal_checkpoint(TRUNCATE)`` after an erasure commits: the
  ``-wal`` file still holds the old page images (the inserts, the rows before the zeroing) until
  they are copied back and the file is cut to zero bytes. It waits for readers (bounded tries):
  every store here has one connection under one lock, so a busy answer is rare and short.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

__all__ = ["harden", "checkpoint", "connect"]

#: Tries of a checkpoint that found the WAL busy, 50 ms apart (a 1 s bound).
_TRIES = 20


def connect(path: str | Path, synchronous: str = "NORMAL") -> sqlite3.Connection:
    """An autocommit connection in WAL mode with rows by name and :func:`harden` applied (its
    parent folder created), for one store's single connection under that store's lock."""
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30.0)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    harden(conn)
    return conn


def harden(conn: sqlite3.Connection) -> None:
    """Zero deleted content in place on this connection (``PRAGMA secure_delete = ON``)."""
    conn.execute("PRAGMA secure_delete = ON")


def checkpoint(conn: sqlite3.Connection) -> None:
    """Copy the WAL into the database and truncate it to zero bytes.

    Raises:
        RuntimeError: still busy after the bounded tries (the erasure is retried, never reported done).
    """
    for _ in range(_TRIES):
        busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy == 0:
            return
        time.sleep(0.05)
    raise RuntimeError("sqlite: wal_checkpoint(TRUNCATE) stayed busy; the erasure will be retried")
