"""The CoT 3.0 agent: memory first, a router, a strict-JSON tool loop with guards, image inputs.

Entry points: :class:`Agent` (``run`` -> :class:`AgentResult`, ``stream`` -> :class:`AgentEvent`
items, ``write_back`` for the off-path memory write), :class:`ToolRegistry` and :class:`Tool`
to declare tools (or :class:`HttpToolConfig` from config), :func:`default_registry` for the
built-in and demo tools, :func:`mask_pii` for anything written to memory or logs.
"""

from recallserve.serve.agent._http_tools import HttpParamSpec, HttpToolConfig, build_http_tool
from recallserve.serve.agent.builtin import builtin_tools, calculator_tool, clock_tool, memory_search_tool, safe_eval
from recallserve.serve.agent.config import AgentConfig
from recallserve.serve.agent.guards import mask_pii
from recallserve.serve.agent.images import ImageDescriber, ImageError, ImageUnit, analyse_image
from recallserve.serve.agent.loop import Agent
from recallserve.serve.agent.hints import RoutingHint
from recallserve.serve.agent.routing import RuleDecision, route_by_rules
from recallserve.serve.agent.schemas import (
    AgentEvent,
    AgentRequest,
    AgentResult,
    AgentUsage,
    RouteDecision,
    ToolCallRecord,
    TraceStep,
)
from recallserve.serve.agent.tools import Tool, ToolArgsError, ToolContext, ToolError, ToolRegistry, ToolSet

__all__ = [
    "Agent",
    "AgentConfig",
    "AgentEvent",
    "AgentRequest",
    "AgentResult",
    "AgentUsage",
    "RouteDecision",
    "RoutingHint",
    "RuleDecision",
    "route_by_rules",
    "ToolCallRecord",
    "TraceStep",
    "Tool",
    "ToolArgsError",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolSet",
    "HttpParamSpec",
    "HttpToolConfig",
    "build_http_tool",
    "builtin_tools",
    "calculator_tool",
    "clock_tool",
    "memory_search_tool",
    "safe_eval",
    "mask_pii",
    "ImageDescriber",
    "ImageError",
    "ImageUnit",
    "analyse_image",
    "default_registry",
]


def default_registry(*, demo: bool = True, http_tools: list[HttpToolConfig] | None = None) -> ToolRegistry:
    """Built-in tools, plus the demo world's tools when ``demo``, plus HTTP tools from config."""
    registry = ToolRegistry(builtin_tools())
    if demo:
        from recallserve.serve.agent.demo import DemoWorld, demo_tools

        for tool in demo_tools(DemoWorld()):
            registry.register(tool)
    for cfg in http_tools or ():
        registry.register(build_http_tool(cfg))
    return registry
