"""``NomadClient``: the Nomad HTTP API calls the Nomad pool makes, typed, async and bounded.

python-nomad (import name ``nomad``) is synchronous and untyped. This is the one module that
imports it, when a client is made (it comes with the ``nomad`` extra: an env installed with
``atropos`` alone imports this module, and a Nomad pool it starts says which extra to install):
every call runs in a worker thread (``anyio.to_thread``), under a deadline of its own, and what
comes back is checked to be JSON before it leaves (``JSON`` values, never ``Any``).

It also reads Nomad's answers, as pure functions of the JSON (gidgethub's sans-I/O shape):
``parse_allocation_stubs`` turns ``GET /v1/job/{id}/allocations`` into ``AllocationStub`` values
``allocation_address`` finds a slot server's ``host:port`` in ``GET /v1/allocation/{id}`` and
``parse_job`` reads what tells a pool whether ``GET /v1/job/{id}`` is still its own job, and
``placement_failure`` why ``GET /v1/job/{id}/evaluations`` says Nomad could not place it.
Both structure the answer with cattrs into wire types named as Nomad spells its fields, with
strict primitives (``"3"`` is not a number); what Nomad sends as ``null`` (a Go nil slice, an
unset number) counts as empty or 0, fields the pool does not read are ignored, and a malformed
answer is one ``WireError`` whose path names the fault (``$[0].Name``, ``reason @ path`` for
every fault in ``problems``). The job Nomad is sent is the domain's (``domain.nomad_job``).

The calls (all under ``/v1``): ``GET status/leader``; ``POST job/{id}`` (register);
``GET job/{id}``; ``GET job/{id}/allocations``; ``GET job/{id}/evaluations``;
``GET allocation/{id}``;
``POST allocation/{id}/stop``; ``POST job/{id}/scale`` (python-nomad has no method for it, so it
goes through the library's generic ``request``); ``DELETE job/{id}?purge=...``.

What the caller can rely on:

- Every call ends within ``timeout_s`` (plus a small grace for the thread hand-off), whatever the
  network does: the library's own HTTP timeout is set to ``timeout_s`` and the await is bounded
  too. A call cancelled by its caller returns at once; its thread is abandoned and ends with its
  HTTP timeout.
- Every failure is a ``NomadUnavailable`` (a ``SandboxUnavailable``) whose message names the
  setting to look at: ``address`` when Nomad cannot be reached or does not answer in time,
  ``token`` when it refuses the ACL token (401 or 403; the message says which setting sets it,
  never the token itself), the request's own name otherwise, with the HTTP status and the
  start of Nomad's answer.
- ``read_job`` answers ``None`` and ``deregister`` ``False`` for a job Nomad does not know (404).
- The ACL token goes in ``X-Nomad-Token``; with none given, python-nomad falls back to the
  ``NOMAD_TOKEN`` environment variable (and ``NOMAD_NAMESPACE``, ``NOMAD_REGION``,
  ``NOMAD_CLIENT_CERT`` and ``NOMAD_CLIENT_KEY`` likewise), as the ``nomad`` command line does;
  an https agent's certificate is checked against ``NOMAD_CACERT`` when set.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import attrs
import cattrs
from cattrs.cols import is_mapping, is_sequence, list_structure_factory, mapping_structure_factory

from trajcore.adapters.wire import register_strict_primitives, structure
from trajcore.domain.errors import SandboxUnavailable, WireError
from trajcore.domain.json_values import JSON, JSONObject, check_json
from trajcore.domain.nomad_job import PORT_LABEL
from trajcore.domain.nomad_reconcile import AllocationStatus

__all__ = [
    "AllocationStub",
    "JobState",
    "NomadClient",
    "NomadUnavailable",
    "allocation_address",
    "parse_allocation_stubs",
    "parse_job",
    "placement_failure",
]

T = TypeVar("T")
_GRACE_S = 1.0  # the thread hand-off around the library's own HTTP timeout
_BODY_PREVIEW = 300
_TOKEN_REFUSED = (401, 403)  # 403: Nomad's ACLs; 401: a proxy in front of it


class NomadUnavailable(SandboxUnavailable):
    """The Nomad API could not be reached, refused a request, or answered outside its contract.

    Attributes:
        field: The setting to look at (``address``, ``token``) or the request that failed.
        status: The HTTP status Nomad answered, or ``None`` when none came.
    """

    def __init__(self, reason: str, *, field: str, status: int | None = None) -> None:
        super().__init__(f"{reason} @ {field}")
        self.field = field
        self.reason = reason
        self.status = status


def _status_of(error: BaseException) -> tuple[int | None, str]:
    """The HTTP status and body text inside a python-nomad error, if it carries a response."""
    response = getattr(error, "nomad_resp", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        text = getattr(response, "text", "")
        return status, text if isinstance(text, str) else ""
    return None, str(response if response is not None else error)


def _checked(value: object, what: str) -> JSON:
    problem = check_json(value)
    if problem is not None:
        raise NomadUnavailable(f"Nomad answered something that is not JSON: {problem}", field=what)
    return value  # type: ignore[return-value]  # check_json proved it is a JSON tree


def _python_nomad() -> Any:
    """python-nomad (import name ``nomad``; untyped, wrapped here), imported when a client is
    made: the Nomad pool needs the ``nomad`` extra, nothing else does.

    Raises:
        SandboxUnavailable: it is not installed (naming the extra).
    """
    try:
        import nomad  # type: ignore[import-untyped]  # the nomad extra only
        import nomad.api.exceptions  # type: ignore[import-untyped]
    except ImportError:
        raise SandboxUnavailable(
            "the Nomad pool needs python-nomad, which is not installed: install trajcore[nomad]"
        ) from None
    return nomad


@attrs.define(eq=False)
class NomadClient:
    """The Nomad API at ``address``, bounded by ``timeout_s`` per request.

    Attributes:
        address: ``http(s)://host:port`` of a Nomad agent.
        token: ACL token, or ``None``.
        namespace, region: Sent with every request that takes them (``None``: the agent's).
        timeout_s: Longest one request may take.
        verify_tls: Check the agent's TLS certificate (https only): against the CA bundle
            that ``$NOMAD_CACERT`` names when set (a cluster's own CA, as the ``nomad`` command
            line reads it), else the system's.
    """

    address: str
    token: str | None = attrs.field(default=None, repr=False)
    namespace: str | None = None
    region: str | None = None
    timeout_s: float = 10.0
    verify_tls: bool = True
    _api: Any = attrs.field(init=False, default=None, repr=False)  # nomad.Nomad (untyped)
    _failed: Any = attrs.field(init=False, default=None, repr=False)  # its exceptions' base
    _limiter: anyio.CapacityLimiter | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s must be finite and > 0, got {self.timeout_s!r}")
        nomad = _python_nomad()
        self._failed = nomad.api.exceptions.BaseNomadException
        self._api = nomad.Nomad(
            address=self.address.rstrip("/"),
            token=self.token,
            namespace=self.namespace,
            region=self.region,
            timeout=self.timeout_s,
            verify=(os.environ.get("NOMAD_CACERT") or True) if self.verify_tls else False,
        )

    # ------------------------------------------------------------------------- calls

    async def leader(self) -> str:
        """The address of the region's leader (Nomad is up and has one)."""
        found = await self._call("status/leader", lambda api: api.status.leader.get_leader())
        if not isinstance(found, str) or not found:
            raise NomadUnavailable(
                f"Nomad at {self.address} knows no cluster leader (answered {found!r})",
                field="address",
            )
        return found

    async def register(self, job_id: str, request: JSONObject) -> JSONObject:
        """Register (or update) a job; ``request`` is a ``JobRegisterRequest``."""
        answer = await self._call(
            f"register job {job_id}", lambda api: api.job.register_job(job_id, request)
        )
        return self._object(answer, f"register job {job_id}")

    async def read_job(self, job_id: str) -> JSONObject | None:
        """The job, or ``None`` when Nomad has no job of that ID."""
        try:
            answer = await self._call(f"read job {job_id}", lambda api: api.job.get_job(job_id))
        except NomadUnavailable as error:
            if error.status == 404:
                return None
            raise
        return self._object(answer, f"read job {job_id}")

    async def job_allocations(self, job_id: str) -> JSON:
        """The job's allocations (``AllocationListStub`` objects) as Nomad lists them."""
        return await self._call(
            f"list allocations of {job_id}", lambda api: api.job.get_allocations(job_id)
        )

    async def job_evaluations(self, job_id: str) -> JSON:
        """The job's evaluations (``Evaluation`` objects) as Nomad lists them."""
        return await self._call(
            f"list evaluations of {job_id}", lambda api: api.job.get_evaluations(job_id)
        )

    async def read_allocation(self, alloc_id: str) -> JSON:
        """One allocation in full (with its ``AllocatedResources``)."""
        return await self._call(
            f"read allocation {alloc_id}", lambda api: api.allocation.get_allocation(alloc_id)
        )

    async def stop_allocation(self, alloc_id: str) -> None:
        """Stop one allocation; Nomad replaces it while the job's count stays."""
        await self._call(
            f"stop allocation {alloc_id}", lambda api: api.allocation.stop_allocation(alloc_id)
        )

    async def scale(self, job_id: str, request: JSONObject) -> None:
        """Set a task group's count; ``request`` is a ``ScalingRequest``."""
        await self._call(
            f"scale job {job_id}",
            lambda api: api.job.request(job_id, "scale", json=request, method="post").json(),
        )

    async def deregister(self, job_id: str, *, purge: bool) -> bool:
        """Stop the job (and with ``purge`` forget it at once). ``False``: no such job."""
        try:
            await self._call(
                f"stop job {job_id}", lambda api: api.job.deregister_job(job_id, purge=purge)
            )
        except NomadUnavailable as error:
            if error.status == 404:
                return False
            raise
        return True

    # ------------------------------------------------------------------------- internals

    @staticmethod
    def _object(answer: JSON, what: str) -> JSONObject:
        if not isinstance(answer, dict):
            raise NomadUnavailable(
                f"expected a JSON object, got {type(answer).__name__}", field=what
            )
        return answer

    async def _call(self, what: str, request: Callable[[Any], object]) -> JSON:
        """Run ``request(api)`` in a thread under the deadline; map every failure."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(4)
        api = self._api

        def run() -> object:
            return request(api)

        try:
            with anyio.fail_after(self.timeout_s + _GRACE_S):
                answer = await anyio.to_thread.run_sync(
                    run, abandon_on_cancel=True, limiter=self._limiter
                )
        except TimeoutError:
            raise NomadUnavailable(
                f"{what}: Nomad at {self.address} did not answer within {self.timeout_s} s",
                field="address",
            ) from None
        except self._failed as error:
            raise self._failure(what, error) from None
        except json.JSONDecodeError as error:
            raise NomadUnavailable(
                f"{what}: Nomad answered something that is not JSON ({error.msg})", field=what
            ) from None
        return _checked(answer, what)

    def _failure(self, what: str, error: BaseException) -> NomadUnavailable:
        status, text = _status_of(error)
        preview = self._redacted(" ".join(text.split()))[:_BODY_PREVIEW]
        if status is None:
            return NomadUnavailable(
                f"{what}: cannot reach Nomad at {self.address}: {preview}", field="address"
            )
        if status in _TOKEN_REFUSED:
            sent = "the ACL token" if self._sent_token() else "a request without an ACL token"
            return NomadUnavailable(
                f"{what}: Nomad refused {sent} (HTTP {status}); set the pool's token "
                f"(--env.nomad_token, else $NOMAD_TOKEN) to one allowed to run the job: {preview}",
                field="token",
                status=status,
            )
        return NomadUnavailable(f"{what}: HTTP {status}: {preview}", field=what, status=status)

    def _sent_token(self) -> str | None:
        """The ACL token the requests carry: ``token``, else ``$NOMAD_TOKEN`` (python-nomad's
        own fallback)."""
        return self.token or os.environ.get("NOMAD_TOKEN") or None

    def _redacted(self, text: str) -> str:
        """``text`` without the ACL token in it (a proxy may echo a refused request)."""
        token = self._sent_token()
        return text.replace(token, "<the ACL token>") if token else text


# ============================================================================ Nomad's answers


@attrs.frozen(kw_only=True)
class AllocationStub(AllocationStatus):
    """What the pool needs of one entry of ``GET /v1/job/{job_id}/allocations``.

    Attributes:
        id: The allocation ID.
        name: ``job.group[index]``.
        index: The index in the name: Nomad keeps it across replacements and removes the
            highest ones first when the count goes down.
        job_version: The job version the allocation runs.
        client_status: ``pending``, ``running``, ``complete``, ``failed``, ``lost`` (or newer).
        desired_status: ``run``, ``stop`` or ``evict``.
        restarts: In-place restarts of its tasks so far.
        failure: The latest event of its tasks that says why a task could not start or run
            (``Failed Artifact Download: ...``, ``Driver Failure: ...``), or ``""``.
    """

    id: str
    name: str
    index: int
    job_version: int
    client_status: str
    desired_status: str
    restarts: int
    failure: str = ""


# The wire types: only the fields the pool reads, each named as Nomad spells it (so a fault's
# path is Nomad's own: ``$[0].TaskStates['main'].Restarts``).


@attrs.frozen(kw_only=True)
class _TaskEvent:
    Type: str | None = None
    Time: int | None = None
    DisplayMessage: str | None = None
    Message: str | None = None


@attrs.frozen(kw_only=True)
class _TaskState:
    Restarts: int | None = None
    Events: list[_TaskEvent] | None = None


_FAILURES = frozenset(
    {"Failed Artifact Download", "Driver Failure", "Setup Failure", "Failed Validation",
     "Task hook failed", "Template failed"}
)  # fmt: skip
"""The task events that say why a task could not start (Nomad's ``TaskEvent`` types)."""


@attrs.frozen(kw_only=True)
class _ListStub:
    ID: str
    Name: str
    ClientStatus: str
    DesiredStatus: str
    JobVersion: int | None = None
    TaskStates: dict[str, _TaskState] | None = None


@attrs.frozen(kw_only=True)
class _Port:
    Label: str | None = None
    Value: int | None = None
    HostIP: str | None = None


@attrs.frozen(kw_only=True)
class _Network:
    IP: str | None = None
    DynamicPorts: list[_Port] | None = None
    ReservedPorts: list[_Port] | None = None


@attrs.frozen(kw_only=True)
class _Shared:
    Ports: list[_Port] | None = None
    Networks: list[_Network] | None = None


@attrs.frozen(kw_only=True)
class _Resources:
    Shared: _Shared | None = None


@attrs.frozen(kw_only=True)
class _Allocation:
    AllocatedResources: _Resources | None = None


@attrs.frozen(kw_only=True)
class _Task:
    Name: str | None = None
    Env: dict[str, str] | None = None


@attrs.frozen(kw_only=True)
class _Group:
    Name: str | None = None
    Tasks: list[_Task] | None = None


@attrs.frozen(kw_only=True)
class _Job:
    Version: int | None = None
    Stop: bool | None = None
    TaskGroups: list[_Group] | None = None


@attrs.frozen(kw_only=True)
class _Metric:
    NodesEvaluated: int | None = None
    CoalescedFailures: int | None = None
    NodesAvailable: dict[str, int] | None = None
    ClassFiltered: dict[str, int] | None = None
    ConstraintFiltered: dict[str, int] | None = None
    ClassExhausted: dict[str, int] | None = None
    DimensionExhausted: dict[str, int] | None = None
    QuotaExhausted: list[str] | None = None


@attrs.frozen(kw_only=True)
class _Evaluation:
    Status: str | None = None
    CreateIndex: int | None = None
    FailedTGAllocs: dict[str, _Metric] | None = None


_WIRE_TYPES = (
    _TaskEvent, _TaskState, _ListStub, _Port, _Network, _Shared, _Resources, _Allocation,
    _Task, _Group, _Job, _Metric, _Evaluation,
)  # fmt: skip
_INDEX = re.compile(r"\[(\d+)\]$")


def _guarded(kind: type, build: Any) -> Any:
    """``build``, for values of ``kind`` only (cattrs would read a string as a list of
    characters, or an object as the list of its keys)."""
    name = "an object" if kind is dict else "a list"

    def structure_checked(value: object, type_: Any) -> Any:
        if not isinstance(value, kind):
            raise ValueError(f"expected {name}, got {type(value).__name__}")
        return build(value, type_)

    return structure_checked


def _nomad_converter() -> cattrs.Converter:
    conv = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
    register_strict_primitives(conv)
    conv.register_structure_hook_factory(
        is_sequence, lambda type_: _guarded(list, list_structure_factory(type_, conv))
    )
    conv.register_structure_hook_factory(
        is_mapping, lambda type_: _guarded(dict, mapping_structure_factory(type_, conv))
    )
    for cls in _WIRE_TYPES:
        conv.register_structure_hook(cls, _guarded(dict, conv.gen_structure_attrs_fromdict(cls)))
    return conv


_converter = _nomad_converter()


def _count(value: int | None, path: str) -> int:
    """A count Nomad may leave unset (``null``: 0); never negative."""
    if value is not None and value < 0:
        raise WireError(path, f"expected an integer >= 0, got {value!r}")
    return value or 0


def _stub(item: _ListStub, path: str) -> AllocationStub:
    found = _INDEX.search(item.Name)
    if found is None:
        raise WireError(f"{path}.Name", f"expected 'job.group[index]', got {item.Name!r}")
    restarts = sum(
        _count(state.Restarts, f"{path}.TaskStates[{task!r}].Restarts")
        for task, state in (item.TaskStates or {}).items()
    )
    failures = [
        event
        for state in (item.TaskStates or {}).values()
        for event in state.Events or ()
        if event.Type in _FAILURES
    ]
    failure = ""
    if failures:
        last = max(failures, key=lambda event: event.Time or 0)
        failure = f"{last.Type}: {last.DisplayMessage or last.Message or ''}".rstrip(": ")
    return AllocationStub(
        id=item.ID,
        name=item.Name,
        index=int(found.group(1)),
        job_version=_count(item.JobVersion, f"{path}.JobVersion"),
        client_status=item.ClientStatus,
        desired_status=item.DesiredStatus,
        restarts=restarts,
        failure=failure,
    )


def parse_allocation_stubs(body: JSON) -> list[AllocationStub]:
    """The allocations of ``GET /v1/job/{job_id}/allocations``, in the order given.

    Fields the real agent sends as ``null`` (the list itself, task states, versions) count as
    unset.

    Raises:
        WireError: the body is not a list of allocation stubs (the path names the fault).
    """
    if body is None:
        return []
    items: list[_ListStub] = structure(body, list[_ListStub], converter=_converter)
    return [_stub(item, f"$[{i}]") for i, item in enumerate(items)]


def _host_port(host: str | None, port: int | None, path: str) -> str:
    if port is None or not 0 < port < 65536:
        raise WireError(path, f"expected a port number, got {port!r}")
    if not host:
        raise WireError(path, "the port has no host address")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def allocation_address(body: JSON, label: str = PORT_LABEL) -> str:
    """``host:port`` of the port labelled ``label`` in ``GET /v1/allocation/{id}``'s answer.

    Looks in ``AllocatedResources.Shared.Ports`` (``HostIP`` and ``Value``), then in
    ``AllocatedResources.Shared.Networks[*]`` (``IP`` and the ``DynamicPorts`` or
    ``ReservedPorts`` entry).

    Raises:
        WireError: the answer is malformed or has no such port.
    """
    resources = structure(body, _Allocation, converter=_converter).AllocatedResources
    if resources is None:
        raise WireError("$.AllocatedResources", "missing: the allocation has no resources yet")
    shared = resources.Shared
    if shared is None:
        raise WireError("$.AllocatedResources.Shared", "missing")
    where = "$.AllocatedResources.Shared.Ports"
    for i, port in enumerate(shared.Ports or ()):
        if port.Label == label:
            return _host_port(port.HostIP, port.Value, f"{where}[{i}]")
    where = "$.AllocatedResources.Shared.Networks"
    for i, network in enumerate(shared.Networks or ()):
        for kind, ports in (
            ("DynamicPorts", network.DynamicPorts),
            ("ReservedPorts", network.ReservedPorts),
        ):
            for j, port in enumerate(ports or ()):
                if port.Label == label:
                    return _host_port(network.IP, port.Value, f"{where}[{i}].{kind}[{j}]")
    raise WireError(
        "$.AllocatedResources.Shared.Ports", f"no port labelled {label!r} in the allocation"
    )


@attrs.frozen(kw_only=True)
class JobState:
    """What a pool needs of ``GET /v1/job/{job_id}`` to know whether the job is still its own.

    Attributes:
        version: The job's version (``Version``).
        stopped: The job is stopped (``Stop``): by a pool's close, or by an operator.
        token: The task's value of the token variable (``Env``), ``None`` when the job has no
            such task or variable: a pool's job carries its own token there.
    """

    version: int
    stopped: bool
    token: str | None = attrs.field(repr=False)


def parse_job(body: JSON, *, group: str, task: str, token_env: str) -> JobState:
    """The ``JobState`` of ``GET /v1/job/{job_id}``'s answer; ``token`` is ``token_env`` in the
    ``Env`` of the task ``task`` of the group ``group``.

    Raises:
        WireError: the answer is not a job (the path names the fault).
    """
    job = structure(body, _Job, converter=_converter)
    token = None
    for one in job.TaskGroups or ():
        for each in one.Tasks or () if one.Name == group else ():
            if each.Name == task:
                token = (each.Env or {}).get(token_env)
    return JobState(version=_count(job.Version, "$.Version"), stopped=bool(job.Stop), token=token)


def placement_failure(body: JSON, group: str) -> str:
    """Why the latest complete evaluation in ``GET /v1/job/{job_id}/evaluations`` could not place
    allocations of ``group`` (its ``FailedTGAllocs`` entry: the nodes evaluated, the datacenters
    without a ready node, what filtered or exhausted them), or ``""`` when it placed them all.

    Raises:
        WireError: the body is not a list of evaluations (the path names the fault).
    """
    if body is None:
        return ""
    evaluations = structure(body, list[_Evaluation], converter=_converter)
    done = [e for e in evaluations if e.Status == "complete"]
    latest = max(done, key=lambda e: e.CreateIndex or 0, default=None)
    metric = None if latest is None else (latest.FailedTGAllocs or {}).get(group)
    if metric is None:
        return ""
    parts = [f"{metric.NodesEvaluated or 0} nodes evaluated"]
    available = metric.NodesAvailable or {}
    if not any(available.values()):
        where = ", ".join(sorted(available)) or "its datacenters"
        parts.append(f"no ready node in {where}")
    for what, found in (
        ("filtered", (metric.ClassFiltered or {}) | (metric.ConstraintFiltered or {})),
        ("exhausted", (metric.ClassExhausted or {}) | (metric.DimensionExhausted or {})),
    ):
        if found:
            parts.append(f"{what}: " + ", ".join(f"{k} {n}" for k, n in sorted(found.items())))
    if metric.QuotaExhausted:
        parts.append("quota exhausted: " + ", ".join(metric.QuotaExhausted))
    failed = (metric.CoalescedFailures or 0) + 1
    return f"Nomad could not place {failed} allocation(s) of group {group}: " + "; ".join(parts)
