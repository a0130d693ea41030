"""A shard's IVF index, trained in a background thread while exact scans serve.

The first index trains when a shard's search first needs one (live rows above
``exact_max_rows``), and again when the live rows have doubled since its centroids were trained
(lists grow unbalanced; the old index serves meanwhile). Training works on copies of the vectors
taken under the shard lock, so writes go on; a compaction during training renumbers the rows, so
that index is dropped and a later search retrains.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ._ivf import IvfCandidates
from ._table import RowTable

if TYPE_CHECKING:
    import torch

    from .config import ShardConfig

__all__ = ["BackgroundIvf"]


class BackgroundIvf:
    """The trained index of one shard (``index``), its training thread and last error.

    Args:
        config: the shard's ``ivf_nlist``, ``ivf_nprobe``, ``ivf_train_sample`` and id.
        device: the shard's device (a CUDA device trains a faiss-gpu index where installed).
        lock: the shard lock, held by the caller of :meth:`current`, taken here to install.
        table: returns the shard's current table (a compacted shard has a new one).
    """

    def __init__(self, config: ShardConfig, device: torch.device, lock: threading.RLock,
                 table: Callable[[], RowTable]) -> None:
        self.config = config
        self.device = device
        self.index: IvfCandidates | None = None
        self.error: BaseException | None = None
        self._lock = lock
        self._table = table
        self._thread: threading.Thread | None = None

    @property
    def state(self) -> str:
        """``training`` while a thread runs, else ``ready`` with an index or ``none``."""
        if self._thread is not None and self._thread.is_alive():
            return "training"
        return "ready" if self.index is not None else "none"

    def drop(self) -> None:
        """Forget the index (the rows were renumbered); the next :meth:`current` retrains."""
        self.index = None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a running training; True when none is running.

        Raises:
            RuntimeError: the last training failed (the shard keeps serving exact scans).
        """
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        if self.error is not None:
            raise RuntimeError(f"IVF training failed: {self.error}") from self.error
        return self._thread is None or not self._thread.is_alive()

    def current(self, table: RowTable) -> IvfCandidates | None:
        """The trained index, or None while the first one trains (the caller scans exactly).

        Call under the shard lock. Starts a training when there is no index, or when ``table``'s
        live rows have doubled since the index was trained.
        """
        stale = self.index is not None and table.live_rows >= 2 * max(self.index.trained_rows, 1)
        idle = self._thread is None or not self._thread.is_alive()
        if (self.index is None or stale) and idle and self.error is None:
            vectors, live = table.vectors[: table.n].copy(), table.col("valid").copy()
            cfg = self.config
            gpu = (self.device.index or 0) if self.device.type == "cuda" else None
            fresh = IvfCandidates(table.dim, cfg.ivf_nlist, cfg.ivf_nprobe, gpu_device=gpu)
            self._thread = threading.Thread(target=self._train, args=(fresh, table, vectors, live),
                                            name=f"ivf-train-{cfg.shard_id}", daemon=True)
            self._thread.start()
        return self.index

    def _train(self, fresh: IvfCandidates, table: RowTable, vectors: np.ndarray, live: np.ndarray) -> None:
        try:
            fresh.build(vectors, live, self.config.ivf_train_sample)
        except BaseException as exc:  # noqa: BLE001 - reported by wait / state, exact scans go on
            self.error = exc
            return
        with self._lock:
            if self._table() is table:
                self.index = fresh
