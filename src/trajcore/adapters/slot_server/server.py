"""The slot server's HTTP face: the protocol of ``domain.slot_protocol`` over HTTP/1.1.

One routing function, ``answer``, turns (method, path, Authorization header, body) into (status,
body); ``make_handler`` serves it with ``adapters.http1.HTTPServer``, chosen over aiohttp.web
because it spends about a quarter less CPU per call (a tool call's round trip is mostly HTTP
overhead, and on a small machine the slot servers share the cores with the commands they run).

Routes are listed in ``trajcore.domain.slot_protocol``. Every request is checked for the bearer
token when one is configured (constant-time comparison; a missing or wrong token gets 401 and an
``ErrorBody``). A body that does not fit its type gets 400 with ``reason`` and ``field`` (the JSON
path), a key the request does not know (a misspelt ``snapshott``) included: it is refused by name,
with the fields the request takes, never dropped (``codec``); an unknown slot 404; a refused
artifact path 400 on ``$.path``; a missing artifact 404; an unknown path 404 and a known path with
the wrong method 405, both on ``$.path``. A batch execute is always 200 with one result per call,
because a call's failure is data, not a failed request; so is a fork request (``/v1/lease/fork``),
with one answer per lease. Nothing is logged per request: at thousands of calls a second it would
cost more than the calls.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs

from trajcore.adapters.http1.server import HTTPServer
from trajcore.adapters.http1.values import Handler, Limits, Reply, Request
from trajcore.adapters.slot_server.codec import decode, encode
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.domain.errors import ToolArgumentError, UnknownSlot, WireError
from trajcore.domain.slot_protocol import (
    MAX_REQUEST_BYTES,
    ArchiveArtifactsRequest,
    DropSnapshotRequest,
    ErrorBody,
    ExecuteRequest,
    ExecuteResponse,
    ForkAnswer,
    ForkRequest,
    LeaseRequest,
    ListArtifactsRequest,
    ReadArtifactRequest,
    ResetRequest,
    SnapshotRequest,
)
from trajcore.domain.tools import ToolResult

__all__ = [
    "Answer",
    "make_answer",
    "make_handler",
    "start_http_server",
]

T = TypeVar("T")
_JSON = "application/json"

Answer = Callable[[str, str, str | None, bytes], Awaitable[tuple[int, bytes]]]
"""``(method, path, Authorization header or None, body) -> (status, JSON body)``."""


def _error(status: int, reason: str, field: str = "$") -> tuple[int, bytes]:
    return status, encode(ErrorBody(error=reason, field=field))


def make_answer(runtime: SlotRuntime, token: str | None) -> Answer:
    """The protocol over ``runtime`` as one function; ``token`` ``None``: no authentication."""
    expected = f"Bearer {token}".encode() if token is not None else None

    fork_requests = 0

    async def health(_: bytes) -> object:
        return attrs.evolve(runtime.health(), fork_requests=fork_requests)

    async def execute(body: bytes) -> object:
        batch = decode(body, ExecuteRequest)
        return ExecuteResponse(results=await runtime.execute(batch.calls), boot=runtime.boot)

    async def reset(body: bytes) -> object:
        asked = decode(body, ResetRequest)
        return await runtime.reset(asked.slot, asked.epoch, asked.timeout_s)

    async def lease(body: bytes) -> object:
        asked = decode(body, LeaseRequest)
        return await runtime.lease(asked.slot, asked.epoch, asked.environment, asked.snapshot)

    async def fork(body: bytes) -> object:
        nonlocal fork_requests
        asked = decode(body, ForkRequest)
        fork_requests += 1
        leases = [(lease.slot, lease.epoch) for lease in asked.leases]
        return ForkAnswer(leases=await runtime.fork(asked.environment, asked.snapshot, leases))

    async def snapshot(body: bytes) -> object:
        asked = decode(body, SnapshotRequest)
        return await runtime.snapshot(asked.slot, asked.epoch)

    async def drop_snapshot(body: bytes) -> object:
        asked = decode(body, DropSnapshotRequest)
        return await runtime.drop_snapshot(asked.snapshot)

    async def slots(_: bytes) -> object:
        return runtime.listing()

    async def read(body: bytes) -> object:
        asked = decode(body, ReadArtifactRequest)
        return await runtime.read_artifact(asked.slot, asked.path, asked.max_bytes)

    async def listing(body: bytes) -> object:
        asked = decode(body, ListArtifactsRequest)
        return await runtime.list_artifacts(asked.slot, asked.path, asked.max_entries)

    async def archive(body: bytes) -> object:
        asked = decode(body, ArchiveArtifactsRequest)
        return await runtime.archive_artifacts(
            asked.slot, asked.path, asked.max_bytes, asked.max_files
        )

    routes: dict[str, tuple[str, Callable[[bytes], Awaitable[object]]]] = {
        "/v1/health": ("GET", health),
        "/v1/execute": ("POST", execute),
        "/v1/reset": ("POST", reset),
        "/v1/lease": ("POST", lease),
        "/v1/lease/fork": ("POST", fork),
        "/v1/snapshot": ("POST", snapshot),
        "/v1/snapshot/drop": ("POST", drop_snapshot),
        "/v1/slots": ("GET", slots),
        "/v1/artifacts/read": ("POST", read),
        "/v1/artifacts/list": ("POST", listing),
        "/v1/artifacts/archive": ("POST", archive),
    }

    async def answer(
        method: str, path: str, authorization: str | None, body: bytes
    ) -> tuple[int, bytes]:
        if expected is not None:
            given = (authorization or "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected):
                return _error(401, "missing or wrong bearer token", "$.headers.Authorization")
        route = routes.get(path)
        if route is None:
            return _error(404, f"no such endpoint {path[:200]!r}", "$.path")
        wanted, run = route
        if method != wanted and not (method == "HEAD" and wanted == "GET"):
            return _error(405, f"{path} takes {wanted}, not {method[:20]}", "$.method")
        try:
            return 200, encode(await run(body))
        except WireError as error:
            return _error(400, error.reason, error.field)
        except UnknownSlot as error:
            return _error(404, str(error), "$.slot")
        except ToolArgumentError as error:
            return _error(400, error.reason, f"$.{error.field}")
        except FileNotFoundError as error:
            return _error(404, f"no such file: {error.filename}", "$.path")
        except OSError as error:
            return _error(400, f"{error.strerror}: {error.filename}", "$.path")

    return answer


@attrs.define
class _SlotHTTPServer(HTTPServer):
    """The HTTP server of a slot server: its close ends the image exports that its lease
    requests wait on (``SlotRuntime.end_exports``) before it lets running handlers finish, so
    they are answered within the grace instead of exporting on past it."""

    runtime: SlotRuntime | None = None

    async def aclose(self, grace_s: float = 5.0) -> None:
        if self.runtime is not None:
            await self.runtime.end_exports()
        await super().aclose(grace_s)


def make_handler(runtime: SlotRuntime, token: str | None) -> Handler:
    """A handler for ``adapters.http1.HTTPServer`` serving ``runtime`` (build the server with
    ``Limits(max_body_bytes=MAX_REQUEST_BYTES)``).

    A batch (``POST /v1/execute``, its token right) is decoded and submitted inside the read
    that completed it (``SlotRuntime.execute_now``: its agents are written to before the
    handler returns), and answered at once when every call is; otherwise its reply is made
    from the last call's answer and comes back through one future, which the HTTP server
    writes from its done callback in the loop's next iteration (no task). Every other request
    goes through ``make_answer`` in a task of its own."""
    answer = make_answer(runtime, token)
    expected = f"Bearer {token}".encode() if token is not None else None

    async def handle(request: Request) -> Reply:
        status, body = await answer(
            request.method, request.path, request.headers.get("authorization"), request.body
        )
        return Reply(status=status, body=body, content_type=_JSON)

    def respond(results: list[ToolResult]) -> Reply:
        answer = ExecuteResponse(results=results, boot=runtime.boot)
        return Reply(status=200, body=encode(answer), content_type=_JSON)

    def execute_now(body: bytes) -> Reply | Awaitable[Reply]:
        try:
            batch = decode(body, ExecuteRequest)
        except WireError as error:
            status, text = _error(400, error.reason, error.field)
            return Reply(status=status, body=text, content_type=_JSON)
        answered: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

        def done(results: list[ToolResult]) -> None:
            if answered.done():  # the server closed and gave up on it
                return
            try:
                reply = respond(results)
            except Exception as error:  # noqa: BLE001 - the server answers it with a 500
                answered.set_exception(error)
            else:
                answered.set_result(reply)

        results = runtime.execute_now(batch.calls, done)
        return respond(results) if results is not None else answered

    def dispatch(request: Request) -> Reply | Awaitable[Reply]:
        if request.path == "/v1/execute" and request.method == "POST":
            if expected is None:
                return execute_now(request.body)
            given = (request.headers.get("authorization") or "").encode("utf-8", "surrogateescape")
            if hmac.compare_digest(given, expected):
                return execute_now(request.body)
        return handle(request)

    return dispatch


async def start_http_server(
    runtime: SlotRuntime, token: str | None, *, listen: str | None = None, unix: str | None = None
) -> tuple[HTTPServer, str | None]:
    """Serve ``runtime`` with ``adapters.http1.HTTPServer`` on ``listen`` (``HOST:PORT``, port 0
    for any free one) or on the Unix socket ``unix`` (replaced if it exists, mode 0600).

    Returns the server (stop it with ``aclose()``: the image exports running end first, then
    running handlers have their grace) and, for TCP, the bound ``http://host:port``.
    Raises ``OSError`` when the address cannot be bound, ``ValueError`` for a bad ``listen``.
    """
    server = _SlotHTTPServer(
        make_handler(runtime, token),
        limits=Limits(max_body_bytes=MAX_REQUEST_BYTES),
        runtime=runtime,
    )
    if unix is not None:
        if os.path.lexists(unix):  # noqa: ASYNC240 - once, before serving
            os.unlink(unix)
        await server.listen_unix(unix)
        os.chmod(unix, 0o600)
        return server, None
    if listen is None:
        raise ValueError("either listen or unix is needed")
    host, _, port = listen.rpartition(":")
    bound_host, bound_port = await server.listen_tcp(host or "127.0.0.1", int(port))
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return server, f"http://{shown}:{bound_port}"
