"""Ray's temp folder, kept short enough for the Unix sockets Ray makes inside it.

Ray binds its sockets at ``<temp_dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store``.
A Unix socket path holds at most 107 bytes on Linux (``sun_path`` is 108 bytes with the NUL), and
the part Ray adds after ``temp_dir`` is up to 64 bytes (a 7-digit pid), so ``temp_dir`` itself
may take at most ``107 - 64 = 43`` bytes. A checkout a little deeper than usual
(``/check/work/main/.recallserve/ray-test-reembed`` is 46) made ``ray.init`` fail with
"AF_UNIX path length cannot exceed 107 bytes".

A longer folder is therefore reached through a short symlink ``/tmp/rs-ray-<sha1(path)[:12]>``
that points at it: Ray's files still land where the config says, the socket paths stay short,
and the alias is a pure function of the folder, so a job looking for the cluster started with
``temp_dir`` (``find_local_cluster``) finds the same name the runner gave Ray.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["MAX_TEMP_DIR_BYTES", "ray_temp_dir", "ray_temp_dir_names"]

SOCKET_PATH_MAX_BYTES = 107
# "/session_2026-12-02_23-00-20_308980_" (36) + a 7-digit pid + "/sockets/plasma_store" (21).
RAY_SUFFIX_MAX_BYTES = 36 + 7 + 21
MAX_TEMP_DIR_BYTES = SOCKET_PATH_MAX_BYTES - RAY_SUFFIX_MAX_BYTES
_ALIAS_ROOT = Path("/tmp")


def _alias(resolved: Path) -> Path:
    digest = hashlib.sha1(str(resolved).encode("utf-8")).hexdigest()[:12]
    return _ALIAS_ROOT / f"rs-ray-{digest}"


def ray_temp_dir_names(temp_dir: Path) -> tuple[Path, ...]:
    """Every name Ray may have been given for ``temp_dir``: the absolute folder and, when it is too
    long for Ray's sockets, its short alias (the one :func:`ray_temp_dir` hands to Ray)."""
    resolved = Path(temp_dir).expanduser().resolve()
    if len(str(resolved).encode("utf-8")) <= MAX_TEMP_DIR_BYTES:
        return (resolved,)
    return (resolved, _alias(resolved))


def ray_temp_dir(temp_dir: Path) -> Path:
    """Create ``temp_dir`` and return the name to pass to Ray as ``_temp_dir``.

    That is the absolute folder when it is at most :data:`MAX_TEMP_DIR_BYTES` long, else a symlink
    ``/tmp/rs-ray-<hash>`` to it (made here; an existing alias to the same folder is reused).

    Raises:
        ValueError: the alias name is taken by something that is not a link to ``temp_dir``.
    """
    names = ray_temp_dir_names(temp_dir)
    resolved = names[0]
    resolved.mkdir(parents=True, exist_ok=True)
    if len(names) == 1:
        return resolved
    alias = names[1]
    try:
        os.symlink(resolved, alias, target_is_directory=True)
    except FileExistsError:
        pass  # made by an earlier start, or by a process racing this one
    if not (alias.is_symlink() and Path(os.readlink(alias)) == resolved):
        raise ValueError(
            f"ray.temp_dir: {resolved} is too long for Ray's sockets ({len(str(resolved))} > "
            f"{MAX_TEMP_DIR_BYTES} bytes) and its short alias {alias} is taken by something else; "
            "remove it or set a shorter ray.temp_dir")
    return alias
