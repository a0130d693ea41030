"""The operator console: ``/console``, static HTML/JS/CSS served by the ingress (no build step),
signed in with an API key and reading only the key's tenant through the ``/v1`` API.

Pages: Memories (``/v1/memories``), Sessions (``/v1/turns/sessions`` + ``/v1/sessions/{id}``),
Turns (``/v1/turns``), Review queue (``/v1/experiences/review`` and ``.../label``) and Health
(``/v1/console/health``, the tenant's own figures). :func:`build_console_router` adds the
pages and the two console routes (``/v1/console/me``, ``/v1/console/health``).
"""

from recallserve.serve.console._health import HealthFigures, health_figures
from recallserve.serve.console.router import STATIC_DIR, ConsoleMe, build_console_router, tenant_records

__all__ = ["build_console_router", "ConsoleMe", "HealthFigures", "health_figures", "STATIC_DIR", "tenant_records"]
