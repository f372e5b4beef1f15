"""``FakeNomadAPI``: a strict little Nomad agent on loopback whose allocations are real processes.

No Nomad binary can be had on the machines trajcore is built on, so the Nomad pool is tested
against this: an HTTP server on ``127.0.0.1`` (``adapters.http1.HTTPServer``, the server the slot
server uses) that answers the Nomad API calls the pool makes, and a tiny scheduler and client in
one whose allocations run the task's command as child processes on loopback ports, the way
Nomad's ``raw_exec`` driver would. A slot server started this way is the real program, so a test
can kill one (``kill_allocation``) and watch the pool notice and replace it.

Endpoints (under ``/v1``): ``GET status/leader``; ``POST jobs`` and ``POST job/{id}``
(register); ``GET job/{id}``; ``DELETE job/{id}`` (``purge``); ``GET job/{id}/allocations``
(``all``); ``POST job/{id}/scale``; ``GET allocation/{id}``; ``POST allocation/{id}/stop``.
Anything else is 404, as on an agent that does not know the path.

Strictness. Given a ``NomadOpenAPI`` (Nomad's own OpenAPI description, read from where
``find_nomad_openapi`` finds it, never copied into trajcore), every request is checked before it
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
  in ``drivers`` (``raw_exec`` and ``exec``, both run as plain child processes) are not placed,
  as on a cluster with no such client; the job stays ``pending``.
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

Faults and inspection: ``kill_allocation`` (signal a running task's process group),
``fail_requests`` (the next requests answer an HTTP error), ``requests`` (every request: method,
path, query, JSON body), ``violations``, ``allocations`` and ``job``.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import parse_qsl, unquote, urlsplit

import anyio
import anyio.abc
import attrs

from trajcore.adapters.http1 import HTTPServer, Reply, Request
from trajcore.domain.errors import ConfigError, StateError
from trajcore.domain.messages import JSON, JSONObject, check_json

__all__ = [
    "OPENAPI_ENV",
    "FakeAllocation",
    "FakeNomadAPI",
    "NomadOpenAPI",
    "NomadRequest",
    "find_nomad_openapi",
]

OPENAPI_ENV: Final = "TRAJCORE_NOMAD_OPENAPI"
"""Environment variable naming Nomad's OpenAPI description (``nomad-openapi-v1.yaml``)."""
_OPENAPI_FILE: Final = "nomad-openapi-v1.yaml"
_NODE_ID: Final = "8c4f1a2e-0000-4000-8000-000000000001"
_NODE_NAME: Final = "fake-node"
_ZERO_TIME: Final = "0001-01-01T00:00:00Z"  # Go's zero time, as the agent writes unset times
_NS: Final = 1_000_000_000
_MIN_RESCHEDULE_DELAY_NS: Final = 5 * _NS
_DELAY_FUNCTIONS: Final = frozenset({"constant", "exponential", "fibonacci"})
_REF = re.compile(r"\$\{([^}]+)\}")
_ENV_TEMPLATE = re.compile(r'\{\{-?\s*env\s+"([A-Za-z_][A-Za-z0-9_]*)"\s*-?\}\}')
_GO_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


# ============================================================================ the OpenAPI file


def find_nomad_openapi(start: Path | None = None) -> Path | None:
    """Nomad's OpenAPI description: ``$TRAJCORE_NOMAD_OPENAPI``, else the first
    ``shared/reference/nomad-openapi-v1.yaml`` above ``start`` (default: the working directory,
    then this file). ``None`` when neither names an existing file."""
    named = os.environ.get(OPENAPI_ENV)
    if named:
        path = Path(named)
        return path if path.is_file() else None
    starts = [start] if start is not None else [Path.cwd(), Path(__file__)]
    for origin in starts:
        base = origin.resolve()
        for parent in (base, *base.parents):
            candidate = parent / "shared" / "reference" / _OPENAPI_FILE
            if candidate.is_file():
                return candidate
    return None


