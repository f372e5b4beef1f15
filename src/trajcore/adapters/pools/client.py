"""``SlotServerClient``: the pools' way to talk to one slot server (TCP or Unix socket).

One client per slot server, holding one keep-alive connection pool (``adapters.http1``: a tool
call's round trip is mostly HTTP overhead, so that client is kept lean; ``bench/tools.py`` measures
it against aiohttp, and docs/benchmarks.md has the figures). Every request has its own timeout
derived from what it asks: a batch waits for the slowest slot's calls one after another plus a grace
period, so a long command is never cut by a fixed client timeout (an upstream defect). The limit
counts time this process's event loop ran: a stretch in which it did not (a long synchronous step
of another task, a CPU starved by load) is added to it, so an answer that came meanwhile and waits
unread is read, not taken for a server that did not answer (``_Deadline``). Every request
of the protocol may be sent twice (calls are deduplicated by ``call_id``, a reset retires an epoch
that stays retired, the rest only read), so a request that meets a keep-alive connection the server
had just closed is replayed once on a fresh one.

What the caller can rely on:

- ``SlotServerError`` (an ``InfrastructureError``) when the server cannot be reached, drops the
  connection, crashes mid-request, answers 5xx or 401, or does not answer within the request's
  timeout. A pool treats it as "this container is dead or sick": its calls are infrastructure
  errors and its slots leave service until a replacement joins.
- ``WireError`` when the server answers something outside the protocol (bad JSON, a response that
  does not fit its type, a batch with the wrong number of results) or refuses a request other
  than a batch as malformed (400 with an ``ErrorBody``; the field and reason are the server's).
- A batch never fails as a whole for what its calls carry: no request body passes the server's
  ``MAX_REQUEST_BYTES`` (a larger batch goes in parts; a call too large alone is ``REJECTED``,
  never sent; the parts go at once unless a slot's calls span two), and a batch the server
  refuses for what its calls carry (413, or a 400 naming a call's arguments) is answered call
  by call, each sent again alone (each slot's calls in order, the slots at once); any other
  4xx but 408 and 429 is the server's failure, as the list above says.
- A 408 or 429 (a proxy's "try again later") is sent again while ``retry_later_s`` of waiting
  allows (``retry_later``); past that a batch's calls are each an ``INFRA_ERROR`` (never
  ``REJECTED``, and the server is not failed), any other request a ``SlotServerError``.
- ``UnknownSlot`` for a 404 on a slot index; ``ToolArgumentError`` for a refused artifact path and
  ``FileNotFoundError`` for a missing artifact.
- ``aclose()`` is idempotent.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, Self, TypeVar

import attrs

from trajcore.adapters.http1.client import HTTPClient
from trajcore.adapters.http1.errors import HTTPError, RequestTimedOut
from trajcore.adapters.http1.values import Limits, Origin, Response, parse_url
from trajcore.adapters.pools.batch_wire import batch_body, batch_results
from trajcore.adapters.pools.retry_later import TRY_LATER, not_served, served
from trajcore.adapters.slot_server.codec import decode, encode
from trajcore.domain.errors import (
    ConfigError,
    SlotServerError,
    ToolArgumentError,
    UnknownSlot,
    WireError,
)
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_protocol import (
    MAX_REQUEST_BYTES,
    PROTOCOL_VERSION,
    ArchiveArtifactsRequest,
    ArtifactArchive,
    ArtifactFile,
    DirectoryListing,
    DropSnapshotAnswer,
    DropSnapshotRequest,
    ErrorBody,
    ExecuteCall,
    ExecuteRequest,
    ExecuteResponse,
    ForkAnswer,
    ForkLease,
    ForkRequest,
    Health,
    LeaseAnswer,
    LeaseRequest,
    ListArtifactsRequest,
    ReadArtifactRequest,
    ResetRequest,
    ResetResult,
    SlotListing,
    SnapshotAnswer,
    SnapshotRequest,
    execute_call,
)
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolOutcome, ToolResult

__all__ = ["SlotServerClient", "split_batch"]

T = TypeVar("T")
# An archive of up to 64 MiB travels as base64 inside JSON; bodies beyond this are refused.
_LIMITS = Limits(max_body_bytes=512 << 20)
_EMPTY_BATCH = b'{"calls":[]}'
"""A batch's body around its calls, which a comma separates."""
_ARGUMENTS = re.compile(r"\$\.calls\[\d+\]\.arguments(\.|\[|$)")
"""Where a batch's 400 names what a call carries (an argument the server could not read)."""
_FORK_TURNS = 2
"""How many turns of the event loop the first fork of a snapshot waits for others to join it."""


