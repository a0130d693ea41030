"""Saved KV states of long system prompts, so a llama.cpp engine keeps them across requests.

A ``llama_cpp.Llama`` has one KV cache and reuses only the longest common prefix with the
*previous* call. When a direct answer, a summary or another tenant's tool set runs in between,
the agent's ~1.3k-token system prefix (protocol + tool catalogue) is lost and the next agent
turn evaluates it again: about 9 s of prefill for the 1.5B model on 2 idle cores, minutes under
load. This store keeps the llama.cpp state saved right after such a prompt was evaluated and
puts it back when a later prompt shares more tokens with it than with the live cache.

Rules (each bounded and cheap next to a prefill):

* **save** after a prompt's evaluation when its system message is at least ``min_tokens`` long
  and no stored state already covers that system prefix; one state per distinct system prompt,
  least recently used dropped beyond ``max_states`` or ``max_bytes`` (a state of a 1.3k-token
  prompt of Qwen2.5-1.5B is 36 MB; saving it took 0.04-0.4 s, once per system prompt);
* **restore** before a prompt's evaluation when a stored state shares at least ``min_gain``
  more leading tokens with it than the live cache does (restoring 36 MB took 31 ms; the
  tokens after the shared prefix are evaluated as usual, so the answer is the same as a cold
  run's: tested token for token).

It is not llama-cpp-python's ``LlamaRAMCache``: that one saves after *every* call, with a copy of
the logits of every prompt row (n_batch x n_vocab floats, 311 MB for Qwen's vocabulary).
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PrefixStates", "common_prefix"]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays (vectorised)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


@dataclass
class _State:
    tokens: np.ndarray  # the prompt tokens the state holds (n_tokens of the Llama at save time)
    data: bytearray  # llama_state_get_data
    system_tokens: int  # the system prefix this state was saved for


class PrefixStates:
    """An LRU of llama.cpp states keyed by prompt tokens (see the module docstring).

    Every method runs on the engine's single worker thread, the only one touching the ``Llama``.
    """

    def __init__(self, max_states: int, max_bytes: int, min_tokens: int, min_gain: int) -> None:
        self.max_states = max_states
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self.min_gain = min_gain
        self._states: OrderedDict[int, _State] = OrderedDict()
        self._next = 0
        self.saves = 0
        self.restores = 0

    @property
    def enabled(self) -> bool:
        """Whether states are kept at all (``max_states`` > 0)."""
        return self.max_states > 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the stored states."""
        return sum(len(s.data) for s in self._states.values())

    def _best(self, tokens: np.ndarray) -> tuple[int | None, int]:
        best, length = None, 0
        for key, state in self._states.items():
            n = common_prefix(state.tokens, tokens)
            if n > length:
                best, length = key, n
        return best, length

    def restore(self, llm: Any, llama_cpp: Any, tokens: Sequence[int]) -> int:
        """Load the stored state sharing the most leading tokens with ``tokens`` when it beats the
        live cache by ``min_gain``; returns the tokens it restored (0 = none)."""
        if not self._states:
            return 0
        prompt = np.asarray(tokens, dtype=np.intc)
        key, length = self._best(prompt)
        live = common_prefix(np.asarray(llm._input_ids), prompt)  # noqa: SLF001 - the live cache's tokens
        if key is None or length < live + self.min_gain:
            return 0
        state = self._states[key]
        size = len(state.data)
        buf = (ctypes.c_uint8 * size).from_buffer(state.data)
        if llama_cpp.llama_state_set_data(llm._ctx.ctx, buf, size) != size:  # noqa: SLF001
            # NOTE: a state that does not load (it should not happen with the same model) is
            # dropped; the prompt is then evaluated from the live cache as before.
            del self._states[key]
            llm.n_tokens = 0
            return 0
        n = len(state.tokens)
        llm.input_ids[:n] = state.tokens
        llm.n_tokens = n
        llm._requires_eval = True  # noqa: SLF001 - restored logits must be recomputed before sampling
        self._states.move_to_end(key)
        self.restores += 1
        return n

    def maybe_save(self, llm: Any, llama_cpp: Any, system_tokens: int) -> bool:
        """Save the live state (the prompt just evaluated) when its system prefix is long and no
        stored state covers it yet; returns whether it saved."""
        if not self.enabled or system_tokens < self.min_tokens:
            return False
        prompt = np.array(llm._input_ids, dtype=np.intc)  # noqa: SLF001
        if len(prompt) < system_tokens:
            return False
        key, length = self._best(prompt)
        if key is not None and length >= system_tokens:
            self._states.move_to_end(key)
            return False
        ctx = llm._ctx.ctx  # noqa: SLF001
        size = int(llama_cpp.llama_state_get_size(ctx))
        if size > self.max_bytes:
            return False
        data = bytearray(size)
        view = (ctypes.c_uint8 * size).from_buffer(data)
        got = int(llama_cpp.llama_state_get_data(ctx, view, size))
        del view  # NOTE: releases the export, so the bytearray can be trimmed
        if got <= 0 or got > size:
            return False
        del data[got:]
        self._states[self._next] = _State(tokens=prompt, data=data, system_tokens=system_tokens)
        self._next += 1
        self.saves += 1
        while self._states and (len(self._states) > self.max_states or self.nbytes > self.max_bytes):
            self._states.popitem(last=False)
        return True

    def clear(self) -> None:
        """Drop every stored state."""
        self._states.clear()
