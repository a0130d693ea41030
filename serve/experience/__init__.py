"""E-CoT experience memory: segmented reasoning traces that are verified by code and reused.

A reasoner's trace is parsed into context / reasoning / verification / outcome segments
(:func:`parse_segmented`), its verification items are executed (:func:`verify_record`:
safe calculator, unit table, rule table), its confidence derived from the results, and it is
filed in the active cache, the archival cache or the human review queue
(:class:`ExperienceService`). Retrieved experiences are injected into the reasoner's prompt
together with the checks they imply. :func:`build_router` exposes it over HTTP.

The service, its store, caches, prompt and router load on first use (:func:`recallserve.kernels.lazy_exports`):
they pull in torch (through ``memory_shards``) and FastAPI, and the verification worker process
(:mod:`recallserve.serve.experience._pool`) imports this package only for the checks: importing those stays
light, so a worker starts in about a second instead of tens of seconds on a busy host.
"""

from typing import TYPE_CHECKING

from recallserve.kernels import lazy_exports
from recallserve.serve.experience._calculator import CalcError, evaluate
from recallserve.serve.experience._models import (
    ConflictAlert,
    ExperienceConfig,
    ExperienceHit,
    ExperienceView,
    LabelRequest,
    MaintenanceReport,
    ProduceResult,
    SearchRequest,
    SearchResult,
)
from recallserve.serve.experience._parser import ParseReport, ParsedTrace, parse_segmented
from recallserve.serve.experience._rules import Rule, RuleError, RuleTable
from recallserve.serve.experience._schema import (
    SCHEMA_VERSION,
    ExperienceContext,
    ExperienceEvaluation,
    ExperienceMetadata,
    ExperienceOutcome,
    ExperienceRecord,
    Quantity,
    ReasoningStep,
    VerificationItem,
    check_topic,
)
from recallserve.serve.experience._units import DimensionError, parse_quantity, to_unit
from recallserve.serve.experience._verify import derive_confidence, run_check, verify_record

if TYPE_CHECKING:
    from recallserve.serve.experience._api import build_router
    from recallserve.serve.experience._caches import decay_factor, model_family, rank_active
    from recallserve.serve.experience._prompt import SYSTEM_PROMPT, build_messages
    from recallserve.serve.experience._service import Embedder, ExperienceNotFound, ExperienceService
    from recallserve.serve.experience._store import ExperienceStore, StoredRow

_LAZY = {
    "build_router": "recallserve.serve.experience._api",
    **dict.fromkeys(("decay_factor", "model_family", "rank_active"), "recallserve.serve.experience._caches"),
    **dict.fromkeys(("SYSTEM_PROMPT", "build_messages"), "recallserve.serve.experience._prompt"),
    **dict.fromkeys(("Embedder", "ExperienceNotFound", "ExperienceService"), "recallserve.serve.experience._service"),
    **dict.fromkeys(("ExperienceStore", "StoredRow"), "recallserve.serve.experience._store"),
}
__getattr__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "SCHEMA_VERSION",
    "check_topic",
    "ExperienceRecord",
    "ExperienceMetadata",
    "ExperienceContext",
    "ExperienceOutcome",
    "ExperienceEvaluation",
    "ReasoningStep",
    "VerificationItem",
    "Quantity",
    "ExperienceConfig",
    "ExperienceService",
    "ExperienceStore",
    "StoredRow",
    "ExperienceNotFound",
    "Embedder",
    "ExperienceView",
    "ExperienceHit",
    "ConflictAlert",
    "SearchRequest",
    "SearchResult",
    "LabelRequest",
    "MaintenanceReport",
    "ProduceResult",
    "ParseReport",
    "ParsedTrace",
    "parse_segmented",
    "verify_record",
    "run_check",
    "derive_confidence",
    "Rule",
    "RuleTable",
    "RuleError",
    "CalcError",
    "DimensionError",
    "evaluate",
    "parse_quantity",
    "to_unit",
    "rank_active",
    "decay_factor",
    "model_family",
    "build_messages",
    "SYSTEM_PROMPT",
    "build_router",
]
