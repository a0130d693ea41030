"""FAISS IVF candidate generator for large shards.

Above ``ShardConfig.exact_max_rows`` live rows an exact scan costs O(N*D) per query; an
``IndexIVFFlat`` (inner product = cosine on unit vectors) probes ``nprobe`` of ``nlist`` lists
instead. It only *generates candidates*: the shard re-scores their union with the same fused
kernel, so masks, decay, dedup and tie rules are identical to the exact path and only recall can
differ. The row index is the FAISS id; dead rows stay in the index and are excluded by an
``IDSelectorBitmap`` built from the live & visible mask, so a masked-out majority does not crowd
the candidates out.
"""

from __future__ import annotations

import numpy as np

__all__ = ["IvfCandidates"]


def _faiss():
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - base dependency
        raise ImportError("the IVF index needs faiss (pip install faiss-cpu, or faiss-gpu from the [gpu] extra)") from exc
    return faiss


class IvfCandidates:
    """IndexIVFFlat over a shard's rows (ids = row indices).

    Args:
        dim: vector dimension.
        nlist: number of inverted lists; clipped so every list gets ~39 training vectors
            (FAISS warns below that).
        nprobe: lists probed per query.
    """

    def __init__(self, dim: int, nlist: int, nprobe: int) -> None:
        self.dim = dim
        self.nlist = nlist
        self.nprobe = nprobe
        self.index = None
        self.ntotal = 0

    @property
    def ready(self) -> bool:
        """True once trained."""
        return self.index is not None

    def build(self, vectors: np.ndarray, live: np.ndarray, train_sample: int, seed: int = 0) -> None:
        """Train on a sample of live rows and add every row ``0..len(vectors)``."""
        faiss = _faiss()
        live_rows = np.flatnonzero(live)
        rng = np.random.default_rng(seed)
        sample = live_rows if live_rows.size <= train_sample else rng.choice(live_rows, train_sample, replace=False)
        # NOTE: 39 points per centroid is FAISS's own minimum before it warns about training.
        nlist = int(max(1, min(self.nlist, sample.size // 39)))
        quantizer = faiss.IndexFlatIP(self.dim)
        index = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(np.ascontiguousarray(vectors[np.sort(sample)]))
        self.index = index
        self.nlist = nlist
        self.ntotal = 0
        self.add(vectors, 0)

    def add(self, vectors: np.ndarray, start: int) -> None:
        """Add rows ``start..len(vectors)`` (ids = row indices)."""
        if self.index is None or start >= vectors.shape[0]:
            return
        block = np.ascontiguousarray(vectors[start:])
        self.index.add_with_ids(block, np.arange(start, vectors.shape[0], dtype=np.int64))
        self.ntotal = vectors.shape[0]

    def candidates(self, queries: np.ndarray, visible: np.ndarray, per_query: int) -> np.ndarray:
        """Sorted unique rows among each query's ``per_query`` nearest visible rows."""
        faiss = _faiss()
        if self.index is None:
            raise RuntimeError("IVF index used before build()")
        n = visible.shape[0]
        bitmap = np.packbits(visible, bitorder="little")
        selector = faiss.IDSelectorBitmap(n, faiss.swig_ptr(bitmap))
        params = faiss.SearchParametersIVF(sel=selector, nprobe=min(self.nprobe, self.nlist))
        _, ids = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), per_query, params=params)
        ids = ids[ids >= 0]
        return np.unique(ids)
