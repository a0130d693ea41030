"""Context-mode: sessions, token budgets, modes (full / sliding / summary / retrieval / hybrid /
auto), the rolling summary and the entity table.

The ingress uses :class:`ContextManager` (see its module docstring for the per-request calls);
:class:`ContextResult` goes into the response metadata; metrics live on the default Prometheus
registry (``recallserve.serve.context._metrics``).
"""

from recallserve.serve.context._assemble import MESSAGE_OVERHEAD
from recallserve.serve.context._categorise import (
    Categoriser,
    Classifier,
    LLMClassifier,
    RuleCategoriser,
)
from recallserve.serve.context._entities import Entity, extract_entities, mask_personal
from recallserve.serve.context._manager import ContextManager
from recallserve.serve.context._retrieval import Embed
from recallserve.serve.context._store import SessionStore, default_store_path
from recallserve.serve.context._summary import ExtractiveSummariser, LLMSummariser, Summariser
from recallserve.serve.context.router import EntityOut, SessionOut, SummaryRefreshOut, build_router
from recallserve.serve.context._types import (
    DEFAULT_RETENTION,
    AutoSignals,
    Category,
    ContextBudgetError,
    ContextConfig,
    ContextError,
    ContextResult,
    Message,
    MessageIn,
    ModeName,
    ResolvedMode,
    Session,
    SessionNotFoundError,
    SummaryState,
    TokenBreakdown,
)

__all__ = [
    "build_router",
    "SessionOut",
    "EntityOut",
    "SummaryRefreshOut",
    "ContextManager",
    "ContextConfig",
    "ContextResult",
    "TokenBreakdown",
    "AutoSignals",
    "MessageIn",
    "Message",
    "Session",
    "SummaryState",
    "Category",
    "ModeName",
    "ResolvedMode",
    "DEFAULT_RETENTION",
    "MESSAGE_OVERHEAD",
    "ContextError",
    "ContextBudgetError",
    "SessionNotFoundError",
    "SessionStore",
    "default_store_path",
    "Categoriser",
    "RuleCategoriser",
    "Classifier",
    "LLMClassifier",
    "Summariser",
    "LLMSummariser",
    "ExtractiveSummariser",
    "Entity",
    "extract_entities",
    "mask_personal",
    "Embed",
]
