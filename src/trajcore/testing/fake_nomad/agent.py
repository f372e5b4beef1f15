"""``FakeNomadAPI``: a strict little Nomad agent on loopback whose allocations are real processes.

No Nomad binary can be had on the machines trajcore is built on, so the Nomad pool is tested
against this: an HTTP server on ``127.0.0.1`` (``adapters.http1.HTTPServer``, the server the slot
server uses) that answers the Nomad API calls the pool makes, and a tiny scheduler and client in
one whose allocations run the task's command as child processes on loopback ports, the way
Nomad's ``raw_exec`` driver would. A slot server started this way is the real program, so a test
can kill one (``kill_allocation``) and watch the pool notice and replace it.

Endpoints (under ``/v1``): ``GET status/leader``; ``POST jobs`` and ``POST job/{id}``
(register); ``GET job/{id}``; ``DELETE job/{id}`` (``purge``); ``GET job/{id}/allocations``
(``all``); ``GET job/{id}/evaluations``; ``POST job/{id}/scale``; ``GET allocation/{id}``;
``POST allocation/{id}/stop``.
Anything else is 404, as on an agent that does not know the path.

Strictness. Given a ``NomadOpenAPI`` (Nomad's own OpenAPI description, read from the file
``$TRAJCORE_NOMAD_OPENAPI`` names, never copied into trajcore), every request is checked before it
is served: the operation must exist for that path and method, every query parameter must be one
the operation declares (and parse as its type), and a body must validate against the
operation's request schema *with unknown fields refused* (the published schemas leave objects
open; a field the real agent does not know would be silently ignored there, so here it is an
error). A failed check is a 400 with the reason, and is kept in ``violations``. With
``check_responses`` every 200 answer is checked against the response schema the same way, and a
failure there is a 500 and a violation too. Beyond the schema, the fake refuses jobs the real
agent would refuse (no ID, a space in it, a reschedule delay under 5 s, memory under 10 MB,
ambiguous restart policies, a template whose destination leaves the task directory) and jobs it
cannot run (more than one task group or task, a template other than ``{{ env "NAME" }}``).

Where the published schema and the real agent disagree, the fake follows the schema in what it
sends (it omits a field instead of sending the ``null`` the real agent sends for Go's nil) and
the pool's parsers accept both; the tests note each such case.

What it simulates, and how (one node, ``fake-node``, address ``127.0.0.1``):

- Placement: one allocation per missing index ``0 .. Count-1`` of the one task group, named
  ``job.group[i]``, with a fresh free port per ``DynamicPorts`` label. Tasks whose driver is not
  in ``drivers`` (``raw_exec`` and ``exec``, both run as plain child processes), and jobs whose
  ``Datacenters`` do not match the node's ``datacenter``, are not placed, as on a cluster with
  no such client; the job stays ``pending`` and its evaluation says why (``FailedTGAllocs``).
Where each part lives: ``openapi`` (the schema checks), ``jobs`` (Nomad's job rules and the
scheduler's records), ``processes`` (how a task runs), ``render`` (the JSON answers); this
module holds the HTTP routes and the scheduler.

- Running: ``${NOMAD_*}`` references in the command, its arguments and ``Env`` are interpolated,
  templates are rendered into the task directory, and the command runs in its own process group
  with the task's environment (this process's environment plus Nomad's variables and ``Env``).
  The allocation is ``running`` once the process has started.
- Death: a task that exits while wanted is restarted in place up to the restart policy's
  attempts; then its allocation is ``failed`` and a replacement of the same name is placed after
  the reschedule delay (capped by ``reschedule_delay_cap_s``, so tests need not wait 5 s).
- Scaling down stops the highest indices first; ``POST allocation/{id}/stop`` stops one and
  places its replacement; an updated task (anything but the count) replaces every allocation at
  once; ``DELETE`` stops them all (and with ``purge`` forgets the job; its allocations then show
  only with ``all=true``, as do those of earlier registrations of the same ID).
- Stopping is SIGTERM to the process group, then SIGKILL after the task's kill timeout (capped
  by ``kill_timeout_cap_s``).

- Artifacts are fetched into the task directory before each start (``artifacts``: local
  ones only); a failed one is a ``Failed Artifact Download`` event and a failed start.

Faults and inspection: ``kill_allocation`` (signal a running task's process group),
``fail_requests`` (the next requests answer an HTTP error), ``alloc_dir``, ``requests``
(every request: method, path, query, JSON body), ``violations``, ``allocations`` and ``job``.
"""

