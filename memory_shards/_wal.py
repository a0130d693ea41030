"""Write-ahead log: CRC-checked JSON lines in numbered segments.

Line format (one entry per line)::

    <crc32 of the JSON bytes, 8 lowercase hex> <space> <JSON object with "seq"> \\n

A batch of entries is written, flushed and fsync'ed before the write is acknowledged, so an
acknowledged write survives a kill -9 or power loss. A crash mid-write leaves a torn last line
(no newline, or a CRC mismatch): replay stops there and the tail is truncated, which loses only
the unacknowledged batch (complete lines of that batch before the tear are replayed: the
caller never got an ack for them, so either outcome is allowed). A bad line followed by good
lines is real corruption and raises.

Segments are named ``wal-<first seq, 12 digits>.log``; after a snapshot at seq S a new segment
starts at S+1 and segments holding only entries <= S are deleted.
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["WriteAheadLog", "WalCorruptError", "decode_vectors", "encode_vectors", "fsync_dir"]

_PREFIX = "wal-"
_SUFFIX = ".log"


class WalCorruptError(RuntimeError):
    """A WAL line in the middle of the log failed its checksum (not a torn tail)."""


def encode_vectors(vectors: np.ndarray) -> str:
    """An entry's vectors as base64 of little-endian float32 rows (exact: no text rounding)."""
    return base64.b64encode(np.ascontiguousarray(vectors, dtype="<f4").tobytes()).decode("ascii")


def decode_vectors(text: str, rows: int, dim: int) -> np.ndarray:
    """The ``rows x dim`` float32 array :func:`encode_vectors` wrote."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4").reshape(rows, dim).astype(np.float32)


def _encode(entry: dict[str, Any]) -> bytes:
    payload = json.dumps(entry, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    return b"%08x " % zlib.crc32(payload) + payload + b"\n"


def _decode(line: bytes) -> dict[str, Any] | None:
    """Parse one line (with its newline); None when torn or corrupt."""
    if not line.endswith(b"\n") or len(line) < 11 or line[8:9] != b" ":
        return None
    payload = line[9:-1]
    try:
        crc = int(line[:8], 16)
    except ValueError:
        return None
    if zlib.crc32(payload) != crc:
        return None
    try:
        entry = json.loads(payload)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("seq"), int) else None


def fsync_dir(path: Path) -> None:
    """fsync a folder, so that files created, renamed or deleted in it survive a crash (WAL, snapshots)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    """Append-only, segmented, CRC-checked log of shard mutations.

    Args:
        folder: where segments live (created if missing).
        fsync: fsync after every :meth:`append` batch (the durability guarantee).
    """

    def __init__(self, folder: str | os.PathLike[str], fsync: bool = True) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._file = None
        self._path: Path | None = None
        self.entries_in_segment = 0

    def segments(self) -> list[Path]:
        """Existing segments, oldest first."""
        return sorted(p for p in self.folder.iterdir() if p.name.startswith(_PREFIX) and p.name.endswith(_SUFFIX))

    @staticmethod
    def _first_seq(path: Path) -> int:
        return int(path.name[len(_PREFIX) : -len(_SUFFIX)])

    def replay(self, after_seq: int) -> Iterator[dict[str, Any]]:
        """Yield entries with ``seq > after_seq`` in order; truncate a torn tail of the last segment.

        Raises:
            WalCorruptError: a bad line is followed by good data, or seqs go backwards.
        """
        segments = self.segments()
        last_seq = after_seq
        for index, path in enumerate(segments):
            is_last = index == len(segments) - 1
            good_bytes = 0
            with path.open("rb") as fh:
                data = fh.read()
            pos = 0
            while pos < len(data):
                end = data.find(b"\n", pos)
                line = data[pos:] if end < 0 else data[pos : end + 1]
                entry = _decode(line)
                if entry is None:
                    rest = data[pos + len(line) :]
                    if not is_last or any(_decode(x + b"\n") for x in rest.split(b"\n") if x):
                        raise WalCorruptError(f"WAL {path}: corrupt line at byte {pos} followed by more entries")
                    # NOTE: torn tail of an unacknowledged batch: cut it off so appends stay parseable.
                    with path.open("r+b") as fh:
                        fh.truncate(good_bytes)
                        fh.flush()
                        os.fsync(fh.fileno())
                    break
                pos += len(line)
                good_bytes = pos
                seq = entry["seq"]
                if seq <= after_seq:
                    continue
                if seq <= last_seq:
                    raise WalCorruptError(f"WAL {path}: seq {seq} after {last_seq}")
                last_seq = seq
                yield entry

    def open_segment(self, first_seq: int) -> None:
        """Start writing a new segment whose first entry will be ``first_seq``."""
        self.close()
        self._path = self.folder / f"{_PREFIX}{first_seq:012d}{_SUFFIX}"
        self._file = self._path.open("ab")
        self.entries_in_segment = 0
        fsync_dir(self.folder)

    def ensure_open(self, next_seq: int) -> None:
        """Open the newest segment for appending, or a new one starting at ``next_seq``."""
        if self._file is not None:
            return
        segments = self.segments()
        if segments:
            self._path = segments[-1]
            self._file = self._path.open("ab")
        else:
            self.open_segment(next_seq)

    def append(self, entries: list[dict[str, Any]]) -> int:
        """Write a batch of entries; durable on return when ``fsync`` is on. Returns the bytes written."""
        if self._file is None:
            raise RuntimeError("WAL: append before ensure_open/open_segment")
        data = b"".join(_encode(e) for e in entries)
        self._file.write(data)
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self.entries_in_segment += len(entries)
        return len(data)

    def size(self) -> int:
        """Bytes in all segments (after a snapshot: the tail a restart replays)."""
        return sum(p.stat().st_size for p in self.segments())

    def drop_through(self, seq: int) -> None:
        """Delete segments whose entries are all <= ``seq`` (covered by a snapshot)."""
        segments = self.segments()
        for path, nxt in zip(segments, segments[1:] + [None]):
            if path == self._path:
                continue
            if nxt is not None and self._first_seq(nxt) <= seq + 1:
                path.unlink()

    def close(self) -> None:
        """Close the open segment."""
        if self._file is not None:
            self._file.close()
            self._file = None