def _closed_world(schema: object) -> object:
    """``schema`` with ``additionalProperties: false`` on every object that lists properties and
    says nothing about others (the published file leaves them all open)."""
    if isinstance(schema, list):
        return [_closed_world(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _closed_world(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


@functools.cache
def _load_spec(path: Path) -> dict[str, Any]:
    import yaml  # type: ignore[import-untyped]  # deferred: only the fake reads YAML

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open("rb") as handle:
        spec = yaml.load(handle, Loader=loader)  # noqa: S506 - a safe loader (C or Python)
    if not isinstance(spec, dict) or "paths" not in spec or "components" not in spec:
        raise ConfigError(OPENAPI_ENV, f"{path} is not an OpenAPI description")
    return spec


@attrs.define(eq=False)
class NomadOpenAPI:
    """Nomad's OpenAPI description, as checks of requests and responses (see the module doc).

    Attributes:
        path: The YAML file it was read from.
    """

    path: Path
    _spec: dict[str, Any] = attrs.field(init=False, repr=False)
    _components: object = attrs.field(init=False, repr=False)
    _validators: dict[str, Any] = attrs.field(init=False, factory=dict, repr=False)

    def __attrs_post_init__(self) -> None:
        self._spec = _load_spec(self.path)
        self._components = _closed_world(self._spec["components"])

    @classmethod
    def find(cls) -> NomadOpenAPI | None:
        """The description ``find_nomad_openapi`` finds, or ``None``."""
        path = find_nomad_openapi()
        return None if path is None else cls(path)

    def _operation(self, method: str, template: str) -> dict[str, Any] | None:
        item = self._spec["paths"].get(template)
        if not isinstance(item, dict):
            return None
        operation = item.get(method.lower())
        return operation if isinstance(operation, dict) else None

    def _resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            target: Any = self._spec
            for part in str(node["$ref"]).removeprefix("#/").split("/"):
                target = target[part]
            node = target
        return node

    def _validator(self, schema: dict[str, Any]) -> Any:
        key = json.dumps(schema, sort_keys=True)
        found = self._validators.get(key)
        if found is None:
            import jsonschema  # type: ignore[import-untyped]  # deferred: a test dependency

            root = {"components": self._components, **_closed_world(schema)}  # type: ignore[dict-item]
            found = self._validators[key] = jsonschema.Draft4Validator(root)
        return found

    def _problems(self, schema: dict[str, Any], value: object, where: str) -> list[str]:
        validator = self._validator(schema)
        out: list[str] = []
        for error in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path)):
            path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
            out.append(f"{where}: {error.message} @ ${path}")
        return out

    def check_schema(self, name: str, value: object) -> list[str]:
        """Problems of ``value`` against the component schema ``name`` (closed world)."""
        if name not in self._spec["components"]["schemas"]:
            return [f"no schema named {name!r}"]
        return self._problems({"$ref": f"#/components/schemas/{name}"}, value, name)

    def check_request(
        self, method: str, template: str, query: Mapping[str, str], body: JSON | None
    ) -> list[str]:
        """Problems of a request to ``template`` (a path of the description, e.g.
        ``/job/{jobName}``): unknown operation, undeclared or mistyped query parameters, a body
        that does not fit the request schema (or a body where none is expected)."""
        where = f"{method} {template}"
        operation = self._operation(method, template)
        if operation is None:
            return [f"{where}: no such operation in the OpenAPI description"]
        problems: list[str] = []
        declared: dict[str, dict[str, Any]] = {}
        for parameter in operation.get("parameters", []):
            resolved = self._resolve(parameter)
            if resolved.get("in") == "query":
                declared[str(resolved["name"])] = resolved.get("schema", {})
        for name, value in query.items():
            schema = declared.get(name)
            if schema is None:
                problems.append(f"{where}: undeclared query parameter {name!r}")
            elif schema.get("type") == "boolean" and value not in _GO_TRUE | _GO_FALSE:
                problems.append(f"{where}: query {name}={value!r} is not a boolean")
            elif schema.get("type") == "integer" and not value.lstrip("-").isdigit():
                problems.append(f"{where}: query {name}={value!r} is not an integer")
        request_body = operation.get("requestBody")
        if request_body is None:
            if body is not None:
                problems.append(f"{where}: the operation takes no body")
            return problems
        resolved_body = self._resolve(request_body)
        if body is None:
            if resolved_body.get("required"):
                problems.append(f"{where}: a body is required")
            return problems
        schema = resolved_body["content"]["application/json"]["schema"]
        return problems + self._problems(schema, body, f"{where} request")

    def check_response(self, method: str, template: str, status: int, body: JSON) -> list[str]:
        """Problems of a JSON answer ``body`` with ``status`` to ``method template``."""
        where = f"{method} {template}"
        operation = self._operation(method, template)
        if operation is None:
            return [f"{where}: no such operation in the OpenAPI description"]
        response = operation.get("responses", {}).get(str(status))
        if response is None:
            return [f"{where}: status {status} is not a declared response"]
        content = self._resolve(response).get("content")
        if content is None:
            return [f"{where}: status {status} declares no body"]
        schema = content["application/json"]["schema"]
        return self._problems(schema, body, f"{where} response {status}")


# ============================================================================ records


@attrs.frozen(kw_only=True)
class NomadRequest:
    """One request the fake received.

    Attributes:
        method: The HTTP method.
        path: The path (``/v1/...``), without the query.
        query: The query parameters (last value wins).
        body: The JSON body, or ``None``.
        token: The ``X-Nomad-Token`` header, or ``None``.
    """

    method: str
    path: str
    query: dict[str, str]
    body: JSON | None
    token: str | None


@attrs.frozen(kw_only=True)
class FakeAllocation:
    """A snapshot of one allocation.

    Attributes:
        id, name, index: As Nomad names it (``job.group[index]``).
        job_id: Its job.
        job_version: The job version it was placed for.
        client_status: ``pending``, ``running``, ``complete`` or ``failed``.
        desired_status: ``run`` or ``stop``.
        restarts: In-place restarts so far.
        address: ``host:port`` of its first dynamic port, or ``None``.
        pid: Its process (and process group) while one runs, else ``None``.
    """

    id: str
    name: str
    index: int
    job_id: str
    job_version: int
    client_status: str
    desired_status: str
    restarts: int
    address: str | None
    pid: int | None


# ============================================================================ internals


class _Refused(Exception):
    """A request answered with ``status`` and a plain-text ``reason`` (Nomad's error style)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _bad(reason: str) -> _Refused:
    return _Refused(400, reason)


def _now_ns() -> int:
    return time.time_ns()


def _rfc3339(ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(ns / _NS, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _as_object(value: JSON | None, where: str) -> JSONObject:
    if not isinstance(value, dict):
        raise _bad(f"{where}: expected an object")
    return value


def _as_list(value: JSON | None, where: str) -> list[JSON]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(f"{where}: expected a list")
    return value


def _as_int(value: JSON | None, where: str, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{where}: expected an integer")
    return value


def _as_str(value: JSON | None, where: str, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise _bad(f"{where}: expected a string")
    return value


@attrs.frozen(kw_only=True)
class _TaskSpec:
    """What the fake runs of a registered job (its one group and one task)."""

    group: str
    task: str
    driver: str
    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    templates: tuple[tuple[str, str, int], ...]  # (template, destination, file mode)
    port_labels: tuple[str, ...]
    restart_attempts: int
    restart_delay_ns: int
    reschedule_delay_ns: int
    reschedule_function: str
    reschedule_max_delay_ns: int
    kill_timeout_ns: int
    cpu: int
    memory_mb: int


def _job_group_task(job: JSONObject) -> tuple[JSONObject, JSONObject]:
    """The job's one task group and its one task, after the job-level checks."""
    job_id = _as_str(job.get("ID"), "Job.ID")
    if not job_id or any(c.isspace() for c in job_id) or "\0" in job_id:
        raise _bad(f"1 error occurred:\n\t* Job ID {job_id!r} is missing or contains a space")
    if _as_str(job.get("Type"), "Job.Type", "service") != "service":
        raise _bad("the fake Nomad runs service jobs only")
    if not _as_list(job.get("Datacenters"), "Job.Datacenters"):
        raise _bad("1 error occurred:\n\t* Missing job datacenters")
    groups = _as_list(job.get("TaskGroups"), "Job.TaskGroups")
    if len(groups) != 1:
        raise _bad("the fake Nomad runs jobs of exactly one task group")
    group = _as_object(groups[0], "TaskGroups[0]")
    tasks = _as_list(group.get("Tasks"), "TaskGroups[0].Tasks")
    if len(tasks) != 1:
        raise _bad("the fake Nomad runs task groups of exactly one task")
    return group, _as_object(tasks[0], "Tasks[0]")


def _templates(task: JSONObject) -> tuple[tuple[str, str, int], ...]:
    templates: list[tuple[str, str, int]] = []
    for i, raw in enumerate(_as_list(task.get("Templates"), "Tasks[0].Templates")):
        template = _as_object(raw, f"Templates[{i}]")
        text = _as_str(template.get("EmbeddedTmpl"), f"Templates[{i}].EmbeddedTmpl")
        destination = _as_str(template.get("DestPath"), f"Templates[{i}].DestPath")
        if not destination or destination.startswith("/") or ".." in Path(destination).parts:
            raise _bad(f"Templates[{i}]: destination {destination!r} escapes the task directory")
        if "{{" in _ENV_TEMPLATE.sub("", text):
            raise _bad(f'Templates[{i}]: the fake renders {{{{ env "NAME" }}}} only: {text!r}')
        perms = _as_str(template.get("Perms"), f"Templates[{i}].Perms", "0644")
        try:
            file_mode = int(perms, 8)
        except ValueError:
            raise _bad(f"Templates[{i}].Perms: {perms!r} is not an octal mode") from None
        templates.append((text, destination, file_mode))
    return tuple(templates)


def _port_labels(group: JSONObject) -> tuple[str, ...]:
    labels: list[str] = []
    for i, raw in enumerate(_as_list(group.get("Networks"), "TaskGroups[0].Networks")):
        network = _as_object(raw, f"Networks[{i}]")
        for j, port in enumerate(_as_list(network.get("DynamicPorts"), "DynamicPorts")):
            labels.append(_as_str(_as_object(port, f"DynamicPorts[{j}]").get("Label"), "Label"))
    return tuple(labels)


def _restart_policy(group: JSONObject) -> tuple[int, int]:
    """(attempts, delay ns) of the group's restart policy, checked as Nomad checks it."""
    restart = _as_object(group.get("RestartPolicy") or {}, "RestartPolicy")
    attempts = _as_int(restart.get("Attempts"), "RestartPolicy.Attempts", 2)
    mode = _as_str(restart.get("Mode"), "RestartPolicy.Mode", "fail")
    if mode not in ("fail", "delay"):
        raise _bad(f"Unsupported restart mode: {mode!r}")
    if attempts == 0 and mode != "fail":
        raise _bad(f"Restart policy {mode!r} with 0 attempts is ambiguous")
    return attempts, _as_int(restart.get("Delay"), "RestartPolicy.Delay", 15 * _NS)


def _reschedule_policy(group: JSONObject) -> tuple[int, str, int]:
    """(delay ns, delay function, max delay ns), checked as Nomad checks them."""
    reschedule = _as_object(group.get("ReschedulePolicy") or {}, "ReschedulePolicy")
    delay = _as_int(reschedule.get("Delay"), "ReschedulePolicy.Delay", 30 * _NS)
    function = _as_str(reschedule.get("DelayFunction"), "DelayFunction", "exponential")
    max_delay = _as_int(reschedule.get("MaxDelay"), "ReschedulePolicy.MaxDelay", 3600 * _NS)
    if delay < _MIN_RESCHEDULE_DELAY_NS:
        raise _bad("Delay cannot be less than 5s")
    if function not in _DELAY_FUNCTIONS:
        raise _bad(f"Invalid delay function {function!r}")
    if function != "constant" and max_delay < delay:
        raise _bad("Max Delay cannot be less than Delay")
    if reschedule.get("Unlimited") is True and _as_int(reschedule.get("Attempts"), "Attempts"):
        raise _bad("Reschedule Policy with Attempts and Unlimited is ambiguous")
    return delay, function, max_delay


def _task_spec(job: JSONObject) -> tuple[_TaskSpec, int]:
    """The runnable part of ``job`` and its group's count; ``_Refused`` (400) for what the real
    agent refuses or the fake cannot run."""
    group, task = _job_group_task(job)
    count = _as_int(group.get("Count"), "TaskGroups[0].Count", 1)
    if count < 0:
        raise _bad("Task group count can't be negative")
    driver = _as_str(task.get("Driver"), "Tasks[0].Driver")
    if not driver:
        raise _bad("Missing task driver")
    config = _as_object(task.get("Config") or {}, "Tasks[0].Config")
    command = _as_str(config.get("command"), "Tasks[0].Config.command")
    if driver in ("raw_exec", "exec") and not command:
        raise _bad(f"{driver} task needs a command")
    args = tuple(_as_str(a, "Tasks[0].Config.args[]") for a in _as_list(config.get("args"), "args"))
    env_obj = _as_object(task.get("Env") or {}, "Tasks[0].Env")
    resources = _as_object(task.get("Resources") or {}, "Tasks[0].Resources")
    cpu = _as_int(resources.get("CPU"), "Resources.CPU", 100)
    memory = _as_int(resources.get("MemoryMB"), "Resources.MemoryMB", 300)
    if cpu < 1:
        raise _bad(f"minimum CPU value is 1; got {cpu}")
    if memory < 10:
        raise _bad(f"minimum MemoryMB value is 10; got {memory}")
    logs = _as_object(task.get("LogConfig") or {}, "Tasks[0].LogConfig")
    log_mb = _as_int(logs.get("MaxFiles"), "MaxFiles", 10) * _as_int(
        logs.get("MaxFileSizeMB"), "MaxFileSizeMB", 10
    )
    disk = _as_object(group.get("EphemeralDisk") or {}, "TaskGroups[0].EphemeralDisk")
    disk_mb = _as_int(disk.get("SizeMB"), "EphemeralDisk.SizeMB", 300)
    if log_mb >= disk_mb:
        raise _bad(
            f"log storage ({log_mb} MB) must be less than requested disk capacity ({disk_mb} MB)"
        )
    attempts, restart_delay = _restart_policy(group)
    delay, function, max_delay = _reschedule_policy(group)
    spec = _TaskSpec(
        group=_as_str(group.get("Name"), "TaskGroups[0].Name"),
        task=_as_str(task.get("Name"), "Tasks[0].Name"),
        driver=driver,
        command=command,
        args=args,
        env=tuple((key, _as_str(value, f"Env.{key}")) for key, value in env_obj.items()),
        templates=_templates(task),
        port_labels=_port_labels(group),
        restart_attempts=attempts,
        restart_delay_ns=restart_delay,
        reschedule_delay_ns=delay,
        reschedule_function=function,
        reschedule_max_delay_ns=max_delay,
        kill_timeout_ns=_as_int(task.get("KillTimeout"), "Tasks[0].KillTimeout", 5 * _NS),
        cpu=cpu,
        memory_mb=memory,
    )
    return spec, count


def _without_count(job: JSONObject) -> str:
    """The job's identity for "did the task change": everything but the group's count."""
    groups = job.get("TaskGroups")
    clone = copy.deepcopy(job)
    if isinstance(groups, list):
        for group in _as_list(clone.get("TaskGroups"), "TaskGroups"):
            if isinstance(group, dict):
                group.pop("Count", None)
    return json.dumps(clone, sort_keys=True)


@attrs.define(eq=False)
class _Job:
    namespace: str
    id: str
    body: JSONObject
    spec: _TaskSpec
    count: int
    version: int
    create_index: int
    modify_index: int
    submit_time: int
    stopped: bool = False
    blocked: str = ""


@attrs.define(eq=False)
class _Alloc:
    id: str
    namespace: str
    job_id: str
    job_create_index: int
    job_version: int
    index: int
    spec: _TaskSpec
    job_body: JSONObject
    ports: dict[str, int]
    eval_id: str
    create_index: int
    modify_index: int
    create_time: int
    modify_time: int
    client_status: str = "pending"
    client_description: str = "No tasks have started"
    desired_status: str = "run"
    desired_description: str = ""
    task_state: str = "pending"
    task_failed: bool = False
    restarts: int = 0
    started_at: int | None = None
    finished_at: int | None = None
    last_restart: int | None = None
    events: list[JSONObject] = attrs.field(factory=list)
    process: anyio.abc.Process | None = None
    previous: str = ""
    next: str = ""
    reschedules: int = 0  # along its chain of replacements
    awaiting_reschedule: bool = False

    @property
    def name(self) -> str:
        return f"{self.job_id}.{self.spec.group}[{self.index}]"

    @property
    def live(self) -> bool:
        """Wanted and holding its index: pending, running, or failed awaiting a replacement."""
        return self.desired_status == "run" and (
            self.client_status in ("pending", "running") or self.awaiting_reschedule
        )


_ROUTES: Final = (  # (method, path pattern, path in the OpenAPI description)
    ("GET", re.compile(r"^/v1/status/leader$"), "/status/leader"),
    ("POST", re.compile(r"^/v1/jobs$"), "/jobs"),
    ("GET", re.compile(r"^/v1/job/(?P<job>[^/]+)$"), "/job/{jobName}"),
    ("POST", re.compile(r"^/v1/job/(?P<job>[^/]+)$"), "/job/{jobName}"),
    ("DELETE", re.compile(r"^/v1/job/(?P<job>[^/]+)$"), "/job/{jobName}"),
    ("GET", re.compile(r"^/v1/job/(?P<job>[^/]+)/allocations$"), "/job/{jobName}/allocations"),
    ("POST", re.compile(r"^/v1/job/(?P<job>[^/]+)/scale$"), "/job/{jobName}/scale"),
    ("GET", re.compile(r"^/v1/allocation/(?P<alloc>[^/]+)$"), "/allocation/{allocID}"),
    ("POST", re.compile(r"^/v1/allocation/(?P<alloc>[^/]+)/stop$"), "/allocation/{allocID}/stop"),
)


# ============================================================================ the fake


@attrs.define(eq=False)
class FakeNomadAPI:
    """A Nomad agent's HTTP API on loopback, running allocations as child processes.

    Use ``async with FakeNomadAPI(...) as nomad`` and point a client at ``nomad.address``.

    Attributes:
        openapi: Checks every request (and answer) against Nomad's OpenAPI description;
            ``None``: no schema checks (the fake's own job checks still apply).
        check_responses: Also check every 200 answer (needs ``openapi``).
        drivers: Task drivers this fake client runs (as plain child processes).
        acl_token: When set, every request but ``status/leader`` must carry it.
        reschedule_delay_cap_s: Longest a failed allocation waits for its replacement
            (doubling per failure of the same chain from a twentieth of it); ``None``: the job's
            own delay.
        restart_delay_cap_s: Longest an in-place restart waits; ``None``: the job's delay.
        kill_timeout_cap_s: Longest a stopped task gets between SIGTERM and SIGKILL.
        root: Where allocation directories go (``None``: a temporary directory, removed on
            close).
    """

    openapi: NomadOpenAPI | None = None
    check_responses: bool = True
    drivers: tuple[str, ...] = ("raw_exec", "exec")
    acl_token: str | None = attrs.field(default=None, repr=False)
    reschedule_delay_cap_s: float | None = 0.5
    restart_delay_cap_s: float | None = 0.1
    kill_timeout_cap_s: float = 5.0
    root: Path | None = None
    _server: HTTPServer | None = attrs.field(init=False, default=None)
    _group: anyio.abc.TaskGroup | None = attrs.field(init=False, default=None)
    _port: int = attrs.field(init=False, default=0)
    _dir: Path | None = attrs.field(init=False, default=None)
    _own_dir: bool = attrs.field(init=False, default=False)
    _jobs: dict[tuple[str, str], _Job] = attrs.field(init=False, factory=dict)
    _allocs: dict[str, _Alloc] = attrs.field(init=False, factory=dict)
    _index: int = attrs.field(init=False, default=1)
    _faults: list[tuple[int, str]] = attrs.field(init=False, factory=list)
    _closing: bool = attrs.field(init=False, default=False)
    requests: list[NomadRequest] = attrs.field(init=False, factory=list)
    violations: list[str] = attrs.field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        unknown = [d for d in self.drivers if d not in ("raw_exec", "exec")]
        if unknown:
            raise ConfigError("drivers", f"the fake runs raw_exec and exec only, not {unknown}")

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
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        self._server = HTTPServer(self._answer, idle_timeout_s=30.0)
        _, self._port = await self._server.listen_tcp("127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()

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
                _signal_group(alloc.process, signal.SIGTERM)
            with anyio.move_on_after(self.kill_timeout_cap_s):
                for alloc in running:
                    if alloc.process is not None:
                        await alloc.process.wait()
            for alloc in running:
                _signal_group(alloc.process, signal.SIGKILL)
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

    def kill_allocation(self, alloc_id: str, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to the process group of ``alloc_id``'s running task.

        Raises ``KeyError`` for an unknown allocation, ``StateError`` when no task runs.
        """
        alloc = self._allocs[alloc_id]
        if alloc.process is None or alloc.process.returncode is not None:
            raise StateError(f"allocation {alloc_id} runs no task")
        _signal_group(alloc.process, signum)

    def fail_requests(self, status: int = 500, times: int = 1, path_prefix: str = "/v1/") -> None:
        """The next ``times`` requests whose path starts with ``path_prefix`` answer ``status``."""
        self._faults.extend([(status, path_prefix)] * times)

    # ------------------------------------------------------------------------- inspection

    def job(self, job_id: str, namespace: str = "default") -> JSONObject | None:
        """The job as ``GET job/{id}`` would answer, or ``None`` when unknown (or purged)."""
        job = self._jobs.get((namespace, job_id))
        return None if job is None else self._job_json(job)

    def allocations(self, job_id: str, *, all_versions: bool = True) -> list[FakeAllocation]:
        """Snapshots of the job's allocations, oldest first (``all_versions``: also those of
        earlier registrations of the same ID)."""
        return [
            self._snapshot(alloc)
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

    def _snapshot(self, alloc: _Alloc) -> FakeAllocation:
        label = alloc.spec.port_labels[0] if alloc.spec.port_labels else None
        process = alloc.process
        return FakeAllocation(
            id=alloc.id,
            name=alloc.name,
            index=alloc.index,
            job_id=alloc.job_id,
            job_version=alloc.job_version,
            client_status=alloc.client_status,
            desired_status=alloc.desired_status,
            restarts=alloc.restarts,
            address=None if label is None else f"127.0.0.1:{alloc.ports[label]}",
            pid=process.pid if process is not None and process.returncode is None else None,
        )

    def _current(self, alloc: _Alloc) -> bool:
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
                    raise _bad(f"failed to parse the body as JSON: {error}") from None
                if check_json(loaded) is not None:
                    raise _bad("the body is not JSON")
                body = loaded  # type: ignore[assignment]  # check_json proved it
            self.requests.append(
                NomadRequest(method=request.method, path=path, query=query, body=body, token=token)
            )
            for i, (status, prefix) in enumerate(self._faults):
                if path.startswith(prefix):
                    del self._faults[i]
                    raise _Refused(status, "injected failure")
            template, params = self._route(request.method, path)
            if self.openapi is not None:
                problems = self.openapi.check_request(request.method, template, query, body)
                if problems:
                    self.violations.extend(problems)
                    raise _bad("; ".join(problems))
            needs_token = self.acl_token is not None and template != "/status/leader"
            if needs_token and token != self.acl_token:
                raise _Refused(403, "Permission denied")
            answer = self._serve(request.method, template, params, query, body)
        except _Refused as refused:
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

    def _route(self, method: str, path: str) -> tuple[str, dict[str, str]]:
        known_path = False
        for route_method, pattern, template in _ROUTES:
            found = pattern.match(path)
            if found is not None:
                known_path = True
                if route_method == method:
                    return template, found.groupdict()
        if known_path:
            raise _Refused(405, "Invalid method")
        raise _Refused(404, "Invalid URL")

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
            return self._register(_as_object(body, "body"), params.get("job"), namespace)
        if template == "/job/{jobName}" and method == "GET":
            return self._job_json(self._find_job(namespace, params["job"]))
        if template == "/job/{jobName}" and method == "DELETE":
            return self._deregister(namespace, params["job"], query.get("purge", "") in _GO_TRUE)
        if template == "/job/{jobName}/allocations":
            return self._list_allocations(
                namespace, params["job"], query.get("all", "") in _GO_TRUE
            )
        if template == "/job/{jobName}/scale":
            return self._scale(namespace, params["job"], _as_object(body, "body"))
        if template == "/allocation/{allocID}" and method == "GET":
            return self._allocation_json(self._find_alloc(params["alloc"]))
        if template == "/allocation/{allocID}/stop":
            return self._stop_allocation(self._find_alloc(params["alloc"]))
        raise _Refused(404, "Invalid URL")

    def _find_job(self, namespace: str, job_id: str) -> _Job:
        job = self._jobs.get((namespace, job_id))
        if job is None:
            raise _Refused(404, "job not found")
        return job

    def _find_alloc(self, alloc_id: str) -> _Alloc:
        alloc = self._allocs.get(alloc_id)
        if alloc is None:
            raise _Refused(404, "alloc not found")
        return alloc

    # ------------------------------------------------------------------------- endpoints

    def _write_answer(self, eval_id: str, job: _Job) -> JSONObject:
        return {
            "EvalID": eval_id,
            "EvalCreateIndex": self._index,
            "JobModifyIndex": job.modify_index,
            "Warnings": "",
            "LastIndex": self._index,
            "KnownLeader": True,
            "LastContact": 0,
        }

    def _register(self, request: JSONObject, path_id: str | None, namespace: str) -> JSON:
        body = copy.deepcopy(_as_object(request.get("Job"), "Job"))
        spec, count = _task_spec(body)
        job_id = _as_str(body.get("ID"), "Job.ID")
        if path_id is not None and path_id != job_id:
            raise _bad(f"Job ID does not match name: {job_id!r} != {path_id!r}")
        namespace = _as_str(body.get("Namespace"), "Job.Namespace", namespace)
        key = (namespace, job_id)
        existing = self._jobs.get(key)
        index = self._next_index()
        eval_id = str(uuid.uuid4())
        if existing is None:
            job = self._jobs[key] = _Job(
                namespace=namespace, id=job_id, body=body, spec=spec, count=count, version=0,
                create_index=index, modify_index=index, submit_time=_now_ns(),
            )  # fmt: skip
        else:
            job = existing
            changed = _without_count(job.body) != _without_count(body)
            if changed or job.count != count or job.stopped:
                job.version += 1
            job.body, job.spec, job.count, job.modify_index = body, spec, count, index
            job.stopped = False
            job.submit_time = _now_ns()
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
            "EvalID": eval_id,
            "EvalCreateIndex": index,
            "JobModifyIndex": index,
            "LastIndex": index,
            "KnownLeader": True,
            "LastContact": 0,
        }

    def _scale(self, namespace: str, job_id: str, request: JSONObject) -> JSON:
        job = self._find_job(namespace, job_id)
        target = _as_object(request.get("Target"), "Target")
        if target.get("Group") != job.spec.group:
            raise _bad(f"job {job_id!r} has no task group {target.get('Group')!r}")
        count = _as_int(request.get("Count"), "Count", job.count)
        if count < 0:
            raise _bad("scaling action count can't be negative")
        if job.stopped:
            raise _bad("job is stopped; cannot scale")
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

    def _stop_allocation(self, alloc: _Alloc) -> JSON:
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
            out.append(self._stub_json(alloc))
        return out

    # ------------------------------------------------------------------------- scheduler

    def _job_allocs(self, job: _Job) -> Iterator[_Alloc]:
        for alloc in self._allocs.values():
            if (
                alloc.namespace == job.namespace
                and alloc.job_id == job.id
                and alloc.job_create_index >= job.create_index
            ):
                yield alloc

    def _reconcile(self, job: _Job, eval_id: str) -> None:
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
        if job.spec.driver not in self.drivers:
            job.blocked = f"no client runs driver {job.spec.driver!r}"
            return
        job.blocked = ""
        covered = {alloc.index for alloc in self._job_allocs(job) if alloc.live}
        for index in range(job.count):
            if index not in covered:
                self._place(job, index, eval_id)

    def _place(self, job: _Job, index: int, eval_id: str, previous: _Alloc | None = None) -> _Alloc:
        assert self._group is not None
        now = _now_ns()
        modify = self._next_index()
        alloc = _Alloc(
            id=str(uuid.uuid4()), namespace=job.namespace, job_id=job.id,
            job_create_index=job.create_index, job_version=job.version, index=index,
            spec=job.spec, job_body=copy.deepcopy(job.body),
            ports={label: _free_port("127.0.0.1") for label in job.spec.port_labels},
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

    def _touch(self, alloc: _Alloc) -> None:
        alloc.modify_index = self._next_index()
        alloc.modify_time = _now_ns()

    def _stop(self, alloc: _Alloc, why: str) -> None:
        alloc.desired_status = "stop"
        alloc.desired_description = why
        self._touch(alloc)
        process = alloc.process
        if process is None or process.returncode is not None:
            if alloc.client_status in ("pending", "running"):
                alloc.client_status = "complete"
                alloc.task_state = "dead"
            return
        _signal_group(process, signal.SIGTERM)
        kill_after = min(alloc.spec.kill_timeout_ns / _NS, self.kill_timeout_cap_s)
        assert self._group is not None
        self._group.start_soon(self._kill_later, process, kill_after)

    async def _kill_later(self, process: anyio.abc.Process, after_s: float) -> None:
        with anyio.move_on_after(after_s):
            await process.wait()
        _signal_group(process, signal.SIGKILL)

    def _event(self, alloc: _Alloc, kind: str, message: str, **extra: JSON) -> None:
        event: JSONObject = {
            "Type": kind, "Time": _now_ns(), "Message": message, "DisplayMessage": message,
            "Details": {}, **extra,
        }  # fmt: skip
        alloc.events.append(event)

    def _environment(self, alloc: _Alloc, task_dir: Path, alloc_dir: Path) -> dict[str, str]:
        spec = alloc.spec
        env = dict(os.environ)  # raw_exec inherits the client's environment
        env.update(
            {
                "NOMAD_ALLOC_ID": alloc.id,
                "NOMAD_ALLOC_NAME": alloc.name,
                "NOMAD_ALLOC_INDEX": str(alloc.index),
                "NOMAD_ALLOC_DIR": str(alloc_dir),
                "NOMAD_TASK_DIR": str(task_dir / "local"),
                "NOMAD_SECRETS_DIR": str(task_dir / "secrets"),
                "NOMAD_TASK_NAME": spec.task,
                "NOMAD_GROUP_NAME": spec.group,
                "NOMAD_JOB_ID": alloc.job_id,
                "NOMAD_JOB_NAME": alloc.job_id,
                "NOMAD_NAMESPACE": alloc.namespace,
                "NOMAD_DC": "dc1",
                "NOMAD_REGION": "global",
                "NOMAD_CPU_LIMIT": str(spec.cpu),
                "NOMAD_MEMORY_LIMIT": str(spec.memory_mb),
            }
        )
        for label, port in alloc.ports.items():
            env |= {
                f"NOMAD_IP_{label}": "127.0.0.1",
                f"NOMAD_PORT_{label}": str(port),
                f"NOMAD_ADDR_{label}": f"127.0.0.1:{port}",
                f"NOMAD_HOST_IP_{label}": "127.0.0.1",
                f"NOMAD_HOST_PORT_{label}": str(port),
                f"NOMAD_HOST_ADDR_{label}": f"127.0.0.1:{port}",
            }
        for key, value in spec.env:
            env[key] = _interpolate(value, env)
        return env

    async def _run(self, alloc: _Alloc) -> None:
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
                alloc.client_status = "complete"
                alloc.client_description = "All tasks have completed"
                alloc.task_state = "dead"
                alloc.finished_at = _now_ns()
                self._event(alloc, "Killed", "Task successfully killed")
                self._touch(alloc)
                return
            if code is not None:
                self._event(alloc, "Terminated", f"Exit Code: {code}", ExitCode=code)
            if alloc.restarts < alloc.spec.restart_attempts:
                alloc.restarts += 1
                alloc.last_restart = _now_ns()
                alloc.task_state = "pending"
                alloc.client_status = "pending"
                self._event(alloc, "Restarting", "Task restarting in place")
                self._touch(alloc)
                delay = alloc.spec.restart_delay_ns / _NS
                if self.restart_delay_cap_s is not None:
                    delay = min(delay, self.restart_delay_cap_s)
                await anyio.sleep(delay)
                continue
            alloc.client_status = "failed"
            alloc.client_description = "Failed tasks"
            alloc.task_state = "dead"
            alloc.task_failed = True
            alloc.finished_at = _now_ns()
            self._event(alloc, "Not Restarting", "Exceeded allowed attempts", FailsTask=True)
            self._touch(alloc)
            await self._reschedule(alloc)
            return

    async def _run_once(self, alloc: _Alloc, task_dir: Path, alloc_dir: Path) -> int | None:
        """Start the task once and wait for it; its exit code, ``None`` when it did not start."""
        spec = alloc.spec
        try:
            for sub in ("local", "secrets", "tmp"):
                (task_dir / sub).mkdir(parents=True, exist_ok=True)
            (task_dir / "secrets").chmod(0o700)
            (alloc_dir / "logs").mkdir(parents=True, exist_ok=True)
            env = self._environment(alloc, task_dir, alloc_dir)
            for text, destination, mode in spec.templates:
                rendered = _ENV_TEMPLATE.sub(lambda m: env.get(m.group(1), ""), text)
                target = task_dir / destination
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(rendered, encoding="utf-8")
                target.chmod(mode)
            argv = [_interpolate(spec.command, env), *(_interpolate(a, env) for a in spec.args)]
            log = alloc_dir / "logs" / f"{spec.task}.stdout.{alloc.restarts}"
            with log.open("wb") as output:
                process = await anyio.open_process(
                    argv, stdin=-3, stdout=output, stderr=output, env=env, cwd=task_dir,
                    start_new_session=True,
                )  # fmt: skip
        except OSError as error:
            self._event(alloc, "Driver Failure", f"failed to launch command: {error}")
            return None
        alloc.process = process
        alloc.task_state = "running"
        alloc.client_status = "running"
        alloc.client_description = "Tasks are running"
        alloc.started_at = _now_ns()
        self._event(alloc, "Started", "Task started by client")
        self._touch(alloc)
        try:
            return await process.wait()
        finally:
            alloc.process = None
            _signal_group(process, signal.SIGKILL)  # what it started dies with it

    async def _reschedule(self, alloc: _Alloc) -> None:
        job = self._jobs.get((alloc.namespace, alloc.job_id))
        if job is None or job.stopped or not self._current(alloc) or alloc.index >= job.count:
            return
        spec = alloc.spec
        delay_ns = spec.reschedule_delay_ns
        if spec.reschedule_function == "exponential":
            delay_ns = min(delay_ns * 2 ** min(alloc.reschedules, 30), spec.reschedule_max_delay_ns)
        delay = delay_ns / _NS
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

    # ------------------------------------------------------------------------- JSON

    def _job_json(self, job: _Job) -> JSONObject:
        body = copy.deepcopy(job.body)
        body.setdefault("Namespace", job.namespace)
        body.setdefault("Region", "global")
        body.setdefault("Priority", 50)
        live = any(a.live for a in self._job_allocs(job))
        status = "dead" if job.stopped and not live else ("running" if live else "pending")
        body |= {
            "Status": status,
            "StatusDescription": job.blocked,
            "Stop": job.stopped,
            "Stable": False,
            "Version": job.version,
            "CreateIndex": job.create_index,
            "ModifyIndex": job.modify_index,
            "JobModifyIndex": job.modify_index,
            "SubmitTime": job.submit_time,
        }
        return body

    def _task_state_json(self, alloc: _Alloc) -> JSONObject:
        def when(ns: int | None) -> str:
            return _ZERO_TIME if ns is None else _rfc3339(ns)

        return {
            "State": alloc.task_state,
            "Failed": alloc.task_failed,
            "Restarts": alloc.restarts,
            "LastRestart": when(alloc.last_restart),
            "StartedAt": when(alloc.started_at),
            "FinishedAt": when(alloc.finished_at),
            "Events": list(alloc.events),
        }

    def _stub_json(self, alloc: _Alloc) -> JSONObject:
        stub: JSONObject = {
            "ID": alloc.id,
            "EvalID": alloc.eval_id,
            "Name": alloc.name,
            "Namespace": alloc.namespace,
            "NodeID": _NODE_ID,
            "NodeName": _NODE_NAME,
            "JobID": alloc.job_id,
            "JobType": "service",
            "JobVersion": alloc.job_version,
            "TaskGroup": alloc.spec.group,
            "DesiredStatus": alloc.desired_status,
            "DesiredDescription": alloc.desired_description,
            "ClientStatus": alloc.client_status,
            "ClientDescription": alloc.client_description,
            "TaskStates": {alloc.spec.task: self._task_state_json(alloc)},
            "CreateIndex": alloc.create_index,
            "ModifyIndex": alloc.modify_index,
            "CreateTime": alloc.create_time,
            "ModifyTime": alloc.modify_time,
        }
        if alloc.previous:
            stub["RescheduleTracker"] = {
                "Events": [{"PrevAllocID": alloc.previous, "PrevNodeID": _NODE_ID}]
            }
        return stub

    def _allocation_json(self, alloc: _Alloc) -> JSONObject:
        full = self._stub_json(alloc)
        full.pop("JobType")
        full.pop("JobVersion")
        ports: list[JSON] = [
            {"Label": label, "Value": port, "To": 0, "HostIP": "127.0.0.1"}
            for label, port in alloc.ports.items()
        ]
        dynamic: list[JSON] = [
            {"Label": label, "Value": port, "To": 0, "HostNetwork": "default"}
            for label, port in alloc.ports.items()
        ]
        job = copy.deepcopy(alloc.job_body)
        job["Version"] = alloc.job_version
        full |= {
            "Job": job,
            "AllocModifyIndex": alloc.modify_index,
            "AllocatedResources": {
                "Shared": {
                    "DiskMB": 0,
                    "Ports": ports,
                    "Networks": [{"Mode": "host", "IP": "127.0.0.1", "DynamicPorts": dynamic}],
                },
                "Tasks": {
                    alloc.spec.task: {
                        "Cpu": {"CpuShares": alloc.spec.cpu},
                        "Memory": {"MemoryMB": alloc.spec.memory_mb},
                    }
                },
            },
        }
        if alloc.previous:
            full["PreviousAllocation"] = alloc.previous
        if alloc.next:
            full["NextAllocation"] = alloc.next
        return full


def _interpolate(text: str, env: Mapping[str, str]) -> str:
    """Nomad's ``${NAME}`` and ``${env["NAME"]}`` references; unknown ones stay as written."""

    def value(found: re.Match[str]) -> str:
        key = found.group(1).strip()
        if key.startswith('env["') and key.endswith('"]'):
            key = key[5:-2]
        return env.get(key, found.group(0))

    return _REF.sub(value, text)


def _signal_group(process: anyio.abc.Process | None, signum: int) -> None:
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)
