"""A file of router-model decompositions, so repeated ``eval locomo --decompose`` runs do not re-run the model.

One JSON object ``{key: {"question", "queries", "model_ms", "completion_tokens", "model"}}``; the
key is :func:`recallserve.serve.memory_api.decompose.prompt_key` (model name, prompt, question), so
a changed prompt or model is a miss, never a stale hit. The file is rewritten atomically after each
new entry (an interrupted fill keeps what it had and resumes). A miss runs the real model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from recallserve.serve.memory_api.decompose import (
    Decomposition,
    QueryDecomposer,
    prompt_key,
)

__all__ = ["CachedDecomposer", "DecompositionCache"]


class DecompositionCache:
    """The decompositions stored in ``path`` (created on the first save)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ValueError(f"{self.path}: not a decomposition cache ({exc})") from None
            if not isinstance(data, dict):
                raise ValueError(f"{self.path}: not a decomposition cache (expected a JSON object)")
            self.entries = data

    def get(self, model: str, question: str) -> Decomposition | None:
        """The stored decomposition of ``question`` by ``model``, or None."""
        e = self.entries.get(prompt_key(model, question))
        if e is None:
            return None
        return Decomposition([str(q) for q in e["queries"]], float(e["model_ms"]), int(e["completion_tokens"]))

    def put(self, model: str, question: str, d: Decomposition) -> None:
        """Store ``d`` and rewrite the file (write then rename: never a half-written file)."""
        self.entries[prompt_key(model, question)] = {
            "question": question, "queries": d.queries, "model_ms": round(d.model_ms, 1),
            "completion_tokens": d.completion_tokens, "model": model}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.entries, indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, self.path)


class CachedDecomposer:
    """A decomposer reading ``cache`` first; a miss builds the real one (``load()``: loads the model) and stores its answer.

    Attributes:
        hits, misses: counts of this run.
    """

    def __init__(self, cache: DecompositionCache, model: str, load: Callable[[], QueryDecomposer]) -> None:
        self.cache = cache
        self.model = model
        self._load = load
        self._inner: QueryDecomposer | None = None
        self.hits = 0
        self.misses = 0

    async def __call__(self, question: str) -> Decomposition:
        got = self.cache.get(self.model, question)
        if got is not None:
            self.hits += 1
            return got
        if self._inner is None:
            self._inner = self._load()
        d = await self._inner(question)
        self.misses += 1
        self.cache.put(self.model, question, d)
        return d


AsyncDecompose = Callable[[str], Awaitable[Decomposition]]
