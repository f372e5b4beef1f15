"""The jobs the fake Nomad accepts, as Nomad's own rules check them, and what it keeps of them.

``task_spec`` turns a registered job's JSON into what the fake runs (``TaskSpec``: one group, one
task) or raises ``Refused`` (a 400 with the reason the real agent would give): no ID or a space
in it, a reschedule delay under 5 s, memory under 10 MB, ambiguous restart or reschedule
policies, log storage above the disk, a template whose destination leaves the task directory;
and what the fake cannot run (more than one task group or task, a template other than
``{{ env "NAME" }}``, a host volume: its client has none). ``parse_artifacts`` reads a task's
``Artifacts`` as Nomad checks them (``artifacts`` fetches them). ``Job`` and ``Alloc`` are the
scheduler's records; ``NomadRequest`` and ``FakeAllocation`` are the snapshots tests read.
"""

from __future__ import annotations

import copy
import enum
import fnmatch
import json
import re
import time
from pathlib import Path, PurePosixPath
from typing import Final

import anyio.abc
import attrs

from trajcore.domain.json_values import JSON, JSONObject

__all__ = [
    "ENV_TEMPLATE",
    "NS",
    "Alloc",
    "Artifact",
    "DockerConfig",
    "FakeAllocation",
    "Job",
    "NomadRequest",
    "Refused",
    "TaskChange",
    "TaskSpec",
    "as_int",
    "as_object",
    "as_str",
    "bad",
    "now_ns",
    "parse_artifacts",
    "placement_failure",
    "task_spec",
    "without_count",
]

NS: Final = 1_000_000_000
_MIN_RESCHEDULE_DELAY_NS: Final = 5 * NS
_DELAY_FUNCTIONS: Final = frozenset({"constant", "exponential", "fibonacci"})
ENV_TEMPLATE: Final = re.compile(r'\{\{-?\s*env\s+"([A-Za-z_][A-Za-z0-9_]*)"\s*-?\}\}')
"""The one template form the fake renders: ``{{ env "NAME" }}``."""


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


class Refused(Exception):
    """A request answered with ``status`` and a plain-text ``reason`` (Nomad's error style)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def bad(reason: str) -> Refused:
    return Refused(400, reason)


def now_ns() -> int:
    """Nomad's clock: Unix nanoseconds."""
    return time.time_ns()


def as_object(value: JSON | None, where: str) -> JSONObject:
    if not isinstance(value, dict):
        raise bad(f"{where}: expected an object")
    return value


def as_list(value: JSON | None, where: str) -> list[JSON]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad(f"{where}: expected a list")
    return value


