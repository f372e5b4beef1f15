"""Model Context Protocol (MCP): an MCP server's tools as the env's external tools; ours as one.

- ``client``: ``MCPToolServer``, the ``ToolServer`` port over an MCP server started from a command
  line (stdio) or reached at a URL (streamable HTTP).
- ``server``: ``make_mcp_server``, a ``ToolRegistry`` served over MCP (what ``trajcore tool-server
  --mcp`` runs).
- ``settings``: the env-side ``tool_servers`` setting, parsed and checked, and ``JoinedToolServer``,
  which offers the tools of several servers as one, a clash of names failing at start.

The official Python SDK (``mcp`` on PyPI, the ``mcp`` extra) is imported only by these modules; its
untyped corners stay inside them.
"""

from __future__ import annotations

from trajcore.adapters.mcp.client import MCPURL, MCPCommand, MCPToolServer, SessionScope
from trajcore.adapters.mcp.protocol import CONTEXT_META_KEY, OUTCOME_META_KEY

__all__ = [
    "CONTEXT_META_KEY",
    "MCPURL",
    "OUTCOME_META_KEY",
    "MCPCommand",
    "MCPToolServer",
    "SessionScope",
]
