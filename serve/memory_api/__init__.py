"""The memory API (``/v1/memories``): schemas, service logic and the FastAPI router factory.

The ingress builds it with ``build_router(MemoryService(coordinator, embed, ...), get_tenant)``;
the same :class:`MemoryService` is the chat pipeline's :class:`~recallserve.serve.memory.MemoryBackend`.
"""

from recallserve.serve.memory_api.router import build_router
from recallserve.serve.memory_api.schemas import (
    MAX_BATCH,
    MAX_K,
    AddMemoriesRequest,
    AddMemoriesResponse,
    DecayIn,
    FiltersIn,
    MemoryIn,
    MemoryOut,
    SearchRequest,
    SearchResponse,
    SearchResult,
)
from recallserve.serve.memory_api.migration import MigratingMemoryService
from recallserve.serve.memory_api.admission import SearchAdmission, SearchAdmissionConfig
from recallserve.serve.memory_api.service import MemoryOverloaded, MemoryService, MemoryUnavailable

__all__ = [
    "MAX_BATCH",
    "MAX_K",
    "AddMemoriesRequest",
    "AddMemoriesResponse",
    "DecayIn",
    "FiltersIn",
    "MemoryIn",
    "MemoryOut",
    "MemoryOverloaded",
    "MemoryService",
    "MemoryUnavailable",
    "MigratingMemoryService",
    "SearchAdmission",
    "SearchAdmissionConfig",
    "SearchRequest",
    "SearchResponse",
    "SearchResult",
    "build_router",
]
