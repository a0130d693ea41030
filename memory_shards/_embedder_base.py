"""What every embedder keeps to: the :class:`Embedder` protocol, the ids of MiniLM's vector spaces,
the input check and the L2 normalisation.

Both MiniLM runtimes (torch in :mod:`~recallserve.memory_shards.embedders`, ONNX Runtime in
:mod:`~recallserve.memory_shards.onnx_embedder`) and the hashing embedder build on this module,
which imports neither of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["Embedder", "MINILM_MODEL_ID", "MINILM_INT8_MODEL_ID", "MINILM_ONNX_INT8_MODEL_ID", "check_texts",
           "l2_normalise"]

#: model id of fp32 MiniLM: one vector space whichever runtime (torch or ONNX Runtime) computes it.
MINILM_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
#: model id of MiniLM with int8 dynamic quantization of its Linear layers (another vector space:
#: cosine to the fp32 vectors is ~0.96 on average, so its vectors never mix with fp32 ones).
MINILM_INT8_MODEL_ID = MINILM_MODEL_ID + "-int8-dynamic"
#: model id of the ONNX Runtime int8 file (another vector space than fp32 and than torch's int8).
MINILM_ONNX_INT8_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2-int8-onnx-dynamic"


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors.

    Attributes:
        model_id: identifies the vector space; stored with every vector.
        dim: vector dimension.
    """

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` -> array [len(texts), dim] float32, each row of unit L2 norm."""
        ...


def check_texts(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list, after checking that it is a sequence of strings (one string is refused).

    Raises:
        TypeError: a bare string, or an item that is not a string (names its index).
    """
    if isinstance(texts, str):
        raise TypeError("texts: pass a sequence of strings, not one string")
    out = list(texts)
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}]: expected str, got {type(text).__name__}")
    return out


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (a zero row stays zero), as contiguous float32."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    # NOTE: max(norm, 1e-12) keeps an all-zero row at zero instead of NaN.
    return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)