def as_int(value: JSON | None, where: str, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{where}: expected an integer")
    return value


def as_str(value: JSON | None, where: str, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise bad(f"{where}: expected a string")
    return value


_GETTER_MODES: Final = ("any", "file", "dir")
_GETTER_OPTIONS: Final = ("archive", "checksum")


@attrs.frozen(kw_only=True)
class Artifact:
    """One artifact of a task: where from, where to (relative to the task directory), how."""

    source: str
    destination: str
    mode: str
    options: tuple[tuple[str, str], ...] = ()

    def option(self, name: str) -> str | None:
        return dict(self.options).get(name)


def parse_artifacts(task: JSONObject) -> tuple[Artifact, ...]:
    """The task's artifacts, checked as Nomad checks them at registration (``Refused``)."""
    found = []
    for i, raw in enumerate(as_list(task.get("Artifacts"), "Tasks[0].Artifacts")):
        where = f"Tasks[0].Artifacts[{i}]"
        artifact = as_object(raw, where)
        source = as_str(artifact.get("GetterSource"), f"{where}.GetterSource")
        if not source:
            raise bad(f"{where}: source must be specified")
        destination = as_str(artifact.get("RelativeDest"), f"{where}.RelativeDest", "local/")
        relative = PurePosixPath(destination)
        if relative.is_absolute() or ".." in relative.parts:
            raise bad(f"{where}: destination escapes allocation directory: {destination!r}")
        mode = as_str(artifact.get("GetterMode"), f"{where}.GetterMode", "any") or "any"
        if mode not in _GETTER_MODES:
            raise bad(f"{where}: invalid artifact mode {mode!r}; must be one of {_GETTER_MODES}")
        options = as_object(artifact.get("GetterOptions") or {}, f"{where}.GetterOptions")
        unknown = sorted(set(options) - set(_GETTER_OPTIONS))
        if unknown:
            raise bad(
                f"{where}: the fake Nomad knows the getter options {_GETTER_OPTIONS}, not {unknown}"
            )
        found.append(
            Artifact(
                source=source,
                destination=destination,
                mode=mode,
                options=tuple(
                    (k, as_str(v, f"{where}.GetterOptions.{k}")) for k, v in options.items()
                ),
            )
        )
    return tuple(found)


@attrs.frozen(kw_only=True)
class TaskSpec:
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
    docker: DockerConfig | None = None
    artifacts: tuple[Artifact, ...] = ()


@attrs.frozen(kw_only=True)
class DockerConfig:
    """What a ``docker`` task runs: the image, its entrypoint and the container's options."""

    image: str
    entrypoint: tuple[str, ...]
    security_opts: tuple[str, ...]
    ulimits: tuple[tuple[str, str], ...]
    privileged: bool


def _docker_config(config: JSONObject) -> DockerConfig:
    image = as_str(config.get("image"), "Tasks[0].Config.image")
    if not image:
        raise bad("docker task needs an image")
    entrypoint = tuple(
        as_str(word, "Tasks[0].Config.entrypoint[]")
        for word in as_list(config.get("entrypoint"), "Tasks[0].Config.entrypoint")
    )
    security = tuple(
        as_str(option, "Tasks[0].Config.security_opt[]")
        for option in as_list(config.get("security_opt"), "Tasks[0].Config.security_opt")
    )
    limits = as_object(config.get("ulimit") or {}, "Tasks[0].Config.ulimit")
    privileged = config.get("privileged", False)
    if not isinstance(privileged, bool):
        raise bad("Tasks[0].Config.privileged: expected a boolean")
    return DockerConfig(
        image=image,
        entrypoint=entrypoint,
        security_opts=security,
        ulimits=tuple((name, as_str(value, f"ulimit.{name}")) for name, value in limits.items()),
        privileged=privileged,
    )


def _job_group_task(job: JSONObject) -> tuple[JSONObject, JSONObject]:
    """The job's one task group and its one task, after the job-level checks."""
    job_id = as_str(job.get("ID"), "Job.ID")
    if not job_id or any(c.isspace() for c in job_id) or "\0" in job_id:
        raise bad(f"1 error occurred:\n\t* Job ID {job_id!r} is missing or contains a space")
    if as_str(job.get("Type"), "Job.Type", "service") != "service":
        raise bad("the fake Nomad runs service jobs only")
    if not as_list(job.get("Datacenters"), "Job.Datacenters"):
        raise bad("1 error occurred:\n\t* Missing job datacenters")
    groups = as_list(job.get("TaskGroups"), "Job.TaskGroups")
    if len(groups) != 1:
        raise bad("the fake Nomad runs jobs of exactly one task group")
    group = as_object(groups[0], "TaskGroups[0]")
    tasks = as_list(group.get("Tasks"), "TaskGroups[0].Tasks")
    if len(tasks) != 1:
        raise bad("the fake Nomad runs task groups of exactly one task")
    return group, as_object(tasks[0], "Tasks[0]")


def _templates(task: JSONObject) -> tuple[tuple[str, str, int], ...]:
    templates: list[tuple[str, str, int]] = []
    for i, raw in enumerate(as_list(task.get("Templates"), "Tasks[0].Templates")):
        template = as_object(raw, f"Templates[{i}]")
        text = as_str(template.get("EmbeddedTmpl"), f"Templates[{i}].EmbeddedTmpl")
        destination = as_str(template.get("DestPath"), f"Templates[{i}].DestPath")
        if not destination or destination.startswith("/") or ".." in Path(destination).parts:
            raise bad(f"Templates[{i}]: destination {destination!r} escapes the task directory")
        if "{{" in ENV_TEMPLATE.sub("", text):
            raise bad(f'Templates[{i}]: the fake renders {{{{ env "NAME" }}}} only: {text!r}')
        perms = as_str(template.get("Perms"), f"Templates[{i}].Perms", "0644")
        try:
            file_mode = int(perms, 8)
        except ValueError:
            raise bad(f"Templates[{i}].Perms: {perms!r} is not an octal mode") from None
        templates.append((text, destination, file_mode))
    return tuple(templates)


def _port_labels(group: JSONObject) -> tuple[str, ...]:
    labels: list[str] = []
    for i, raw in enumerate(as_list(group.get("Networks"), "TaskGroups[0].Networks")):
        network = as_object(raw, f"Networks[{i}]")
        for j, port in enumerate(as_list(network.get("DynamicPorts"), "DynamicPorts")):
            labels.append(as_str(as_object(port, f"DynamicPorts[{j}]").get("Label"), "Label"))
    return tuple(labels)


def _restart_policy(group: JSONObject) -> tuple[int, int]:
    """(attempts, delay ns) of the group's restart policy, checked as Nomad checks it."""
    restart = as_object(group.get("RestartPolicy") or {}, "RestartPolicy")
    attempts = as_int(restart.get("Attempts"), "RestartPolicy.Attempts", 2)
    mode = as_str(restart.get("Mode"), "RestartPolicy.Mode", "fail")
    if mode not in ("fail", "delay"):
        raise bad(f"Unsupported restart mode: {mode!r}")
    if attempts == 0 and mode != "fail":
        raise bad(f"Restart policy {mode!r} with 0 attempts is ambiguous")
    return attempts, as_int(restart.get("Delay"), "RestartPolicy.Delay", 15 * NS)


def _reschedule_policy(group: JSONObject) -> tuple[int, str, int]:
    """(delay ns, delay function, max delay ns), checked as Nomad checks them."""
    reschedule = as_object(group.get("ReschedulePolicy") or {}, "ReschedulePolicy")
    delay = as_int(reschedule.get("Delay"), "ReschedulePolicy.Delay", 30 * NS)
    function = as_str(reschedule.get("DelayFunction"), "DelayFunction", "exponential")
    max_delay = as_int(reschedule.get("MaxDelay"), "ReschedulePolicy.MaxDelay", 3600 * NS)
    if delay < _MIN_RESCHEDULE_DELAY_NS:
        raise bad("Delay cannot be less than 5s")
    if function not in _DELAY_FUNCTIONS:
        raise bad(f"Invalid delay function {function!r}")
    if function != "constant" and max_delay < delay:
        raise bad("Max Delay cannot be less than Delay")
    if reschedule.get("Unlimited") is True and as_int(reschedule.get("Attempts"), "Attempts"):
        raise bad("Reschedule Policy with Attempts and Unlimited is ambiguous")
    return delay, function, max_delay


def task_spec(job: JSONObject) -> tuple[TaskSpec, int]:
    """The runnable part of ``job`` and its group's count; ``Refused`` (400) for what the real
    agent refuses or the fake cannot run."""
    group, task = _job_group_task(job)
    if group.get("Volumes") or task.get("VolumeMounts"):
        raise bad("the fake Nomad's client has no host volumes to mount")
    count = as_int(group.get("Count"), "TaskGroups[0].Count", 1)
    if count < 0:
        raise bad("Task group count can't be negative")
    driver = as_str(task.get("Driver"), "Tasks[0].Driver")
    if not driver:
        raise bad("Missing task driver")
    config = as_object(task.get("Config") or {}, "Tasks[0].Config")
    command = as_str(config.get("command"), "Tasks[0].Config.command")
    if driver in ("raw_exec", "exec") and not command:
        raise bad(f"{driver} task needs a command")
    args = tuple(as_str(a, "Tasks[0].Config.args[]") for a in as_list(config.get("args"), "args"))
    env_obj = as_object(task.get("Env") or {}, "Tasks[0].Env")
    resources = as_object(task.get("Resources") or {}, "Tasks[0].Resources")
    cpu = as_int(resources.get("CPU"), "Resources.CPU", 100)
    memory = as_int(resources.get("MemoryMB"), "Resources.MemoryMB", 300)
    if cpu < 1:
        raise bad(f"minimum CPU value is 1; got {cpu}")
    if memory < 10:
        raise bad(f"minimum MemoryMB value is 10; got {memory}")
    logs = as_object(task.get("LogConfig") or {}, "Tasks[0].LogConfig")
    log_mb = as_int(logs.get("MaxFiles"), "MaxFiles", 10) * as_int(
        logs.get("MaxFileSizeMB"), "MaxFileSizeMB", 10
    )
    disk = as_object(group.get("EphemeralDisk") or {}, "TaskGroups[0].EphemeralDisk")
    disk_mb = as_int(disk.get("SizeMB"), "EphemeralDisk.SizeMB", 300)
    if log_mb >= disk_mb:
        raise bad(
            f"log storage ({log_mb} MB) must be less than requested disk capacity ({disk_mb} MB)"
        )
    attempts, restart_delay = _restart_policy(group)
    delay, function, max_delay = _reschedule_policy(group)
    spec = TaskSpec(
        group=as_str(group.get("Name"), "TaskGroups[0].Name"),
        task=as_str(task.get("Name"), "Tasks[0].Name"),
        driver=driver,
        command=command,
        args=args,
        env=tuple((key, as_str(value, f"Env.{key}")) for key, value in env_obj.items()),
        templates=_templates(task),
        port_labels=_port_labels(group),
        restart_attempts=attempts,
        restart_delay_ns=restart_delay,
        reschedule_delay_ns=delay,
        reschedule_function=function,
        reschedule_max_delay_ns=max_delay,
        kill_timeout_ns=as_int(task.get("KillTimeout"), "Tasks[0].KillTimeout", 5 * NS),
        cpu=cpu,
        memory_mb=memory,
        docker=_docker_config(config) if driver == "docker" else None,
        artifacts=parse_artifacts(task),
    )
    return spec, count


def without_count(job: JSONObject) -> str:
    """The job's identity for "did the task change": everything but the group's count."""
    groups = job.get("TaskGroups")
    clone = copy.deepcopy(job)
    if isinstance(groups, list):
        for group in as_list(clone.get("TaskGroups"), "TaskGroups"):
            if isinstance(group, dict):
                group.pop("Count", None)
    return json.dumps(clone, sort_keys=True)


@attrs.define(eq=False)
class Job:
    namespace: str
    id: str
    body: JSONObject
    spec: TaskSpec
    count: int
    version: int
    create_index: int
    modify_index: int
    submit_time: int
    stopped: bool = False
    blocked: str = ""
    evaluations: list[JSONObject] = attrs.field(factory=list)


@attrs.define(eq=False)
class Alloc:
    id: str
    namespace: str
    job_id: str
    job_create_index: int
    job_version: int
    index: int
    spec: TaskSpec
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

    def snapshot(self) -> FakeAllocation:
        """What a test may inspect of it now."""
        label = self.spec.port_labels[0] if self.spec.port_labels else None
        process = self.process
        return FakeAllocation(
            id=self.id,
            name=self.name,
            index=self.index,
            job_id=self.job_id,
            job_version=self.job_version,
            client_status=self.client_status,
            desired_status=self.desired_status,
            restarts=self.restarts,
            address=None if label is None else f"127.0.0.1:{self.ports[label]}",
            pid=process.pid if process is not None and process.returncode is None else None,
        )

    @property
    def live(self) -> bool:
        """Wanted and holding its index: pending, running, or failed awaiting a replacement."""
        return self.desired_status == "run" and (
            self.client_status in ("pending", "running") or self.awaiting_reschedule
        )


class TaskChange(enum.Enum):
    """A change of an allocation's one task as Nomad's client reports it: the task's state, the
    allocation's client status and description (``None`` keeps it), and the task event."""

    STARTED = ("running", "running", "Tasks are running", "Started", "Task started by client")
    RESTARTING = ("pending", "pending", None, "Restarting", "Task restarting in place")
    KILLED = ("dead", "complete", "All tasks have completed", "Killed", "Task successfully killed")
    FAILED = ("dead", "failed", "Failed tasks", "Not Restarting", "Exceeded allowed attempts")

    def __init__(
        self, task_state: str, client_status: str, description: str | None, event: str, message: str
    ) -> None:
        self.task_state = task_state
        self.client_status = client_status
        self.description = description
        self.event = event
        self.message = message

    def carry_out(self, alloc: Alloc, now: int) -> None:
        """Set ``alloc``'s states, and the task's start or finish time to ``now``."""
        alloc.task_state = self.task_state
        alloc.client_status = self.client_status
        if self.description is not None:
            alloc.client_description = self.description
        if self.task_state == "running":
            alloc.started_at = now
        elif self.task_state == "dead":
            alloc.finished_at = now


def placement_failure(
    job: Job, drivers: tuple[str, ...], datacenter: str, missing: int
) -> tuple[str, JSONObject | None]:
    """Why the one node (in ``datacenter``, running ``drivers``) cannot take ``missing``
    allocations of ``job``, and the ``AllocationMetric`` Nomad's evaluation reports for the group
    (``FailedTGAllocs``); ``("", None)`` when it can (or nothing is missing). Datacenters match
    as Nomad matches them, with ``*`` and ``?`` globs."""
    wanted = [as_str(dc, "Job.Datacenters") for dc in as_list(job.body.get("Datacenters"), "")]
    metric: JSONObject = {"CoalescedFailures": missing - 1}
    if missing <= 0:
        return "", None
    if not any(fnmatch.fnmatchcase(datacenter, dc) for dc in wanted):
        metric |= {"NodesEvaluated": 0, "NodesAvailable": dict.fromkeys(wanted, 0)}
        return f"no node in datacenters {', '.join(wanted)}", metric
    if job.spec.driver not in drivers:
        metric |= {
            "NodesEvaluated": 1, "NodesFiltered": 1, "NodesAvailable": {datacenter: 1},
            "ConstraintFiltered": {"missing drivers": 1},
        }  # fmt: skip
        return f"no client runs driver {job.spec.driver!r}", metric
    return "", None
