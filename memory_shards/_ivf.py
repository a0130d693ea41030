"""FAISS IVF candidate generator for large shards.

Above ``ShardConfig.exact_max_rows`` live rows an exact scan costs O(N*D) per query; an
``IndexIVFFlat`` (inner product = cosine on unit vectors) probes ``nprobe`` of ``nlist`` lists
instead. It only *generates candidates*: the shard re-scores their union with the same fused
kernel, so masks, decay, dedup and tie rules are identical to the exact path and only recall can
differ. The row index is the FAISS id; dead rows stay in the index and are excluded by an
``IDSelectorBitmap`` built from the live & visible mask, so a masked-out majority does not crowd
the candidates out.

On a CUDA shard the index lives on the GPU when faiss is a GPU build (faiss-gpu: the same
``faiss`` module with ``StandardGpuResources``); otherwise CPU FAISS. Classic GPU indexes ignore
an ``IDSelector`` (faiss issues #3114, #3924), so there the search oversamples (x4, x16, up to
FAISS's GPU limit of 2048 neighbours) and drops invisible rows afterwards; the same path runs on
the CPU when ``filter_in_index=False`` (tests).
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


#: FAISS's GPU top-k limit (k and nprobe at most 2048 on GPU indexes).
GPU_MAX_K = 2048


def faiss_gpu_available() -> bool:
    """True when ``faiss`` imports, is a GPU build and sees a GPU."""
    try:
        import faiss
    except ImportError:
        return False
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class IvfCandidates:
    """IndexIVFFlat over a shard's rows (ids = row indices).

    Args:
        dim: vector dimension.
        nlist: number of inverted lists; clipped so every list gets ~39 training vectors
            (FAISS warns below that).
        nprobe: lists probed per query.
        gpu_device: CUDA device index to hold the index on (faiss-gpu only), or None for CPU.
        filter_in_index: pass the visibility mask to FAISS as an ``IDSelector`` (CPU indexes);
            False oversamples and filters afterwards (forced on GPU indexes).
    """

    def __init__(
        self, dim: int, nlist: int, nprobe: int, gpu_device: int | None = None, filter_in_index: bool = True
    ) -> None:
        self.dim = dim
        self.nlist = nlist
        self.nprobe = nprobe
        self.gpu_device = gpu_device if gpu_device is not None and faiss_gpu_available() else None
        self.filter_in_index = filter_in_index and self.gpu_device is None
        self.index = None
        self.ntotal = 0
        #: live rows the centroids were trained on (the shard retrains when it doubles).
        self.trained_rows = 0
        self._gpu_res = None

    @property
    def on_gpu(self) -> bool:
        """True when the index is a faiss-gpu index."""
        return self.gpu_device is not None

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
        if self.gpu_device is not None:
            self._gpu_res = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(self._gpu_res, self.gpu_device, index)
        index.train(np.ascontiguousarray(vectors[np.sort(sample)]))
        self.index = index
        self.nlist = nlist
        self.trained_rows = int(live_rows.size)
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
        q = np.ascontiguousarray(queries, dtype=np.float32)
        nprobe = min(self.nprobe, self.nlist)
        if self.filter_in_index:
            n = visible.shape[0]
            bitmap = np.packbits(visible, bitorder="little")
            selector = faiss.IDSelectorBitmap(n, faiss.swig_ptr(bitmap))
            params = faiss.SearchParametersIVF(sel=selector, nprobe=nprobe)
            _, ids = self.index.search(q, per_query, params=params)
            ids = ids[ids >= 0]
            return np.unique(ids)
        return np.unique(self._oversampled(q, visible, per_query, nprobe))

    def _oversampled(self, q: np.ndarray, visible: np.ndarray, per_query: int, nprobe: int) -> np.ndarray:
        """Visible rows among each query's nearest, searching 4x, 16x... deeper until every query
        has ``per_query`` of them, the lists run dry, or FAISS's GPU limit (2048) is reached."""
        self.index.nprobe = min(nprobe, GPU_MAX_K)
        want = min(per_query, GPU_MAX_K)
        depth = min(GPU_MAX_K, 4 * want)
        while True:
            _, ids = self.index.search(q, depth)
            ok = ids >= 0
            ok[ok] = visible[ids[ok]]
            enough = (ok.sum(axis=1) >= want) | (ids[:, -1] < 0)
            if enough.all() or depth >= GPU_MAX_K:
                break
            depth = min(GPU_MAX_K, 4 * depth)
        # NOTE: keep each query's first `want` visible ids (the nearest ones).
        rank = np.cumsum(ok, axis=1)
        return ids[ok & (rank <= want)]
