"""Forget on request: erase or export everything held for an end user (or a tenant), and the log of it.

See ``docs/erasure.md`` for every place the service copies a user's text and the test that covers each.
"""

from recallserve.serve.erasure._service import HOLDERS, ErasureService, OwnedMemory, OwnedStore, user_hash
from recallserve.serve.erasure._store import ErasureLog, ErasureRow
from recallserve.serve.erasure.router import build_router

__all__ = ["HOLDERS", "ErasureLog", "ErasureRow", "ErasureService", "OwnedMemory", "OwnedStore", "build_router",
           "user_hash"]
