"""Model answers kept in one JSON file, so an eval or a resumable pass does not ask the model twice.

The file is one JSON object: key (a hash of model, prompt and input, chosen by the user of the
cache) -> entry (a JSON object). Every :meth:`AnswerCache.store` rewrites the file atomically
(write a temporary file, then rename), so a pass stopped at any point leaves a whole file.
Used by query decomposition (``deployments/cli/_decompose.py``) and write-time enrichment
(:mod:`recallserve.serve.enrich`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["AnswerCache"]


class AnswerCache:
    """The entries stored in ``path`` (created on the first store).

    Raises:
        ValueError: the file exists but is not a JSON object ("<path>: not a <what> (...)").
    """

    what = "model answer cache"
    """How a bad file is named in the error (a subclass names its own kind)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.entries: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ValueError(f"{self.path}: not a {self.what} ({exc})") from None
            if not isinstance(data, dict):
                raise ValueError(f"{self.path}: not a {self.what} (expected a JSON object)")
            self.entries = data

    def entry(self, key: str) -> dict[str, Any] | None:
        """The entry stored under ``key``, or None."""
        return self.entries.get(key)

    def store(self, key: str, entry: dict[str, Any]) -> None:
        """Store ``entry`` under ``key`` and rewrite the file (write then rename: never a half-written file)."""
        self.entries[key] = entry
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.entries, indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, self.path)