from __future__ import annotations

import copy
import json
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Self
from urllib.parse import parse_qsl, unquote, urlsplit

import anyio
import anyio.abc
import attrs

from trajcore.adapters.http1.server import HTTPServer
from trajcore.adapters.http1.values import Reply, Request
from trajcore.adapters.lifetime import ClosedOnExit
from trajcore.domain.errors import ConfigError, StateError
from trajcore.domain.json_values import JSON, JSONObject, check_json
from trajcore.testing.fake_nomad.artifacts import ArtifactError, fetch_artifacts
from trajcore.testing.fake_nomad.jobs import (
    NS,
    Alloc,
    FakeAllocation,
    Job,
    NomadRequest,
    Refused,
    TaskChange,
    as_int,
    as_object,
    as_str,
    bad,
    now_ns,
    placement_failure,
    task_spec,
    without_count,
)
from trajcore.testing.fake_nomad.openapi import GO_TRUE, NomadOpenAPI
from trajcore.testing.fake_nomad.processes import (
    ContainerGuard,
    free_port,
    signal_group,
    start_container,
    start_task,
)
from trajcore.testing.fake_nomad.render import (
    allocation_json,
    evaluation_json,
    job_json,
    stub_json,
)
from trajcore.testing.fake_nomad.routes import route

__all__ = ["FakeNomadAPI"]


# ============================================================================ the fake