@attrs.define(eq=False)
class SlotServerClient:
    """A client of one slot server. Build with ``tcp(...)`` or ``unix(...)``.

    Attributes:
        base_url: ``http://host:port`` (for a Unix socket, a placeholder host).
        token: The bearer token, or ``None``.
        unix_path: The Unix socket, or ``None`` for TCP.
        connect_timeout_s: Limit on opening a connection.
        grace_s: Added to every request's own limit (server overhead, queueing, transfer).
        quick_timeout_s: The limit of requests that run nothing (health, listing).
        reset_timeout_s: The limit of a reset.
        lease_timeout_s: The limit of a lease request (a first use of an image unpacks it).
        retry_later_s: How long a request waits in all, between tries, for a proxy in front of
            the server that answers 408 or 429 ("try again later") to serve it.
        boot: The server's boot as its first health answer gave it: a batch answered by
            another boot fails (``SlotServerError``: restarted in place, its slots' state gone).
    """

    base_url: str
    token: str | None = None
    unix_path: str | None = None
    connect_timeout_s: float = 5.0
    grace_s: float = 15.0
    quick_timeout_s: float = 15.0
    reset_timeout_s: float = 60.0
    lease_timeout_s: float = 900.0
    retry_later_s: float = 10.0
    boot: str | None = attrs.field(init=False, default=None)
    _http: HTTPClient | None = attrs.field(init=False, default=None)
    _origin: Origin | None = attrs.field(init=False, default=None)
    _prefix: str = attrs.field(init=False, default="")
    _closed: bool = attrs.field(init=False, default=False)
    _forks: dict[tuple[str, str], list[tuple[int, int, asyncio.Future[LeaseAnswer]]]] = attrs.field(
        init=False, factory=dict
    )
    _sending: set[asyncio.Task[None]] = attrs.field(init=False, factory=set)

    @classmethod
    def tcp(cls, address: str, token: str | None, *, grace_s: float = 15.0) -> SlotServerClient:
        """A client for ``host:port`` (or a full ``http://`` URL) with a bearer token."""
        base = address if address.startswith("http") else f"http://{address}"
        return cls(base_url=base.rstrip("/"), token=token, grace_s=grace_s)

    @classmethod
    def unix(
        cls, path: str, token: str | None = None, *, grace_s: float = 15.0
    ) -> SlotServerClient:
        """A client for a server listening on the Unix socket ``path``."""
        return cls(base_url="http://slot-server", token=token, unix_path=path, grace_s=grace_s)

    def _open(self) -> tuple[HTTPClient, Origin, str]:
        if self._closed:
            raise SlotServerError("the client is closed")
        if self._http is None or self._origin is None:
            try:
                origin, prefix = parse_url(self.base_url, unix_path=self.unix_path)
            except ConfigError as error:
                raise SlotServerError(f"bad slot server address: {error}") from None
            headers = {"Content-Type": "application/json"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            self._http = HTTPClient(
                limits=_LIMITS, connect_timeout_s=self.connect_timeout_s, headers=headers
            )
            self._origin = origin
            self._prefix = prefix
        return self._http, self._origin, self._prefix

    async def _request(
        self, method: str, path: str, body: object, kind: type[T], timeout_s: float
    ) -> T:
        """``body`` (a protocol value, ``None`` for none, or ``bytes`` already encoded)."""
        raw = body if isinstance(body, bytes) else b"" if body is None else encode(body)
        return decode(await self._answer(method, path, raw, timeout_s), kind)

    async def _answer(self, method: str, path: str, raw: bytes, timeout_s: float) -> bytes:
        """The body of a 200 answer to ``raw``; any other answer raised as its error."""
        status, payload = await self._send(method, path, raw, timeout_s)
        if status == 200:
            return payload
        raise self._failure(method, path, status, payload)

    async def _send(
        self, method: str, path: str, raw: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        """The status and body of the answer to ``raw``, each try within ``timeout_s``, a "try
        again later" tried again (``retry_later``); ``SlotServerError`` when none came."""
        http, origin, prefix = self._open()
        url = self.base_url + path

        async def once() -> Response:
            async with asyncio.timeout(None) as scope:
                watch = _Deadline(asyncio.get_running_loop(), scope, timeout_s)
                try:
                    return await http.request(
                        method, origin, prefix + path, body=raw, idempotent=True
                    )
                finally:
                    watch.stop()

        try:
            response = await served(once, self.retry_later_s)
        except (RequestTimedOut, TimeoutError):
            raise SlotServerError(f"{method} {url}: no answer within {timeout_s:.1f} s") from None
        except HTTPError as error:
            raise SlotServerError(f"{method} {url}: {type(error).__name__}: {error}") from None
        return response.status, response.body

    def _failure(self, method: str, path: str, status: int, payload: bytes) -> Exception:
        """The error an answer other than 200 raises (the module's list)."""
        url = self.base_url + path
        problem = _error_body(payload)
        if status == 401:
            return SlotServerError(f"{method} {url}: 401 unauthorized ({problem.error})")
        if status >= 500 or status not in (400, 404):
            return SlotServerError(f"{method} {url}: HTTP {status}: {problem.error}")
        if problem.field == "$.slot":
            return UnknownSlot(problem.error)
        if problem.field == "$.path":
            if status == 404:
                return FileNotFoundError(problem.error)
            return ToolArgumentError("path", problem.error)
        return WireError(problem.field, problem.error)

    # ------------------------------------------------------------------------- API

    async def health(self) -> Health:
        """The server's health and capabilities.

        Raises ``SlotServerError`` (unreachable), ``WireError`` (another protocol version).
        """
        found = await self._request("GET", "/v1/health", None, Health, self.quick_timeout_s)
        if found.protocol_version != PROTOCOL_VERSION:
            raise WireError(
                "$.protocol_version",
                f"server speaks {found.protocol_version}, client {PROTOCOL_VERSION}",
            )
        if self.boot is None:
            self.boot = found.boot
        return found

    async def wait_healthy(self, timeout_s: float) -> Health:
        """Poll ``health()`` until it answers; raises ``SlotServerError`` after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                return await self.health()
            except SlotServerError:
                if loop.time() >= deadline:
                    raise
            await asyncio.sleep(0.02)

    async def execute(self, calls: Sequence[ExecuteCall]) -> list[ToolResult]:
        """Run a batch; one result per call, in the order of ``calls``.

        The request's limit is the slowest slot's timeouts in sequence plus ``grace_s``. A batch
        whose body would pass ``MAX_REQUEST_BYTES`` goes in several requests, at once unless a
        slot's calls span two (``split_batch``), and a call that could not fit one even alone
        is never sent: it is ``REJECTED`` naming its largest argument and the limit. A request
        the server refuses for what its calls carry (413, or a 400 naming a call's arguments)
        ran nothing: each of its calls is sent again alone, and one refused alone is
        ``REJECTED`` with the server's reason. Neither says anything about the server's health.

        Raises ``SlotServerError`` (also: another boot of the server answered), ``WireError``
        (an answer outside the protocol, including a result count that does not match).
        """
        batch = ExecuteRequest(calls=calls)
        body = encode(batch)
        if len(body) > MAX_REQUEST_BYTES:
            return await self._execute_parts(batch.calls)
        return await self._execute_body(batch.calls, body, batch.deadline_s(0.0))

    async def execute_slot_calls(self, calls: Sequence[SlotCall]) -> list[ToolResult]:
        """``execute([execute_call(call) for call in calls])``, the pools' hot path: the same
        request, deadline, results and errors, with the body written straight from the calls
        and the answer read straight into the results (``batch_wire``) when they have the plain
        shape.

        Raises ``SlotServerError``, ``WireError`` (a call the protocol refuses, as
        ``execute_call`` refuses it, or an answer as ``execute`` refuses it).
        """
        fast = batch_body(calls)
        if fast is None:
            return await self.execute([execute_call(call) for call in calls])
        body, limit_s = fast
        if len(body) > MAX_REQUEST_BYTES:  # rare: the only case that encodes its calls again
            return await self._execute_parts([execute_call(call) for call in calls])
        status, payload = await self._send("POST", "/v1/execute", body, limit_s + self.grace_s)
        if status != 200:
            wire = [execute_call(call) for call in calls]
            return await self._not_run(wire, status, payload)
        call_ids = [call.call.id for call in calls]
        read = batch_results(payload, call_ids)
        if read is None:
            answer = decode(payload, ExecuteResponse)
            read = _results(answer, call_ids), answer.boot
        results, boot = read
        self._same_boot(boot)
        return results

    async def _execute_body(
        self, calls: Sequence[ExecuteCall], body: bytes, limit_s: float
    ) -> list[ToolResult]:
        """``calls`` sent as ``body`` (their request, within ``MAX_REQUEST_BYTES``), waiting
        ``limit_s`` plus ``grace_s``; their results, in order."""
        status, payload = await self._send("POST", "/v1/execute", body, limit_s + self.grace_s)
        if status != 200:
            return await self._not_run(calls, status, payload)
        answer = decode(payload, ExecuteResponse)
        results = _results(answer, [call.call_id for call in calls])
        self._same_boot(answer.boot)
        return results

    async def _not_run(
        self, calls: Sequence[ExecuteCall], status: int, payload: bytes
    ) -> list[ToolResult]:
        """The results of ``calls`` whose request was answered ``status`` (not 200): a refusal
        of the request itself answered call by call (the calls did not run: each goes again
        alone, one refused alone is ``REJECTED``); a "try again later" still, each an
        ``INFRA_ERROR``; anything else raised as ``_failure``."""
        problem = _error_body(payload)
        if status in TRY_LATER:  # a proxy's, past retry_later_s: not run, the server not failed
            return not_served(calls, status, problem.error, self.retry_later_s)
        if not (status == 413 or (status == 400 and _ARGUMENTS.match(problem.field))):
            # not about what the calls carry (a proxy, another service at the address, a
            # protocol field the pool and the server disagree on): the server's failure
            raise self._failure("POST", "/v1/execute", status, payload)
        if len(calls) == 1:
            (call,) = calls
            field = _call_field(call, problem.field)
            reason = f"the slot server refused the call (HTTP {status}: {problem.error}) @ {field}"
            return [_rejected(call, reason)]
        chains: dict[int, list[int]] = {}
        for i, call in enumerate(calls):
            chains.setdefault(call.slot, []).append(i)
        results: list[ToolResult | None] = [None] * len(calls)

        async def alone(chain: list[int]) -> None:
            for i in chain:  # a slot's calls one after another, in their order
                request = ExecuteRequest(calls=(calls[i],))
                (results[i],) = await self._execute_body(
                    request.calls, encode(request), calls[i].timeout_s
                )

        await _all(alone(chain) for chain in chains.values())  # the slots at once
        return [result for result in results if result is not None]

    async def _execute_parts(self, calls: Sequence[ExecuteCall]) -> list[ToolResult]:
        """``calls`` (their one request over ``MAX_REQUEST_BYTES``) in parts that each fit one,
        sent at once, or one after another where a slot's calls span two parts (they keep their
        order); a call over the limit alone is ``REJECTED`` and never sent."""
        items = [encode(call) for call in calls]
        parts, too_large = split_batch([len(item) for item in items])
        results: list[ToolResult | None] = [None] * len(calls)
        for i in too_large:
            size = len(items[i]) + len(_EMPTY_BATCH)
            field = _call_field(calls[i], "$")
            reason = (
                f"the call is a request of {size} bytes, over the slot server's limit of "
                f"{MAX_REQUEST_BYTES} @ {field}"
            )
            results[i] = _rejected(calls[i], reason)

        async def send(part: list[int]) -> None:
            sent = ExecuteRequest(calls=[calls[i] for i in part])
            body = b'{"calls":[' + b",".join(items[i] for i in part) + b"]}"
            answers = await self._execute_body(sent.calls, body, sent.deadline_s(0.0))
            for i, answer in zip(part, answers, strict=True):
                results[i] = answer

        slots = [{calls[i].slot for i in part} for part in parts]
        if sum(map(len, slots)) == len(set().union(*slots)):  # no slot in two parts: at once
            await _all(send(part) for part in parts)
        else:  # a slot's calls keep their order across parts
            for part in parts:
                await send(part)
        return [result for result in results if result is not None]

    def _same_boot(self, boot: str | None) -> None:
        """Raise ``SlotServerError`` when ``boot`` is not the one the client first saw (in
        health): the server was restarted in place, and the state of its slots is gone."""
        if boot is not None and self.boot is not None and boot != self.boot:
            raise SlotServerError(
                f"slot server {self.base_url} was restarted (boot {boot}, first seen "
                f"{self.boot}): the state of its slots is gone"
            )

    async def reset(self, slot: int, epoch: int) -> ResetResult:
        """Kill the slot's sandbox and wipe it, retiring ``epoch``, within ``reset_timeout_s``
        (sent: the server keeps to it). ``ok=False``: quarantine it.

        Raises ``SlotServerError``, ``UnknownSlot``, ``WireError``.
        """
        limit = self.reset_timeout_s
        asked = ResetRequest(slot=slot, epoch=epoch, timeout_s=limit)
        return await self._request("POST", "/v1/reset", asked, ResetResult, limit)

    async def lease(
        self, slot: int, epoch: int, environment: str, *, snapshot: str | None = None
    ) -> LeaseAnswer:
        """Run the slot's lease ``epoch`` over ``environment`` (an ``EnvironmentRef`` text such
        as ``oci:/path`` or ``containers-storage:NAME``), or over the server's ``snapshot`` of a
        lease over that environment; sent before the epoch's first call.

        A refusal (a bad reference, a missing or refused image, a full cache, a stale or started
        epoch, a server without an image cache) is an answer with ``ok`` false naming the field
        and the reason; the slot stays usable and the epoch can still run over the server's own
        root. The limit is ``lease_timeout_s``: a first use unpacks the image.

        Raises ``SlotServerError``, ``UnknownSlot``, ``WireError``.
        """
        if snapshot is not None:
            return await self._fork_together(slot, epoch, environment, snapshot)
        asked = LeaseRequest(slot=slot, epoch=epoch, environment=environment)
        answer = await self._request("POST", "/v1/lease", asked, LeaseAnswer, self.lease_timeout_s)
        if (answer.slot, answer.epoch) != (slot, epoch):
            raise WireError("$.slot", f"answers slot {answer.slot} epoch {answer.epoch}")
        return answer

    async def fork(
        self, environment: str, snapshot: str, leases: Sequence[tuple[int, int]]
    ) -> list[LeaseAnswer]:
        """Start each ``(slot, epoch)`` lease from the server's ``snapshot`` (of a lease over
        ``environment``) in one request (``POST /v1/lease/fork``): one answer per lease, in
        order, each as ``lease(..., snapshot=snapshot)`` answers it; a refusal fails that lease
        only. The limit is ``lease_timeout_s``.

        Raises ``SlotServerError``, ``WireError`` (the request refused, or an answer that does
        not match its lease).
        """
        asked = ForkRequest(
            environment=environment, snapshot=snapshot,
            leases=tuple(ForkLease(slot=slot, epoch=epoch) for slot, epoch in leases),
        )  # fmt: skip
        answer = await self._request(
            "POST", "/v1/lease/fork", asked, ForkAnswer, self.lease_timeout_s
        )
        if len(answer.leases) != len(asked.leases):
            raise WireError("$.leases", f"{len(answer.leases)} answers for {len(leases)} leases")
        for i, (lease, got) in enumerate(zip(asked.leases, answer.leases, strict=True)):
            if (got.slot, got.epoch) != (lease.slot, lease.epoch):
                raise WireError(f"$.leases[{i}]", f"answers slot {got.slot} epoch {got.epoch}")
        return list(answer.leases)

    async def _fork_together(
        self, slot: int, epoch: int, environment: str, snapshot: str
    ) -> LeaseAnswer:
        """``lease(..., snapshot=snapshot)``: the forks of one snapshot asked in the same turns
        of the event loop (a group's members, ``SlotTools.fork``) go in one ``fork`` request."""
        key = (environment, snapshot)
        mine: asyncio.Future[LeaseAnswer] = asyncio.get_running_loop().create_future()
        waiting = self._forks.get(key)
        if waiting is None:
            waiting = self._forks[key] = []
            task = asyncio.get_running_loop().create_task(self._send_forks(key))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        waiting.append((slot, epoch, mine))
        return await asyncio.shield(mine)  # one fork's cancellation leaves the others' request

    async def _send_forks(self, key: tuple[str, str]) -> None:
        for _ in range(_FORK_TURNS):
            await asyncio.sleep(0)
        batch = self._forks.pop(key)
        try:
            answers = await self.fork(*key, [(slot, epoch) for slot, epoch, _ in batch])
        except Exception as error:  # noqa: BLE001 - each fork's caller gets it
            _fail(batch, error)
            return
        except BaseException:
            _fail(batch, SlotServerError("the fork request was cancelled"))
            raise
        for (_, _, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(answer)

    async def snapshot(self, slot: int, epoch: int) -> SnapshotAnswer:
        """Freeze the slot's running lease ``epoch`` (one over an image) into a snapshot of
        this server: what the lease wrote over the image and its workspace. The lease's
        processes end (a snapshot holds files, not processes) and the lease goes on over its
        snapshot, as each lease started from it (``lease(..., snapshot=answer.snapshot)``)
        does. A refusal is an answer with ``ok`` false naming the field and the reason.

        Raises ``SlotServerError``, ``UnknownSlot``, ``WireError``.
        """
        asked = SnapshotRequest(slot=slot, epoch=epoch)
        answer = await self._request(
            "POST", "/v1/snapshot", asked, SnapshotAnswer, self.lease_timeout_s
        )
        if (answer.slot, answer.epoch) != (slot, epoch):
            raise WireError("$.slot", f"answers slot {answer.slot} epoch {answer.epoch}")
        return answer

    async def drop_snapshot(self, snapshot: str) -> DropSnapshotAnswer:
        """Drop a snapshot: no new lease may start from it, and its files go once the leases
        over it have reset (``removed`` says whether they went at once). An unknown id is an
        answer with ``ok`` false. Raises ``SlotServerError``, ``WireError``."""
        asked = DropSnapshotRequest(snapshot=snapshot)
        return await self._request(
            "POST", "/v1/snapshot/drop", asked, DropSnapshotAnswer, self.quick_timeout_s
        )

    async def list_slots(self) -> SlotListing:
        """Every slot's state. Raises ``SlotServerError``, ``WireError``."""
        return await self._request("GET", "/v1/slots", None, SlotListing, self.quick_timeout_s)

    async def read_artifact(self, slot: int, path: str, max_bytes: int = 1 << 20) -> ArtifactFile:
        """A workspace file (first ``max_bytes``), its size and sha256.

        Raises ``ToolArgumentError`` (path refused), ``FileNotFoundError``, ``UnknownSlot``,
        ``SlotServerError``, ``WireError``.
        """
        asked = ReadArtifactRequest(slot=slot, path=path, max_bytes=max_bytes)
        return await self._request(
            "POST", "/v1/artifacts/read", asked, ArtifactFile, self.quick_timeout_s + 60
        )

    async def list_artifacts(
        self, slot: int, path: str = ".", max_entries: int = 1000
    ) -> DirectoryListing:
        """A workspace directory's entries. Raises as ``read_artifact``."""
        asked = ListArtifactsRequest(slot=slot, path=path, max_entries=max_entries)
        return await self._request(
            "POST", "/v1/artifacts/list", asked, DirectoryListing, self.quick_timeout_s
        )

    async def archive_artifacts(
        self, slot: int, path: str = ".", max_bytes: int = 64 << 20, max_files: int = 10_000
    ) -> ArtifactArchive:
        """A tar.gz of a workspace directory, within the caps. Raises as ``read_artifact``."""
        asked = ArchiveArtifactsRequest(
            slot=slot, path=path, max_bytes=max_bytes, max_files=max_files
        )
        return await self._request(
            "POST", "/v1/artifacts/archive", asked, ArtifactArchive, self.quick_timeout_s + 120
        )

    async def aclose(self) -> None:
        """Close the connection pool. Idempotent."""
        self._closed = True
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


_WATCH_STEP_S = 1.0
"""How often a request's deadline looks at the clock (``_Deadline``)."""
_STALL_ROOM_S = 30.0
"""What stalls of the event loop may add to one request's limit in all, at the least (the limit
itself when longer): a loop that is always held up still gives up on a server."""
_STALL_S = 0.5
"""A look this much later than it was due means this process's event loop did not run meanwhile."""


class _Deadline:
    """A request's limit counted in time the event loop ran: when the loop was held up (a long
    synchronous step of another task, such as a tokenizer rendering a large trajectory, or a
    machine starved of CPU), the answer may be waiting unread in the socket, so that time is
    added to the limit (and a look's time more, to read it) instead of failing the request and
    losing a healthy server; at most ``_STALL_ROOM_S`` (or the limit, when longer) in all, so
    a loop that is always held up still gives up on a server that never answers. Once the
    limit has passed, ``scope`` (an ``asyncio.timeout``) fires."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, scope: asyncio.Timeout, limit_s: float
    ) -> None:
        self._loop = loop
        self._scope = scope
        now = loop.time()
        self._deadline = now + limit_s
        self._room = max(limit_s, _STALL_ROOM_S)  # what stalls may add in all, then it fires
        self._due = now
        self._handle: asyncio.TimerHandle | None = None
        self._arm(now)

    def _arm(self, now: float) -> None:
        self._due = min(self._deadline, now + _WATCH_STEP_S)
        self._handle = self._loop.call_at(self._due, self._look)

    def _look(self) -> None:
        now = self._loop.time()
        late = now - self._due
        if late > _STALL_S:  # and a look's time to read what came meanwhile
            extra = min(late + _WATCH_STEP_S, self._room)
            self._deadline += extra
            self._room -= extra
        if now >= self._deadline:
            self._handle = None
            self._scope.reschedule(now)
        else:
            self._arm(now)

    def stop(self) -> None:
        """The request ended: no more looks."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def _fail(batch: list[tuple[int, int, asyncio.Future[LeaseAnswer]]], error: Exception) -> None:
    for _, _, future in batch:
        if not future.done():
            future.set_exception(error)


def _results(answer: ExecuteResponse, call_ids: list[str]) -> list[ToolResult]:
    """The batch's results, once they answer the calls ``call_ids`` one for one, in order."""
    if len(answer.results) != len(call_ids):
        raise WireError("$.results", f"{len(answer.results)} results for {len(call_ids)} calls")
    for i, (call_id, result) in enumerate(zip(call_ids, answer.results, strict=True)):
        if result.call_id != call_id:
            raise WireError(f"$.results[{i}].call_id", f"answers {result.call_id!r}")
    return list(answer.results)


def _error_body(payload: bytes) -> ErrorBody:
    try:
        return decode(payload, ErrorBody)
    except WireError:
        return ErrorBody(error=payload[:200].decode("utf-8", "replace") or "no body")


async def _all(runs: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run ``runs`` at once to their ends; then raise the first one's error, if any."""
    errors = [
        outcome
        for outcome in await asyncio.gather(*runs, return_exceptions=True)
        if isinstance(outcome, BaseException)
    ]
    if errors:
        raise errors[0]


def split_batch(
    sizes: Sequence[int], max_bytes: int = MAX_REQUEST_BYTES
) -> tuple[list[list[int]], list[int]]:
    """A batch's calls in parts that each fit one request of at most ``max_bytes``.

    ``sizes`` are the calls' encoded sizes, each as its JSON object in a batch's body
    (``{"calls":[`` the objects, comma-separated, ``]}``). Returns the parts, as lists of the
    calls' indices, in order (a part is a run of consecutive calls, each taking as many as
    fit), and the indices of the calls that do not fit a request even alone.
    """
    parts: list[list[int]] = []
    too_large: list[int] = []
    part: list[int] = []
    used = len(_EMPTY_BATCH)
    for i, size in enumerate(sizes):
        if size + len(_EMPTY_BATCH) > max_bytes:
            too_large.append(i)
            continue
        added = size + (1 if part else 0)
        if part and used + added > max_bytes:
            parts.append(part)
            part, used, added = [], len(_EMPTY_BATCH), size
        part.append(i)
        used += added
    if part:
        parts.append(part)
    return parts, too_large


def _rejected(call: ExecuteCall, reason: str) -> ToolResult:
    """``call`` refused before it ran, as the slot server refuses a call: ``REJECTED``."""
    return ToolResult(
        call_id=call.call_id, name=call.tool, outcome=ToolOutcome.REJECTED,
        content=f"Error: {reason}", error=reason,
    )  # fmt: skip


def _call_field(call: ExecuteCall, field: str) -> str:
    """The server's ``field`` of a request holding ``call`` alone, as a path in the call's own
    arguments, as the server names a call's faults (``$.content``); ``$`` (the whole request,
    too large) names the call's largest argument."""
    for head in ("$.calls[0].arguments.", "$.calls[0]."):
        if field.startswith(head):
            return "$." + field.removeprefix(head)
    if field == "$" and call.arguments:
        arguments = call.arguments
        return "$." + max(arguments, key=lambda name: _size(arguments[name]))
    return field


def _size(value: JSON) -> int:
    """How large an argument is: a text's length (a lower bound of its encoded size, and no copy
    of a large one), anything else's encoded size."""
    return len(value) if isinstance(value, str) else len(encode(value))
