"""A small TTL + LRU cache for tool and retrieval results (shared by the runs of one Agent)."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["TTLCache", "cache_key"]


def cache_key(*parts: Any) -> str:
    """A canonical string key: JSON with sorted keys, so ``{"a":1,"b":2}`` == ``{"b":2,"a":1}``."""
    return json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)


class TTLCache:
    """Entries expire ``ttl_s`` seconds after they were stored; the least recently used go first.

    Args:
        ttl_s: time to live in seconds (0 disables the cache).
        max_entries: capacity; inserting beyond it evicts the least recently used entry.
        clock: monotonic clock in seconds (injectable so tests can move time).
    """

    def __init__(self, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s < 0:
            raise ValueError(f"ttl_s: must be >= 0, got {ttl_s}")
        if max_entries < 1:
            raise ValueError(f"max_entries: must be >= 1, got {max_entries}")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> tuple[bool, Any]:
        """(found, value); an expired entry counts as a miss and is dropped."""
        with self._lock:
            item = self._data.get(key)
            if item is None or self.ttl_s == 0:
                self.misses += 1
                return False, None
            stored_at, value = item
            if self._clock() - stored_at >= self.ttl_s:
                del self._data[key]
                self.misses += 1
                return False, None
            self._data.move_to_end(key)
            self.hits += 1
            return True, value

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key`` (no-op when the TTL is 0)."""
        if self.ttl_s == 0:
            return
        with self._lock:
            self._data[key] = (self._clock(), value)
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def clear(self) -> None:
        """Drop every entry (an erasure: cached recalls may hold the erased user's memories)."""
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)
