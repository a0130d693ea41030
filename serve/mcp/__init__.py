"""The MCP server at ``/mcp`` (streamable HTTP): the memory and experience routes and one chat turn as
MCP tools, calling the REST routes in process (see :mod:`._server`)."""

from recallserve.serve.mcp._server import MEMORY_URI, McpEndpoint
from recallserve.serve.mcp._tools import TOOLS

__all__ = ["MEMORY_URI", "TOOLS", "McpEndpoint"]
