"""WordLlama: static word embeddings (a token table, averaged), the fast embedder option.

WordLlama (github.com/dleemiller/WordLlama, MIT; PyPI ``wordllama==0.4.0.post1``) keeps the token
embedding table of a large LLM, trained further as a sentence encoder; a text's vector is the mean of
its tokens' rows, L2-normalised::

    v(text) = normalise( sum_t E[t] * m_t / sum_t m_t )        E: [vocab, 256] float32, m: attention mask

No transformer runs: embedding is a tokenizer pass and a table lookup, far below MiniLM's forward
(``loadtests/results/embedder-wordllama.md``). The ``l2_supercat`` weights (256 dims, 16 MB) and
tokenizer ship inside the wheel; they are checked against the sha256 below before use, and never
downloaded (the package would try Hugging Face when a file is missing; here that is an error).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from recallserve.memory_shards._embedder_base import check_texts, l2_normalise

__all__ = ["WordLlamaEmbedder", "WORDLLAMA_MODEL_ID", "WORDLLAMA_FILES"]

WORDLLAMA_MODEL_ID = "dleemiller/word-llama-l2-supercat-256"
"""The vector space: l2_supercat, first 256 dimensions (the file's full width)."""

WORDLLAMA_FILES: dict[str, str] = {
    "weights/l2_supercat_256.safetensors": "64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5",
    "tokenizers/l2_supercat_tokenizer_config.json": "93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68",
}
"""Files of the wordllama 0.4.0.post1 wheel (relative to its package folder) and their sha256."""


class WordLlamaEmbedder:
    """WordLlama l2_supercat (256-d) from the ``wordllama`` wheel; weights load and are verified on first use.

    Example:
        >>> emb = WordLlamaEmbedder()
        >>> emb.embed(["hello"]).shape  # doctest: +SKIP
        (1, 256)
    """

    model_id = WORDLLAMA_MODEL_ID
    dim = 256

    def __init__(self, batch_size: int = 64) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size: must be > 0, got {batch_size}")
        self.batch_size = batch_size
        self._model = None
        self._lock = threading.Lock()

    def _load(self):
        with self._lock:
            if self._model is None:
                try:
                    import wordllama
                except ImportError as exc:
                    raise ImportError("the wordllama embedder needs the package: pip install wordllama==0.4.0.post1") from exc
                root = Path(wordllama.__file__).parent
                for rel, digest in WORDLLAMA_FILES.items():
                    path = root / rel
                    if not path.is_file():
                        raise FileNotFoundError(f"wordllama: {path} missing (expected in the 0.4.0.post1 wheel)")
                    with path.open("rb") as fh:
                        got = hashlib.file_digest(fh, "sha256").hexdigest()
                    if got != digest:
                        raise ValueError(f"wordllama: {path} sha256 mismatch (expected {digest})")
                # NOTE: cache_dir = the package folder, where the wheel's tokenizer sits under tokenizers/ (the
                # package's own look-up reads tokenizer/, singular, and would go to Hugging Face); downloads off.
                self._model = wordllama.WordLlama.load(config="l2_supercat", dim=self.dim, cache_dir=root,
                                                      disable_download=True)
            return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` -> [n, 256] unit-norm float32."""
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), np.float32)
        model = self._load()
        return l2_normalise(np.asarray(model.embed(items, norm=False, batch_size=self.batch_size), dtype=np.float32))
