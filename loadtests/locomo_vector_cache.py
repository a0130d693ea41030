"""Run ``recallserve eval locomo`` with the embedder's vectors served from an on-disk cache.

Not part of the serving path: the eval's ranking runs unchanged (same shards, fusion and service);
only ``recallserve.memory_shards.embedders.build_embedder`` is wrapped in this process so that a text embedded
by an earlier run is read back instead of re-embedded (the 2 shared cores take minutes to embed the
dev file's ~7,000 texts and questions). A text not in the cache is embedded by the real model and
added. The cache is keyed by (model id, SHA-256 of the text), so a cached vector is the vector the
model gives for that exact text; fp32 MiniLM on one thread is deterministic, so figures equal the
plain command's.

Usage (from the repo root)::

    OMP_NUM_THREADS=1 python -m loadtests.locomo_vector_cache CACHE.npz eval locomo FILE [eval options]
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np

from recallserve.memory_shards import embedders


class CachedEmbedder:
    """An embedder whose ``embed`` reads vectors from ``store`` and embeds only the misses."""

    def __init__(self, inner, store: dict[str, np.ndarray]) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.store = store
        self.misses = 0

    def _key(self, text: str) -> str:
        # NOTE: hashed with the model id so that a key is a plain file name inside the .npz.
        return hashlib.sha256(f"{self.model_id}\0{text}".encode("utf-8")).hexdigest()

    def embed(self, texts):
        texts = list(texts)
        keys = [self._key(t) for t in texts]
        missing = [i for i, key in enumerate(keys) if key not in self.store]
        if missing:
            vecs = self.inner.embed([texts[i] for i in missing])
            for i, v in zip(missing, vecs):
                self.store[keys[i]] = np.asarray(v, dtype=np.float32)
            self.misses += len(missing)
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self.store[key] for key in keys]).astype(np.float32)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(argv[0])
    store: dict[str, np.ndarray] = {}
    if path.exists():
        with np.load(path) as z:
            store = {k: z[k] for k in z.files}
    made: list[CachedEmbedder] = []
    original = embedders.build_embedder

    def build(model, **kw):
        emb = CachedEmbedder(original(model, **kw), store)
        made.append(emb)
        return emb

    embedders.build_embedder = build
    from recallserve.deployments.cli import main as cli_main

    rc = cli_main(argv[1:])
    if any(e.misses for e in made):
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **store)
        os.replace(tmp, path)
    print(f"vector cache {path}: {len(store)} vectors, {sum(e.misses for e in made)} embedded now", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
