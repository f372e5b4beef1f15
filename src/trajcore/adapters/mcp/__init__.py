"""Model Context Protocol (MCP): an MCP server's tools as the env's external tools; ours as one.

- ``protocol``: how MCP values become trajcore's (pure), and the ``_meta`` keys both ends share.
- ``client``: ``MCPToolServer``, the ``ToolServer`` port over an MCP server started from a command
  line (stdio) or reached at a URL (streamable HTTP).
- ``server``: ``make_mcp_server``, a ``ToolRegistry`` served over MCP (what ``trajcore tool-server
  --mcp`` runs); imported on its own, not from here.
- ``join``: ``JoinedToolServer``, the tools of several servers offered as one, a toolset per
  server, a clash of names failing at start naming both servers.
- ``settings``: the env-side ``tool_servers`` setting, parsed and checked, and
  ``open_tool_servers``, which enters one client per server and joins them.

The official Python SDK (``mcp`` on PyPI, the ``mcp`` extra) is imported only by these modules; its
untyped corners stay inside them.
"""
