"""The fake and the HTTP adapter satisfy the ToolServer port; tools type-check as handlers."""

from __future__ import annotations

from trajcore.adapters.fakes.tools import FakeToolServer
from trajcore.adapters.tool_server import INPROCESS, HTTPToolServer, ToolHandler, ToolRegistry
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tools import ToolContext
from trajcore.entrypoints.tool_server import make_app
from trajcore.ports.tool_server import ToolServer


def check_fake_is_a_tool_server() -> None:
    server: ToolServer = FakeToolServer()
    del server


def check_http_adapter_is_a_tool_server(token: str) -> None:
    registry = ToolRegistry()
    network: ToolServer = HTTPToolServer("http://127.0.0.1:8765", token=token)
    in_process: ToolServer = HTTPToolServer(INPROCESS, app=make_app(registry))
    del network, in_process


def check_sync_and_async_tools_are_handlers() -> None:
    def add(arguments: JSONObject, context: ToolContext) -> int:
        return len(arguments)

    async def search(arguments: JSONObject, context: ToolContext) -> str:
        return context.trajectory_id

    def answer(arguments: JSONObject, context: ToolContext) -> JSON:
        return {"ok": True}

    handlers: list[ToolHandler] = [add, search, answer]
    registry = ToolRegistry()
    decorated = registry.tool()(search)
    del handlers, decorated
