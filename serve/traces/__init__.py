"""Turn traces: what each answered chat turn did (route, steps, tool calls, memories, the prompt
the model received), kept server-side for ``traces.retention_days``, tenant-scoped, PII-masked,
read through ``/v1/turns`` (:func:`build_router`) and the console's Turns and Sessions pages.
"""

from recallserve.serve.traces._build import build_trace
from recallserve.serve.traces._models import TraceConfig, TraceNotFoundError, TraceSession, TraceSummary, TurnTrace
from recallserve.serve.traces._recorder import TraceBackend, TraceRecorder
from recallserve.serve.traces._store import MAX_LIST, TraceStore
from recallserve.serve.traces.router import TraceSessionList, TurnList, build_router

__all__ = ["TraceConfig", "TurnTrace", "TraceSummary", "TraceSession", "TraceNotFoundError", "TraceStore",
           "TraceBackend", "TraceRecorder", "build_trace", "build_router", "TurnList", "TraceSessionList", "MAX_LIST"]
