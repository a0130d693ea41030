"""Joining part files into one GGUF and verifying sha256 digests, with remembered verdicts.

Hashing a 1.1 GB file takes a few seconds on this class of machine, far too long to repeat on
every replica start, so a successful check leaves a small JSON marker keyed on the file's
absolute path and recording its size and ``st_mtime_ns``: a file whose size and mtime still
match its marker is trusted without re-hashing; any change makes it be hashed again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

__all__ = [
    "ModelError",
    "ModelNotInstalledError",
    "ModelIntegrityError",
    "natural_key",
    "sha256_file",
    "marker_path",
    "is_marked_verified",
    "write_marker",
    "verify_file",
    "join_parts",
    "file_lock",
]

# NOTE: 8 MiB reads keep hashing I/O-bound without holding much memory.
_CHUNK = 8 << 20


class ModelError(RuntimeError):
    """A model file is missing, not installed or unusable; the message says what to do."""


class ModelNotInstalledError(ModelError):
    """The packages carrying a built-in model's bytes are not installed."""


class ModelIntegrityError(ModelError):
    """A model file's sha256 differs from the expected one."""


def natural_key(name: str) -> list[int | str]:
    """Sort key that orders ``part2.bin`` before ``part10.bin`` (digit runs compare as numbers)."""
    return [int(tok) if tok.isdigit() else tok for tok in re.split(r"(\d+)", name)]


def sha256_file(path: Path, *, progress: bool = False) -> str:
    """Return the hex sha256 of ``path``, optionally with a tqdm bar on stderr."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    with (
        path.open("rb") as fh,
        tqdm(total=size, unit="B", unit_scale=True, desc=f"sha256 {path.name}", disable=not progress) as bar,
    ):
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def marker_path(markers_dir: Path, path: Path) -> Path:
    """Where the verification marker of ``path`` lives (one JSON file per absolute path)."""
    key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:20]
    return markers_dir / f"{key}.json"


def is_marked_verified(markers_dir: Path, path: Path, expected_sha256: str) -> bool:
    """True when a marker says ``path`` (at its current size and mtime) hashes to ``expected_sha256``."""
    marker = marker_path(markers_dir, path)
    try:
        data = json.loads(marker.read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return (
        data.get("path") == str(path.resolve())
        and data.get("size") == st.st_size
        and data.get("mtime_ns") == st.st_mtime_ns
        and data.get("sha256") == expected_sha256
    )


def write_marker(markers_dir: Path, path: Path, sha256: str) -> None:
    """Record that ``path``, at its current size and mtime, hashes to ``sha256`` (atomic write)."""
    markers_dir.mkdir(parents=True, exist_ok=True)
    st = path.stat()
    payload = {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}
    marker = marker_path(markers_dir, path)
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, marker)


def verify_file(
    path: Path, expected_sha256: str, markers_dir: Path, *, force: bool = False, progress: bool = True
) -> None:
    """Check ``path`` against ``expected_sha256``, trusting a matching marker unless ``force``.

    Raises:
        ModelError: ``path`` does not exist.
        ModelIntegrityError: the digest differs; the message names the file and both digests.
    """
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist")
    if not force and is_marked_verified(markers_dir, path, expected_sha256):
        return
    actual = sha256_file(path, progress=progress)
    if actual != expected_sha256:
        raise ModelIntegrityError(
            f"sha256 mismatch for {path}: expected {expected_sha256}, got {actual}; "
            "the file is corrupt or not the model it claims to be, refusing to load it"
        )
    write_marker(markers_dir, path, actual)


def join_parts(
    parts: Sequence[Path], dest: Path, expected_sha256: str, markers_dir: Path, *, progress: bool = True
) -> None:
    """Concatenate ``parts`` in order into ``dest``, hashing on the way; publish only if it verifies.

    The bytes go to a temporary file beside ``dest`` that is renamed over it (``os.replace``,
    atomic on one filesystem) only once its sha256 equals ``expected_sha256``, so a crash or a
    bad part never leaves a half-written or wrong file under the final name.

    Raises:
        ModelIntegrityError: the joined bytes hash to something else (nothing is published).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    try:
        with (
            tmp.open("wb") as out,
            tqdm(total=total, unit="B", unit_scale=True, desc=f"joining {dest.name}", disable=not progress) as bar,
        ):
            for part in parts:
                with part.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if actual != expected_sha256:
            raise ModelIntegrityError(
                f"sha256 mismatch joining {len(parts)} parts into {dest}: expected {expected_sha256}, "
                f"got {actual}; first part {parts[0] if parts else '-'}; reinstall the part packages"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    write_marker(markers_dir, dest, actual)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed) for the ``with`` body.

    Several replicas starting at once on one machine must not join the same model twice.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
