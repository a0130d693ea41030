"""Greedy decoding under a grammar that checks the grammar on the best token first.

llama-cpp-python's sampler chain applies a grammar to every candidate of the vocabulary before
it picks one: with Qwen2.5's 151,936 tokens that is one grammar check per vocabulary entry per
generated token. For greedy decoding (temperature 0) the answer is the highest-logit token the
grammar accepts, so it suffices to

1. take the highest-logit token ``t`` (``argmax`` over the logits),
2. ask the grammar about ``t`` alone; if it accepts ``t``, ``t`` is the answer,
3. otherwise apply the grammar to the whole vocabulary and take the best accepted token

(the same order as llama.cpp's own ``common_sampler_sample`` with ``grammar_first = false``).
Step 3 gives exactly what the chain gives; step 2 gives it too, because the best token overall
that the grammar accepts is the best accepted token. Inside a JSON string almost every token is
accepted, so step 3 runs only at the few structural positions where the model's best guess is
not allowed.

:func:`install` replaces ``Llama._init_sampler`` on one ``Llama`` instance: a greedy request with
a grammar and neutral penalties gets a :class:`LazyGrammarSampler`; everything else gets the
stock chain.
"""

from __future__ import annotations

import ctypes
import math
import types
from typing import Any

import numpy as np

__all__ = ["LazyGrammarSampler", "install"]

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


class LazyGrammarSampler:
    """Greedy sampling under one grammar; the ``sample(ctx, idx)`` surface of ``LlamaSampler``."""

    def __init__(self, lib: Any, model: Any, grammar: Any, n_vocab: int) -> None:
        self._lib = lib
        self._n = n_vocab
        self._grammar = lib.llama_sampler_init_grammar(
            model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8"))  # noqa: SLF001
        if not self._grammar:
            raise ValueError("llama.cpp rejected the grammar")
        self._one = (lib.llama_token_data * 1)()
        self._full = (lib.llama_token_data * n_vocab)()
        self._full_np = np.frombuffer(self._full, dtype=_TOKEN_DATA, count=n_vocab)
        self._full_np["id"] = np.arange(n_vocab, dtype=np.int32)
        #: Tokens decided by step 2 and by step 3 (for tests and profiling).
        self.fast = 0
        self.slow = 0

    def _apply(self, data: Any, size: int) -> None:
        arr = self._lib.llama_token_data_array(data, size, -1, False)
        self._lib.llama_sampler_apply(self._grammar, ctypes.byref(arr))

    def sample(self, ctx: Any, idx: int = -1) -> int:
        """The next token for the logits at ``idx`` of ``ctx`` (a ``LlamaContext``); accepted into the grammar."""
        ptr = self._lib.llama_get_logits_ith(ctx.ctx, idx)
        logits = np.ctypeslib.as_array(ptr, shape=(self._n,))
        best = int(np.argmax(logits))
        self._one[0].id, self._one[0].logit, self._one[0].p = best, float(logits[best]), 0.0
        self._apply(self._one, 1)
        if self._one[0].logit != -math.inf:
            self.fast += 1
            token = best
        else:
            self.slow += 1
            self._full_np["logit"] = logits
            self._full_np["p"] = 0.0
            self._apply(self._full, self._n)
            scores = self._full_np["logit"]
            token = int(self._full_np["id"][int(np.argmax(scores))])
            if scores.max() == -np.inf:
                raise RuntimeError("the grammar accepts no token here")
        self._lib.llama_sampler_accept(self._grammar, token)
        return token

    def accept(self, token: int) -> None:
        """Advance the grammar by ``token`` (tokens chosen outside :meth:`sample`)."""
        self._lib.llama_sampler_accept(self._grammar, token)

    def reset(self) -> None:
        """Back to the grammar's start."""
        self._lib.llama_sampler_reset(self._grammar)

    def close(self) -> None:
        """Free the grammar sampler."""
        if self._grammar:
            self._lib.llama_sampler_free(self._grammar)
            self._grammar = None

    def __del__(self) -> None:
        self.close()


def _neutral(kwargs: dict[str, Any]) -> bool:
    return (kwargs.get("temp", 0.8) == 0.0 and kwargs.get("logits_processor") is None
            and kwargs.get("repeat_penalty", 1.0) == 1.0 and kwargs.get("frequency_penalty", 0.0) == 0.0
            and kwargs.get("presence_penalty", 0.0) == 0.0 and kwargs.get("mirostat_mode", 0) == 0)


def install(llm: Any, lib: Any) -> None:
    """Make greedy grammar requests of ``llm`` (a ``llama_cpp.Llama``) use :class:`LazyGrammarSampler`."""
    stock = llm._init_sampler  # noqa: SLF001 - the one place llama-cpp-python builds its sampler

    def init_sampler(self: Any, **kwargs: Any) -> Any:
        grammar = kwargs.get("grammar")
        if grammar is not None and _neutral(kwargs):
            return LazyGrammarSampler(lib, self._model, grammar, self._n_vocab)  # noqa: SLF001
        return stock(**kwargs)

    llm._init_sampler = types.MethodType(init_sampler, llm)  # noqa: SLF001