@attrs.define(eq=False)
class FakeNomadAPI(ClosedOnExit):
    """A Nomad agent's HTTP API on loopback, running allocations as child processes.

    Use ``async with FakeNomadAPI(...) as nomad`` and point a client at ``nomad.address``.

    Attributes:
        openapi: Checks every request (and answer) against Nomad's OpenAPI description;
            ``None``: no schema checks (the fake's own job checks still apply).
        check_responses: Also check every 200 answer (needs ``openapi``).
        drivers: Task drivers this fake client runs: ``raw_exec`` and ``exec`` as plain child
            processes, ``docker`` as containers through ``engine``.
        engine: The container engine's command words (``("podman", "--runtime", "runc")``,
            ``("docker",)``); needed for the ``docker`` driver.
        container_prefix: Names of the containers started (``<prefix>-<allocation id>``); every
            one is removed when its task stops, when the fake closes, and by a guard process
            when the fake's process ends without closing it (``processes.ContainerGuard``).
        acl_token: When set, every request but ``status/leader`` must carry it.
        acl_status: What a refused token gets: 403 as Nomad answers, 401 as a proxy may.
        acl_denied: Paths (prefixes) refused to every token, as to one whose policy lacks
            the capability (``/v1/job/x/allocations``: no ``read-job``).
        reschedule_delay_cap_s: Longest a failed allocation waits for its replacement
            (doubling per failure of the same chain from a twentieth of it); ``None``: the job's
            own delay.
        restart_delay_cap_s: Longest an in-place restart waits; ``None``: the job's delay.
        kill_timeout_cap_s: Longest a stopped task gets between SIGTERM and SIGKILL.
        root: Where allocation directories go (``None``: a temporary directory, removed on
            close).
        datacenter: The node's datacenter: a job whose ``Datacenters`` do not match it is
            not placed.
    """

    openapi: NomadOpenAPI | None = None
    check_responses: bool = True
    drivers: tuple[str, ...] = ("raw_exec", "exec")
    engine: tuple[str, ...] | None = None
    container_prefix: str = "trajcore-fake-nomad"
    acl_token: str | None = attrs.field(default=None, repr=False)
    acl_status: int = 403
    acl_denied: tuple[str, ...] = ()
    reschedule_delay_cap_s: float | None = 0.5
    restart_delay_cap_s: float | None = 0.1
    kill_timeout_cap_s: float = 5.0
    root: Path | None = None
    datacenter: str = "dc1"
    _server: HTTPServer | None = attrs.field(init=False, default=None)
    _group: anyio.abc.TaskGroup | None = attrs.field(init=False, default=None)
    _port: int = attrs.field(init=False, default=0)
    _dir: Path | None = attrs.field(init=False, default=None)
    _own_dir: bool = attrs.field(init=False, default=False)
    _jobs: dict[tuple[str, str], Job] = attrs.field(init=False, factory=dict)
    _allocs: dict[str, Alloc] = attrs.field(init=False, factory=dict)
    _index: int = attrs.field(init=False, default=1)
    _faults: list[tuple[int, str]] = attrs.field(init=False, factory=list)
    _closing: bool = attrs.field(init=False, default=False)
    _containers: set[str] = attrs.field(init=False, factory=set)
    _guard: ContainerGuard | None = attrs.field(init=False, default=None)
    requests: list[NomadRequest] = attrs.field(init=False, factory=list)
    violations: list[str] = attrs.field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        unknown = [d for d in self.drivers if d not in ("raw_exec", "exec", "docker")]
        if unknown:
            raise ConfigError("drivers", f"the fake runs raw_exec, exec and docker, not {unknown}")
        if "docker" in self.drivers and not self.engine:
            raise ConfigError("engine", "the docker driver needs a container engine's command")

    # ------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        if self._server is not None:
            raise StateError("a FakeNomadAPI is entered once")
        if self.root is None:
            self._dir = Path(tempfile.mkdtemp(prefix="trajcore-fake-nomad-"))
            self._dir.chmod(0o711)  # slot servers run as root give their slots other uids
            self._own_dir = True
        else:
            self._dir = self.root
            self._dir.mkdir(parents=True, exist_ok=True)
        if self.engine is not None and "docker" in self.drivers:
            self._guard = ContainerGuard(self.engine, self.container_prefix)
            await self._guard.start(self._dir if self._own_dir else self._dir / ".guard")
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        self._server = HTTPServer(self._answer, idle_timeout_s=30.0)
        _, self._port = await self._server.listen_tcp("127.0.0.1", 0)
        return self

    async def aclose(self) -> None:
        """Stop serving, stop every task (SIGTERM, then SIGKILL), remove the fake's files."""
        if self._closing:
            return
        self._closing = True
        with anyio.CancelScope(shield=True):
            if self._server is not None:
                await self._server.aclose(grace_s=1.0)
            running = [a for a in self._allocs.values() if a.process is not None]
            for alloc in running:
                signal_group(alloc.process, signal.SIGTERM)
            with anyio.move_on_after(self.kill_timeout_cap_s):
                for alloc in running:
                    if alloc.process is not None:
                        await alloc.process.wait()
            for alloc in running:
                signal_group(alloc.process, signal.SIGKILL)
        # The task group is left outside the shield: it was entered outside it.
        group, self._group = self._group, None
        if group is not None:
            group.cancel_scope.cancel()
            await group.__aexit__(None, None, None)
        with anyio.CancelScope(shield=True):
            for alloc in running:
                if alloc.process is not None:
                    with anyio.move_on_after(1.0):
                        await alloc.process.wait()
            if self._guard is not None:
                for container in sorted(self._containers):
                    await self._guard.remove(container)
                self._containers.clear()
                await self._guard.release()
            if self._own_dir and self._dir is not None:
                directory = self._dir
                await anyio.to_thread.run_sync(lambda: shutil.rmtree(directory, True))

    @property
    def address(self) -> str:
        """``http://127.0.0.1:<port>``: where the API listens."""
        if self._server is None:
            raise StateError("the fake Nomad API is not started")
        return f"http://127.0.0.1:{self._port}"

    # ------------------------------------------------------------------------- faults

    @property
    def alloc_dir(self) -> Path:
        """The client's allocation directory: ``<alloc_dir>/<id>/<task>`` is a task's."""
        if self._dir is None:
            raise StateError("the fake Nomad API is not started")
        return self._dir

    def kill_allocation(self, alloc_id: str, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to ``alloc_id``'s running task: its process group, and for a
        ``docker`` task its container (through the engine, before this returns).

        Raises ``KeyError`` for an unknown allocation, ``StateError`` when no task runs.
        """
        alloc = self._allocs[alloc_id]
        if alloc.process is None or alloc.process.returncode is not None:
            raise StateError(f"allocation {alloc_id} runs no task")
        if alloc.spec.docker is not None and self.engine is not None:
            subprocess.run(
                [*self.engine, "kill", "--signal", str(int(signum)),
                 f"{self.container_prefix}-{alloc.id}"],
                capture_output=True, timeout=60, check=False,
            )  # fmt: skip
        signal_group(alloc.process, signum)

    def fail_requests(self, status: int = 500, times: int = 1, path_prefix: str = "/v1/") -> None:
        """The next ``times`` requests whose path starts with ``path_prefix`` answer ``status``."""
        self._faults.extend([(status, path_prefix)] * times)

    # ------------------------------------------------------------------------- inspection

    def job(self, job_id: str, namespace: str = "default") -> JSONObject | None:
        """The job as ``GET job/{id}`` would answer, or ``None`` when unknown (or purged)."""
        job = self._jobs.get((namespace, job_id))
        return None if job is None else self._render_job(job)

    def allocations(self, job_id: str, *, all_versions: bool = True) -> list[FakeAllocation]:
        """Snapshots of the job's allocations, oldest first (``all_versions``: also those of
        earlier registrations of the same ID)."""
        return [
            alloc.snapshot()
            for alloc in self._allocs.values()
            if alloc.job_id == job_id and (all_versions or self._current(alloc))
        ]

    def running(self, job_id: str) -> list[FakeAllocation]:
        """The job's allocations whose task runs and is wanted."""
        return [
            a
            for a in self.allocations(job_id)
            if a.client_status == "running" and a.desired_status == "run"
        ]

    def _current(self, alloc: Alloc) -> bool:
        job = self._jobs.get((alloc.namespace, alloc.job_id))
        return job is not None and alloc.job_create_index >= job.create_index

    # ------------------------------------------------------------------------- HTTP

    def _next_index(self) -> int:
        self._index += 1
        return self._index

    async def _answer(self, request: Request) -> Reply:
        split = urlsplit(request.target)
        path = unquote(split.path)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        token = request.headers.get("x-nomad-token")
        body: JSON | None = None
        try:
            if request.body:
                try:
                    loaded: object = json.loads(request.body)
                except (ValueError, UnicodeDecodeError) as error:
                    raise bad(f"failed to parse the body as JSON: {error}") from None
                if check_json(loaded) is not None:
                    raise bad("the body is not JSON")
                body = loaded  # type: ignore[assignment]  # check_json proved it
            self.requests.append(
                NomadRequest(method=request.method, path=path, query=query, body=body, token=token)
            )
            for i, (status, prefix) in enumerate(self._faults):
                if path.startswith(prefix):
                    del self._faults[i]
                    raise Refused(status, "injected failure")
            template, params = route(request.method, path)
            if self.openapi is not None:
                problems = self.openapi.check_request(request.method, template, query, body)
                if problems:
                    self.violations.extend(problems)
                    raise bad("; ".join(problems))
            needs_token = self.acl_token is not None and template != "/status/leader"
            if (needs_token and token != self.acl_token) or path.startswith(self.acl_denied):
                raise Refused(self.acl_status, "Permission denied")
            answer = self._serve(request.method, template, params, query, body)
        except Refused as refused:
            return Reply(
                status=refused.status,
                body=refused.reason.encode("utf-8"),
                content_type="text/plain; charset=utf-8",
            )
        if self.openapi is not None and self.check_responses:
            problems = self.openapi.check_response(request.method, template, 200, answer)
            if problems:
                self.violations.extend(problems)
                return Reply(
                    status=500, body="; ".join(problems).encode(), content_type="text/plain"
                )
        return Reply(
            status=200,
            body=json.dumps(answer).encode("utf-8"),
            headers=(
                ("X-Nomad-Index", str(self._index)),
                ("X-Nomad-KnownLeader", "true"),
                ("X-Nomad-LastContact", "0"),
            ),
        )

    def _serve(
        self,
        method: str,
        template: str,
        params: dict[str, str],
        query: dict[str, str],
        body: JSON | None,
    ) -> JSON:
        namespace = query.get("namespace") or "default"
        if template == "/status/leader":
            return "127.0.0.1:4647"
        if template == "/jobs" or (template == "/job/{jobName}" and method == "POST"):
            return self._register(as_object(body, "body"), params.get("job"), namespace)
        if template == "/job/{jobName}" and method == "GET":
            return self._render_job(self._find_job(namespace, params["job"]))
        if template == "/job/{jobName}" and method == "DELETE":
            return self._deregister(namespace, params["job"], query.get("purge", "") in GO_TRUE)
        if template == "/job/{jobName}/allocations":
            return self._list_allocations(namespace, params["job"], query.get("all", "") in GO_TRUE)
        if template == "/job/{jobName}/evaluations":
            return list(reversed(self._find_job(namespace, params["job"]).evaluations))
        if template == "/job/{jobName}/scale":
            return self._scale(namespace, params["job"], as_object(body, "body"))
        if template == "/allocation/{allocID}" and method == "GET":
            return allocation_json(self._find_alloc(params["alloc"]))
        if template == "/allocation/{allocID}/stop":
            return self._stop_allocation(self._find_alloc(params["alloc"]))
        raise Refused(404, "Invalid URL")

    def _find_job(self, namespace: str, job_id: str) -> Job:
        job = self._jobs.get((namespace, job_id))
        if job is None:
            raise Refused(404, "job not found")
        return job

    def _find_alloc(self, alloc_id: str) -> Alloc:
        alloc = self._allocs.get(alloc_id)
        if alloc is None:
            raise Refused(404, "alloc not found")
        return alloc

    # ------------------------------------------------------------------------- endpoints

    def _write_answer(self, eval_id: str, job: Job) -> JSONObject:
        return {
            "EvalID": eval_id, "EvalCreateIndex": self._index, "JobModifyIndex": job.modify_index,
            "Warnings": "", "LastIndex": self._index, "KnownLeader": True, "LastContact": 0,
        }  # fmt: skip

    def _register(self, request: JSONObject, path_id: str | None, namespace: str) -> JSON:
        body = copy.deepcopy(as_object(request.get("Job"), "Job"))
        spec, count = task_spec(body)
        job_id = as_str(body.get("ID"), "Job.ID")
        if path_id is not None and path_id != job_id:
            raise bad(f"Job ID does not match name: {job_id!r} != {path_id!r}")
        namespace = as_str(body.get("Namespace"), "Job.Namespace", namespace)
        key = (namespace, job_id)
        existing = self._jobs.get(key)
        index = self._next_index()
        eval_id = str(uuid.uuid4())
        if existing is None:
            job = self._jobs[key] = Job(
                namespace=namespace, id=job_id, body=body, spec=spec, count=count, version=0,
                create_index=index, modify_index=index, submit_time=now_ns(),
            )  # fmt: skip
        else:
            job = existing
            changed = without_count(job.body) != without_count(body)
            if changed or job.count != count or job.stopped:
                job.version += 1
            job.body, job.spec, job.count, job.modify_index = body, spec, count, index
            job.stopped = False
            job.submit_time = now_ns()
            if changed:
                for alloc in self._job_allocs(job):
                    if alloc.live:
                        self._stop(alloc, "alloc is being updated due to job update")
        self._reconcile(job, eval_id)
        return self._write_answer(eval_id, job)

    def _deregister(self, namespace: str, job_id: str, purge: bool) -> JSON:
        job = self._find_job(namespace, job_id)
        index = self._next_index()
        eval_id = str(uuid.uuid4())
        job.stopped = True
        job.version += 1
        job.modify_index = index
        self._reconcile(job, eval_id)
        if purge:
            del self._jobs[(namespace, job_id)]
        return {
            "EvalID": eval_id, "EvalCreateIndex": index, "JobModifyIndex": index,
            "LastIndex": index, "KnownLeader": True, "LastContact": 0,
        }  # fmt: skip

    def _scale(self, namespace: str, job_id: str, request: JSONObject) -> JSON:
        job = self._find_job(namespace, job_id)
        target = as_object(request.get("Target"), "Target")
        if target.get("Group") != job.spec.group:
            raise bad(f"job {job_id!r} has no task group {target.get('Group')!r}")
        count = as_int(request.get("Count"), "Count", job.count)
        if count < 0:
            raise bad("scaling action count can't be negative")
        if job.stopped:
            raise bad("job is stopped; cannot scale")
        index = self._next_index()
        eval_id = str(uuid.uuid4())
        if count != job.count:
            job.count = count
            job.version += 1
            job.modify_index = index
            groups = job.body.get("TaskGroups")
            if isinstance(groups, list) and groups and isinstance(groups[0], dict):
                groups[0]["Count"] = count
        self._reconcile(job, eval_id)
        return self._write_answer(eval_id, job)

    def _stop_allocation(self, alloc: Alloc) -> JSON:
        index = self._next_index()
        eval_id = str(uuid.uuid4())
        if alloc.live:
            alloc.awaiting_reschedule = False
            self._stop(alloc, "alloc was stopped by a user; a replacement is placed")
            job = self._jobs.get((alloc.namespace, alloc.job_id))
            if job is not None and self._current(alloc):
                self._reconcile(job, eval_id)
        return {"EvalID": eval_id, "Index": index}

    def _list_allocations(self, namespace: str, job_id: str, all_versions: bool) -> JSON:
        job = self._jobs.get((namespace, job_id))
        out: list[JSON] = []
        for alloc in self._allocs.values():
            if alloc.namespace != namespace or alloc.job_id != job_id:
                continue
            if not all_versions and (job is None or alloc.job_create_index < job.create_index):
                continue
            out.append(stub_json(alloc))
        return out

    def _render_job(self, job: Job) -> JSONObject:
        return job_json(job, live=any(a.live for a in self._job_allocs(job)))

    # ------------------------------------------------------------------------- scheduler

    def _job_allocs(self, job: Job) -> Iterator[Alloc]:
        for alloc in self._allocs.values():
            if (
                alloc.namespace == job.namespace
                and alloc.job_id == job.id
                and alloc.job_create_index >= job.create_index
            ):
                yield alloc

    def _reconcile(self, job: Job, eval_id: str) -> None:
        """Stop what the job no longer wants; place an allocation for every uncovered index."""
        live = [alloc for alloc in self._job_allocs(job) if alloc.live]
        for alloc in live:
            if job.stopped or alloc.index >= job.count:
                alloc.awaiting_reschedule = False
                why = (
                    "alloc not needed since job stopped"
                    if job.stopped
                    else ("alloc not needed due to job update")
                )
                self._stop(alloc, why)
        if job.stopped:
            return
        covered = {alloc.index for alloc in self._job_allocs(job) if alloc.live}
        missing = len(set(range(job.count)) - covered)
        job.blocked, failed = placement_failure(job, self.drivers, self.datacenter, missing)
        job.evaluations.append(evaluation_json(job, eval_id, self._index, now_ns(), failed))
        if job.blocked:
            return
        for index in range(job.count):
            if index not in covered:
                self._place(job, index, eval_id)

    def _place(self, job: Job, index: int, eval_id: str, previous: Alloc | None = None) -> Alloc:
        assert self._group is not None
        now = now_ns()
        modify = self._next_index()
        alloc = Alloc(
            id=str(uuid.uuid4()), namespace=job.namespace, job_id=job.id,
            job_create_index=job.create_index, job_version=job.version, index=index,
            spec=job.spec, job_body=copy.deepcopy(job.body),
            ports={label: free_port("127.0.0.1") for label in job.spec.port_labels},
            eval_id=eval_id, create_index=modify, modify_index=modify, create_time=now,
            modify_time=now,
        )  # fmt: skip
        if previous is not None:
            alloc.previous = previous.id
            alloc.reschedules = previous.reschedules + 1
            previous.next = alloc.id
        self._allocs[alloc.id] = alloc
        self._group.start_soon(self._run, alloc)
        return alloc

    def _touch(self, alloc: Alloc) -> None:
        alloc.modify_index = self._next_index()
        alloc.modify_time = now_ns()

    def _stop(self, alloc: Alloc, why: str) -> None:
        alloc.desired_status = "stop"
        alloc.desired_description = why
        self._touch(alloc)
        process = alloc.process
        if process is None or process.returncode is not None:
            if alloc.client_status in ("pending", "running"):
                alloc.client_status = "complete"
                alloc.task_state = "dead"
            return
        signal_group(process, signal.SIGTERM)
        kill_after = min(alloc.spec.kill_timeout_ns / NS, self.kill_timeout_cap_s)
        assert self._group is not None
        self._group.start_soon(self._kill_later, process, kill_after)

    async def _kill_later(self, process: anyio.abc.Process, after_s: float) -> None:
        with anyio.move_on_after(after_s):
            await process.wait()
        signal_group(process, signal.SIGKILL)

    def _event(self, alloc: Alloc, kind: str, message: str, **extra: JSON) -> None:
        event: JSONObject = {
            "Type": kind, "Time": now_ns(), "Message": message, "DisplayMessage": message,
            "Details": {}, **extra,
        }  # fmt: skip
        alloc.events.append(event)

    def _change(self, alloc: Alloc, change: TaskChange, **extra: JSON) -> None:
        """Carry out ``change`` on ``alloc`` and record its event (with ``extra`` fields)."""
        change.carry_out(alloc, now_ns())
        self._event(alloc, change.event, change.message, **extra)
        self._touch(alloc)

    async def _run(self, alloc: Alloc) -> None:
        """Run the allocation's task until it is stopped or fails for good."""
        assert self._dir is not None
        alloc_dir = self._dir / alloc.id / "alloc"
        task_dir = self._dir / alloc.id / alloc.spec.task
        self._event(alloc, "Received", "Task received by client")
        while not self._closing:
            if alloc.desired_status != "run":
                return
            code = await self._run_once(alloc, task_dir, alloc_dir)
            if alloc.desired_status != "run" or self._closing:
                self._change(alloc, TaskChange.KILLED)
                return
            if code is not None:
                self._event(alloc, "Terminated", f"Exit Code: {code}", ExitCode=code)
            if alloc.restarts < alloc.spec.restart_attempts:
                alloc.restarts += 1
                alloc.last_restart = now_ns()
                self._change(alloc, TaskChange.RESTARTING)
                delay = alloc.spec.restart_delay_ns / NS
                if self.restart_delay_cap_s is not None:
                    delay = min(delay, self.restart_delay_cap_s)
                await anyio.sleep(delay)
                continue
            alloc.task_failed = True
            self._change(alloc, TaskChange.FAILED, FailsTask=True)
            await self._reschedule(alloc)
            return

    async def _run_once(self, alloc: Alloc, task_dir: Path, alloc_dir: Path) -> int | None:
        """Start the task once and wait for it; its exit code, ``None`` when it did not start."""
        container = f"{self.container_prefix}-{alloc.id}"
        try:  # Nomad fetches the artifacts before the task starts, on every start
            await anyio.to_thread.run_sync(fetch_artifacts, alloc.spec.artifacts, task_dir)
        except ArtifactError as error:
            self._event(alloc, "Failed Artifact Download", str(error))
            return None
        try:
            if alloc.spec.docker is not None:
                assert self._guard is not None  # the docker driver needs an engine: checked
                self._containers.add(container)
                self._guard.starting(container)
                process = await start_container(alloc, task_dir, alloc_dir, self._guard, container)
            else:
                process = await start_task(alloc, task_dir, alloc_dir)
        except OSError as error:
            self._event(alloc, "Driver Failure", f"failed to launch command: {error}")
            return None
        alloc.process = process
        self._change(alloc, TaskChange.STARTED)
        try:
            return await process.wait()
        finally:
            alloc.process = None
            signal_group(process, signal.SIGKILL)  # what it started dies with it
            if self._guard is not None and container in self._containers:
                await self._guard.remove(container)
                self._containers.discard(container)

    async def _reschedule(self, alloc: Alloc) -> None:
        job = self._jobs.get((alloc.namespace, alloc.job_id))
        if job is None or job.stopped or not self._current(alloc) or alloc.index >= job.count:
            return
        spec = alloc.spec
        delay_ns = spec.reschedule_delay_ns
        if spec.reschedule_function == "exponential":
            delay_ns = min(delay_ns * 2 ** min(alloc.reschedules, 30), spec.reschedule_max_delay_ns)
        delay = delay_ns / NS
        if self.reschedule_delay_cap_s is not None:
            cap = self.reschedule_delay_cap_s
            delay = min(delay, cap / 20 * 2 ** min(alloc.reschedules, 30), cap)
        alloc.awaiting_reschedule = True
        await anyio.sleep(delay)
        job = self._jobs.get((alloc.namespace, alloc.job_id))
        if not alloc.awaiting_reschedule or job is None or job.stopped:
            return
        alloc.awaiting_reschedule = False
        if alloc.index < job.count and self._current(alloc):
            self._place(job, alloc.index, str(uuid.uuid4()), previous=alloc)
