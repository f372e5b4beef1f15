"""The Nomad job that runs slot servers, as pure data.

The Nomad pool asks a Nomad cluster to run ``count`` copies of the slot server (``trajcore
slot-server``), one per allocation. This module describes that job without any I/O:
``job_json`` turns a checked ``NomadJobSpec`` into the ``Job`` object of a
``JobRegisterRequest`` (Nomad's HTTP API, JSON field names as Nomad spells them), and
``scale_request`` a new count. Reading Nomad's answers (allocation listings, addresses) is the
adapter's: ``trajcore.adapters.pools.nomad_client``.

The job (one task group, one task):

- ``Type`` ``service``; the group's ``Count`` is the number of containers; a group network in
  host mode with one dynamic port labelled ``slot``.
- The task runs ``command`` (``trajcore slot-server`` by default) with ``--slots N``, a
  workspace root in the task directory, ``--listen`` on the allocated port and ``--token-env``
  naming the task environment variable ``token_env`` that carries the token (so the token never
  appears on a command line, and no template renders it to a file; the server drops the variable
  once read), then the isolation flags of ``SlotIsolation``.
- Drivers: ``docker`` runs ``image`` (``trajcore/slot-server``, the image ``./dev image``
  builds) with ``entrypoint`` set to ``command`` (the image's own entrypoint is not relied on),
  maps the ``slot`` port, listens on ``0.0.0.0`` inside the container, and gives the container
  what bubblewrap needs without ``privileged``: ``security_opt`` ``seccomp=unconfined`` and
  ``systempaths=unconfined`` (``DOCKER_SECURITY_OPTS``; podman spells the second
  ``unmask=ALL``), and explicit ``ulimit`` ``nofile`` and ``nproc``. ``privileged`` replaces the
  security options when asked. ``exec`` and ``raw_exec`` run
  ``command`` on the client host and listen on the host address Nomad gave the port; ``image`` is
  not used by them and ``privileged`` is refused for them.
- Health: the group registers the Nomad service ``trajcore-slot-server`` (provider ``nomad``)
  on the ``slot`` port with a TCP check, so an operator sees unhealthy slot servers in Nomad;
  the pool itself waits for each server's ``/v1/health`` with the token before using it.
- Restarts: a slot server that dies forgets its slots (workspaces, epochs), so by default the
  task is not restarted in place (``restart_attempts=0``, mode ``fail``): the allocation fails
  and the reschedule policy places a fresh one (exponential delay from ``reschedule_delay_s``,
  unlimited). The pool treats either way as "container lost, a new one joins".
- Updates are not rolled (``MaxParallel`` 0): a changed job replaces its allocations at once,
  since old slot servers hold an old token and are useless to the new pool.
- Durations are nanoseconds, as Nomad's JSON API wants them.
- Task environments (``image_cache_dir`` set): the server gets ``--image-cache`` and
  ``--image-cache-bytes``; ``image_cache_volume`` becomes the group's host ``Volumes`` entry and
  the task's ``VolumeMounts`` at the cache; each ``EnvironmentArtifact`` a task ``Artifacts``
  entry (``GetterSource``, ``RelativeDest`` under ``local/environments``, ``GetterMode``,
  ``GetterOptions``). ``task_reference`` and ``reference_refusal`` say how an env's reference
  under ``/local/`` reaches an allocation's server.

Rules it keeps: every field of a spec is checked when built (``ConfigError`` naming the field);
Nomad's own limits that would make a registration fail are checked here first (reschedule delay
at least 5 s, memory at least 10 MB, a job id without spaces); ``job_json`` is a pure function.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final, Literal, cast

import attrs
from attrs.validators import optional

from trajcore.domain.converters import command_words
from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.slot_server_flags import isolation_argv
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.task_environments import TaskEnvironmentError, parse_environment_ref
from trajcore.domain.validators import (
    finite_number,
    flag,
    instance_of,
    optional_text,
    whole_number,
)

__all__ = [
    "DOCKER_SECURITY_OPTS",
    "DRIVERS",
    "ENVIRONMENTS_DIR",
    "PORT_LABEL",
    "SERVICE_NAME",
    "Driver",
    "EnvironmentArtifact",
    "NomadJobSettings",
    "NomadJobSpec",
    "job_json",
    "register_request",
    "scale_request",
]

Driver = Literal["docker", "exec", "raw_exec"]
DRIVERS: Final[tuple[Driver, ...]] = ("docker", "exec", "raw_exec")
PORT_LABEL: Final = "slot"
"""The label of the slot server's dynamic port."""
DOCKER_SECURITY_OPTS: Final = ("seccomp=unconfined", "systempaths=unconfined")
"""What a docker container needs for bubblewrap inside it, short of ``privileged``: ``/proc``
unmasked so the sandbox can mount a fresh one, and the engine's seccomp profile off so the
sandbox can make its namespaces and set its hostname (each lease gets trajcore's own filter)."""
SERVICE_NAME: Final = "trajcore-slot-server"
"""The Nomad service every slot server registers, with a TCP check on its port."""

_NS = 1_000_000_000
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_TOKEN = re.compile(r"^[\x21-\x7e]{16,512}$")
_MIN_RESCHEDULE_DELAY_S = 5.0  # Nomad refuses a reschedule delay below this
_RESTART_INTERVAL_S = 1800.0
# The slot server's own forced end (--stop-deadline) comes this long before Nomad's SIGKILL, so
# a server whose close runs late still kills its sandboxes' process group itself.
STOP_MARGIN_S = 0.5
_MIN_KILL_TIMEOUT_S = 1.0
_CHECK_INTERVAL_S, _CHECK_TIMEOUT_S = 10.0, 2.0
_LOG_FILES, _LOG_FILE_MB = 2, 10
_LOG_MB = _LOG_FILES * _LOG_FILE_MB  # Nomad wants the ephemeral disk larger than this


def _check(condition: bool, field: str, reason: str) -> None:
    if not condition:
        raise ConfigError(field, reason)


def _matches(
    pattern: re.Pattern[str], what: str
) -> Callable[[object, attrs.Attribute[str], object], None]:
    def check(_: object, attribute: attrs.Attribute[str], value: object) -> None:
        _check(
            isinstance(value, str) and pattern.fullmatch(value) is not None,
            attribute.name,
            f"must be {what}, got {value!r}",
        )

    return check


def _optional_name(_: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None:
        _check(
            isinstance(value, str) and _NAME.fullmatch(value) is not None,
            attribute.name,
            f"must be None or a name of letters, digits, '_' and '-', got {value!r}",
        )


def _names(value: object) -> tuple[str, ...]:
    """Names as a tuple: a string split on commas (``"dc1,dc2"``), or a sequence's items."""
    if isinstance(value, str):
        return tuple(name.strip() for name in value.split(",") if name.strip())
    if isinstance(value, Sequence):
        return tuple(str(name) for name in value)
    return cast("tuple[str, ...]", value)


def _nonempty_words(_: object, attribute: attrs.Attribute[tuple[str, ...]], value: object) -> None:
    _check(
        isinstance(value, tuple)
        and len(value) > 0
        and all(isinstance(w, str) and w and "\0" not in w for w in value),
        attribute.name,
        f"must be one or more non-empty words, got {value!r}",
    )


def _datacenters(_: object, attribute: attrs.Attribute[tuple[str, ...]], value: object) -> None:
    _check(
        isinstance(value, tuple)
        and len(value) > 0
        and all(isinstance(dc, str) and dc and dc == dc.strip() for dc in value),
        attribute.name,
        f"must name one or more datacenters, got {value!r}",
    )


TASK_LOCAL: Final = "/local"
"""Where a ``docker`` or ``exec`` task sees its own ``local`` directory (Nomad's layout)."""
ENVIRONMENTS_DIR: Final = "local/environments"
"""Where the job's artifacts land, relative to the task directory."""
_ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)*$")
_VOLUME = "trajcore-image-cache"


@attrs.frozen(kw_only=True)
class EnvironmentArtifact:
    """A task environment that Nomad fetches into every allocation before its slot server
    starts (the task's ``artifact`` block): an OCI archive or layout the env then names under
    ``/local/environments/`` (``path``).

    Attributes:
        source: What Nomad's go-getter fetches: a URL (``https://host/task-17.tar``,
            ``s3::https://...``, ``git::...``) or an absolute path on the client.
        destination: Its name under the task's ``local/environments/`` (``task-17.tar``;
            letters, digits, ``_``, ``.``, ``-`` and ``/`` between names).
        unpack: ``False`` (the default): the file is placed as it is (``GetterMode`` ``file``,
            go-getter's ``archive=false``): name it ``oci-archive:/local/environments/<name>``.
            ``True``: go-getter unpacks the archive into the folder ``destination``
            (``GetterMode`` ``dir``; a folder source is copied): an OCI layout, named
            ``oci:/local/environments/<name>``.
        checksum: ``sha256:<hex>`` (any of go-getter's ``type:value``), checked by Nomad before
            the task starts (a mismatch fails the allocation).
    """

    source: str
    destination: str = attrs.field(
        validator=_matches(_ARTIFACT_NAME, "a relative name of letters, digits, '_', '.', '-'")
    )
    unpack: bool = attrs.field(default=False, validator=flag)
    checksum: str | None = attrs.field(default=None, validator=optional_text)

    def __attrs_post_init__(self) -> None:
        _check(
            bool(str(self.source).strip()),
            "source",
            f"must name what Nomad fetches (a URL or a path on the client), got {self.source!r}",
        )
        _check(
            ".." not in self.destination.split("/"),
            "destination",
            f"must stay under {ENVIRONMENTS_DIR}, got {self.destination!r}",
        )
        if self.checksum is not None:
            kind, colon, value = self.checksum.partition(":")
            _check(
                bool(colon and kind and value and not any(c.isspace() for c in self.checksum)),
                "checksum",
                f"must be type:value (sha256:<hex>), got {self.checksum!r}",
            )

    @property
    def path(self) -> str:
        """Where a ``docker`` or ``exec`` task finds it (``/local/environments/<name>``)."""
        return f"{TASK_LOCAL}/environments/{self.destination}"

    def artifact_json(self) -> JSONObject:
        """The ``TaskArtifact`` Nomad's API takes."""
        options: JSONObject = {} if self.unpack else {"archive": "false"}
        if self.checksum is not None:
            options["checksum"] = self.checksum
        return {
            "GetterSource": self.source,
            "RelativeDest": f"{ENVIRONMENTS_DIR}/{self.destination}",
            "GetterMode": "dir" if self.unpack else "file",
            "GetterOptions": options,
        }


def _artifacts(value: object) -> tuple[EnvironmentArtifact, ...]:
    if isinstance(value, EnvironmentArtifact):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(value)
    raise ConfigError("artifacts", f"expected EnvironmentArtifact values, got {value!r}")


def _client_dir(_: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None:
        _check(
            isinstance(value, str) and value.startswith("/") and "\0" not in value,
            attribute.name,
            f"must be None or an absolute path on the clients, got {value!r}",
        )


def _cache_dir(_: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None:
        _check(
            isinstance(value, str)
            and value.startswith(("/", "${NOMAD_"))
            and not any(c.isspace() or c in ",:" for c in value),
            attribute.name,
            f"must be None or an absolute path as the task sees it (or one under "
            f"${{NOMAD_ALLOC_DIR}}), without spaces, ',' or ':', got {value!r}",
        )


@attrs.frozen(kw_only=True)
class NomadJobSettings:
    """The slot servers' Nomad job as an operator sets it: what Nomad runs and where.

    The pool's settings (``NomadPoolConfig``) hold this value beside the slot servers' own
    settings (``SlotServerSettings``); a ``NomadJobSpec`` holds both, the count and the token.
    Each field is also the env's flag ``--env.nomad_<field>`` (its default and this entry as
    help; ``sandbox_settings.JOB_SECTIONS``): a setting added here needs nothing else.

    Attributes:
        job_id: The job's ID (and name): letters, digits, ``_``, ``.``, ``-``; at most 128.
        driver: ``docker``, ``exec`` or ``raw_exec``.
        image: The docker image holding trajcore (docker only; ignored by the others).
        command: The slot server program and its subcommand, e.g. ``("trajcore",
            "slot-server")`` or ``"/opt/venv/bin/python -m trajcore.entrypoints.slot_server"``
            (a string is split on whitespace).
        token_env: The task environment variable that carries the bearer token to the server.
        privileged: Run the docker container privileged. Not needed: the container gets what
            bubblewrap needs without it (``DOCKER_SECURITY_OPTS``, the module doc); kept for
            clusters that require it.
        nofile_limit, nproc_limit: The docker container's open-file and process limits (soft
            and hard); the slot server refuses to start without room for its slots.
        datacenters: Where Nomad may place the allocations (a string is split on commas).
        namespace, region: Nomad namespace and region (``None``: the agent's defaults).
        group, task: Names of the task group and the task.
        cpu_mhz, memory_mb, disk_mb: What each allocation reserves (``memory_mb`` ``None``:
            512 MB plus 256 MB per slot, ``NomadJobSpec.reserved_memory_mb``; the disk must
            hold the task's logs, 20 MB, and more: Nomad refuses the job otherwise).
        restart_attempts, restart_delay_s: In-place restarts of a dead slot server before its
            allocation fails (0: none, the allocation is replaced instead).
        reschedule_delay_s, reschedule_max_delay_s: Delay before a failed allocation is
            replaced, growing exponentially up to the maximum (``None``: the larger of 60 s
            and the delay); unlimited attempts.
        kill_timeout_s: Grace between SIGTERM and SIGKILL when Nomad stops a slot server, at
            least 1 s. The server is told to end itself (``--stop-deadline``) ``STOP_MARGIN_S``
            before it, so its sandboxes end with it however late its close runs.
        image_cache_dir: The slot servers' image cache (``--image-cache``), as the task sees
            it: leases may then run over task environments (docs/environments.md). ``None``
            (the default): none, and a lease naming an environment is refused saying to set
            it. A ``raw_exec`` task reads the client's own path (shared by the node's
            allocations); a ``docker`` or ``exec`` task mounts ``image_cache_volume`` there,
            or keeps a cache of its own inside its file system.
        image_cache_bytes: The cache's size limit (``--image-cache-bytes``).
        image_cache_volume: A Nomad host volume (the client's ``host_volume`` block) mounted
            read-write at ``image_cache_dir`` in ``docker`` and ``exec`` tasks, so the node's
            allocations share one cache. Not for ``raw_exec``.
        artifacts: Task environments Nomad fetches into every allocation before its server
            starts (``EnvironmentArtifact``: the task's ``artifact`` blocks), named by the env
            under ``/local/environments/``.
        client_alloc_dir: ``raw_exec`` only: the clients' allocation directory
            (``<data_dir>/alloc``). A ``raw_exec`` task sees the client's file system, not
            ``/local``: a reference under ``/local/`` is read in the allocation's own task
            directory, ``<client_alloc_dir>/<allocation id>/<task>/local/``.
    """

    job_id: str = attrs.field(
        default="trajcore-slots",
        validator=_matches(_JOB_ID, "letters, digits, '_', '.' or '-' (at most 128)"),
    )
    driver: Driver = attrs.field(default="docker")
    image: str = "trajcore/slot-server:latest"
    command: tuple[str, ...] = attrs.field(
        default=("trajcore", "slot-server"), converter=command_words, validator=_nonempty_words
    )
    token_env: str = attrs.field(
        default="TRAJCORE_SLOT_TOKEN",
        validator=_matches(_ENV_NAME, "an environment variable name"),
    )
    privileged: bool = attrs.field(default=False, validator=flag)
    nofile_limit: int = attrs.field(default=16384, validator=whole_number(64))
    nproc_limit: int = attrs.field(default=16384, validator=whole_number(64))
    datacenters: tuple[str, ...] = attrs.field(
        default=("dc1",), converter=_names, validator=_datacenters
    )
    namespace: str | None = attrs.field(default=None, validator=_optional_name)
    region: str | None = attrs.field(default=None, validator=_optional_name)
    group: str = attrs.field(default="slots", validator=_matches(_NAME, "a name"))
    task: str = attrs.field(default="slot-server", validator=_matches(_NAME, "a name"))
    cpu_mhz: int = attrs.field(default=1000, validator=whole_number(1))
    memory_mb: int | None = attrs.field(default=None, validator=optional(whole_number(10)))
    disk_mb: int = attrs.field(default=1024, validator=whole_number(_LOG_MB + 1))
    restart_attempts: int = attrs.field(default=0, validator=whole_number(0))
    restart_delay_s: float = attrs.field(
        default=1.0, validator=finite_number(None, at_least=0.0, unit="seconds")
    )
    reschedule_delay_s: float = attrs.field(
        default=5.0, validator=finite_number(None, at_least=_MIN_RESCHEDULE_DELAY_S, unit="seconds")
    )
    reschedule_max_delay_s: float | None = attrs.field(
        default=None,
        validator=optional(finite_number(None, at_least=_MIN_RESCHEDULE_DELAY_S, unit="seconds")),
    )
    kill_timeout_s: float = attrs.field(
        default=10.0, validator=finite_number(None, at_least=0.0, unit="seconds")
    )
    image_cache_dir: str | None = attrs.field(default=None, validator=_cache_dir)
    image_cache_bytes: int = attrs.field(default=32 << 30, validator=whole_number(1))
    image_cache_volume: str | None = attrs.field(default=None, validator=_optional_name)
    artifacts: tuple[EnvironmentArtifact, ...] = attrs.field(default=(), converter=_artifacts)
    client_alloc_dir: str | None = attrs.field(default=None, validator=_client_dir)

    def __attrs_post_init__(self) -> None:
        self._check_environments()
        _check(
            self.driver in DRIVERS,
            "driver",
            f"must be one of {', '.join(DRIVERS)}, got {self.driver!r}",
        )
        if self.driver == "docker":
            _check(
                bool(self.image.strip()) and not any(c.isspace() for c in self.image),
                "image",
                f"the docker driver needs an image name, got {self.image!r}",
            )
        _check(
            not self.privileged or self.driver == "docker",
            "privileged",
            f"only the docker driver runs containers privileged; {self.driver} tasks run as the "
            "Nomad client's user",
        )
        _check(
            self.max_reschedule_delay_s >= self.reschedule_delay_s,
            "reschedule_max_delay_s",
            f"must be >= reschedule_delay_s ({self.reschedule_delay_s}), "
            f"got {self.reschedule_max_delay_s}",
        )
        _check(
            self.restart_attempts * self.restart_delay_s < _RESTART_INTERVAL_S,
            "restart_attempts",
            f"{self.restart_attempts} restarts {self.restart_delay_s} s apart do not fit in "
            f"Nomad's restart interval of {_RESTART_INTERVAL_S} s",
        )
        _check(
            self.kill_timeout_s >= _MIN_KILL_TIMEOUT_S,
            "kill_timeout_s",
            f"must be at least {_MIN_KILL_TIMEOUT_S} s: the slot server ends its sandboxes "
            f"within it before Nomad's SIGKILL, got {self.kill_timeout_s}",
        )

    def stop_deadline_s(self) -> float:
        """The slot server's ``--stop-deadline``: ``STOP_MARGIN_S`` before Nomad's SIGKILL."""
        return self.kill_timeout_s - STOP_MARGIN_S

    def _check_environments(self) -> None:
        for artifact in self.artifacts:
            _check(
                isinstance(artifact, EnvironmentArtifact),
                "artifacts",
                f"expected EnvironmentArtifact values, got {artifact!r}",
            )
        cache = self.image_cache_dir is not None
        _check(
            cache or not (self.artifacts or self.image_cache_volume),
            "image_cache_dir",
            "artifacts and image_cache_volume are task environments: set image_cache_dir",
        )
        _check(
            self.image_cache_volume is None or self.driver != "raw_exec",
            "image_cache_volume",
            "raw_exec tasks run on the client's own file system and mount no volume: name "
            "the client's path in image_cache_dir",
        )
        _check(
            self.client_alloc_dir is None or self.driver == "raw_exec",
            "client_alloc_dir",
            f"only raw_exec tasks read the client's paths; {self.driver} tasks see /local",
        )
        names = [a.destination for a in self.artifacts]
        for name in names:
            _check(
                not any(o != name and o.startswith(f"{name}/") for o in names)
                and names.count(name) == 1,
                "artifacts",
                f"two artifacts land at {ENVIRONMENTS_DIR}/{name} (or one inside the other)",
            )

    def task_reference(self, environment: str, alloc_id: str) -> str:
        """``environment`` as the allocation ``alloc_id``'s slot server reads it: a path under
        ``/local/`` of a ``raw_exec`` task is its own task directory on the client
        (``client_alloc_dir``); any other reference as it is. Needs a well-formed reference
        (``check_environment``); ``environment`` itself when it is not."""
        if self.driver != "raw_exec" or self.client_alloc_dir is None:
            return environment
        try:
            ref = parse_environment_ref(environment)
        except TaskEnvironmentError:
            return environment
        if not ref.location.startswith(f"{TASK_LOCAL}/"):
            return environment
        task_dir = f"{self.client_alloc_dir.rstrip('/')}/{alloc_id}/{self.task}"
        return str(attrs.evolve(ref, location=task_dir + ref.location))

    def reference_refusal(self, environment: str) -> tuple[str, str] | None:
        """Why no allocation of this job can run ``environment`` (the field at fault and the
        reason), known before a lease: a path under ``/local/environments/`` that no artifact
        places, or one under ``/local/`` that a ``raw_exec`` task cannot find without
        ``client_alloc_dir``; ``None`` otherwise."""
        try:
            location = parse_environment_ref(environment).location
        except TaskEnvironmentError:
            return None
        if not location.startswith(f"{TASK_LOCAL}/"):
            return None
        if location.startswith(f"{TASK_LOCAL}/environments/"):
            placed = [a.path for a in self.artifacts]
            if not any(location == p or location.startswith(f"{p}/") for p in placed):
                where = ", ".join(placed) or "nothing"
                return (
                    "artifacts",
                    f"no artifact of the Nomad job {self.job_id} places {location} (its "
                    f"artifacts place {where}; NomadJobSettings.artifacts)",
                )
        if self.driver == "raw_exec" and self.client_alloc_dir is None:
            return (
                "client_alloc_dir",
                f"a raw_exec task reads {location} in its own task directory on the client: "
                "set NomadJobSettings.client_alloc_dir to the clients' <data_dir>/alloc",
            )
        return None

    @property
    def max_reschedule_delay_s(self) -> float:
        """The reschedule delay's ceiling: ``reschedule_max_delay_s`` or max(60 s, the delay)."""
        if self.reschedule_max_delay_s is not None:
            return self.reschedule_max_delay_s
        return max(60.0, self.reschedule_delay_s)


@attrs.frozen(kw_only=True)
class NomadJobSpec:
    """Everything the slot servers' Nomad job is built from: the job's settings, what each slot
    server is told (its slots and isolation, of ``server``), the count and the token.

    Attributes:
        job: The job as the operator sets it (``NomadJobSettings``).
        server: The slot servers' settings (``SlotServerSettings``): the job passes their
            slots and isolation on each server's command line.
        count: Allocations (containers) to run.
        token: The slot servers' bearer token (at least 16 printable ASCII characters).
    """

    job: NomadJobSettings = attrs.field(validator=instance_of(NomadJobSettings))
    server: SlotServerSettings = attrs.field(validator=instance_of(SlotServerSettings))
    count: int = attrs.field(validator=whole_number(0))
    token: str = attrs.field(
        repr=False, validator=_matches(_TOKEN, "16 to 512 printable ASCII characters")
    )

    @property
    def reserved_memory_mb(self) -> int:
        """The memory each allocation reserves: ``memory_mb``, or 512 MB plus 256 MB a slot."""
        if self.job.memory_mb is not None:
            return self.job.memory_mb
        return 512 + 256 * self.server.slots_per_container

    def listen_address(self) -> str:
        """What the slot server listens on, as Nomad interpolates it in the task's arguments."""
        if self.job.driver == "docker":
            return f"0.0.0.0:${{NOMAD_PORT_{PORT_LABEL}}}"
        return f"${{NOMAD_IP_{PORT_LABEL}}}:${{NOMAD_PORT_{PORT_LABEL}}}"

    def server_args(self) -> list[str]:
        """The words after ``command``: slots, root, listen address, token variable, isolation."""
        return [
            "--slots", str(self.server.slots_per_container),
            "--root", "${NOMAD_TASK_DIR}/slots",
            "--listen", self.listen_address(),
            "--token-env", self.job.token_env,
            "--stop-deadline", repr(self.job.stop_deadline_s()),
            # allocations on one host share its uids: each takes its own block of slot uids
            "--slot-uid-block", "${NOMAD_ALLOC_INDEX}",
            *isolation_argv(self.server.isolation),
            *self.image_cache_args(),
        ]  # fmt: skip

    def image_cache_args(self) -> list[str]:
        """The slot server's image-cache flags (none without ``image_cache_dir``)."""
        if self.job.image_cache_dir is None:
            return []
        cache, size = self.job.image_cache_dir, str(self.job.image_cache_bytes)
        return ["--image-cache", cache, "--image-cache-bytes", size]


def _ns(seconds: float) -> int:
    return round(seconds * _NS)


def _task_config(spec: NomadJobSpec) -> JSONObject:
    args: list[JSON] = list(spec.server_args())
    job = spec.job
    if job.driver == "docker":
        config: JSONObject = {
            "image": job.image,
            "entrypoint": list(job.command),
            "args": args,
            "ports": [PORT_LABEL],
            "privileged": job.privileged,
            "ulimit": {
                "nofile": f"{job.nofile_limit}:{job.nofile_limit}",
                "nproc": f"{job.nproc_limit}:{job.nproc_limit}",
            },
        }
        if not job.privileged:
            config["security_opt"] = list(DOCKER_SECURITY_OPTS)
        return config
    command, *rest = job.command
    return {"command": command, "args": [*rest, *args]}


def job_json(spec: NomadJobSpec) -> JSONObject:
    """The ``Job`` object that registers ``spec`` with Nomad (see the module doc)."""
    settings = spec.job
    task: JSONObject = {
        "Name": settings.task,
        "Driver": settings.driver,
        "Config": _task_config(spec),
        "Env": {settings.token_env: spec.token},
        "Resources": {"CPU": settings.cpu_mhz, "MemoryMB": spec.reserved_memory_mb},
        "KillSignal": "SIGTERM",
        "KillTimeout": _ns(settings.kill_timeout_s),
        "LogConfig": {"MaxFiles": _LOG_FILES, "MaxFileSizeMB": _LOG_FILE_MB},
        "Meta": {"trajcore-role": "slot-server"},
    }
    if settings.artifacts:
        task["Artifacts"] = [artifact.artifact_json() for artifact in settings.artifacts]
    if settings.image_cache_volume is not None and settings.image_cache_dir is not None:
        task["VolumeMounts"] = [
            {"Volume": _VOLUME, "Destination": settings.image_cache_dir, "ReadOnly": False}
        ]
    group: JSONObject = {
        "Name": settings.group,
        "Count": spec.count,
        "Networks": [{"Mode": "host", "DynamicPorts": [{"Label": PORT_LABEL}]}],
        "RestartPolicy": {
            "Attempts": settings.restart_attempts,
            "Delay": _ns(settings.restart_delay_s),
            "Interval": _ns(_RESTART_INTERVAL_S),
            "Mode": "fail",
        },
        "ReschedulePolicy": {
            "Unlimited": True,
            "Attempts": 0,
            "Interval": 0,
            "Delay": _ns(settings.reschedule_delay_s),
            "DelayFunction": "exponential",
            "MaxDelay": _ns(settings.max_reschedule_delay_s),
        },
        "EphemeralDisk": {"SizeMB": settings.disk_mb},
        "Services": [
            {
                "Name": SERVICE_NAME,
                "PortLabel": PORT_LABEL,
                "Provider": "nomad",
                "Checks": [
                    {
                        "Name": "slot-server-port",
                        "Type": "tcp",
                        "PortLabel": PORT_LABEL,
                        "Interval": _ns(_CHECK_INTERVAL_S),
                        "Timeout": _ns(_CHECK_TIMEOUT_S),
                    }
                ],
            }
        ],
        "Update": {"MaxParallel": 0},
        "Tasks": [task],
    }
    if settings.image_cache_volume is not None:
        group["Volumes"] = {
            _VOLUME: {
                "Name": _VOLUME,
                "Type": "host",
                "Source": settings.image_cache_volume,
                "ReadOnly": False,
            }
        }
    job: JSONObject = {
        "ID": settings.job_id,
        "Name": settings.job_id,
        "Type": "service",
        "Datacenters": list(settings.datacenters),
        "Meta": {
            "trajcore-role": "slot-servers",
            "trajcore-slots-per-container": str(spec.server.slots_per_container),
        },
        "TaskGroups": [group],
    }
    if settings.namespace is not None:
        job["Namespace"] = settings.namespace
    if settings.region is not None:
        job["Region"] = settings.region
    return job


def register_request(spec: NomadJobSpec) -> JSONObject:
    """The body of ``POST /v1/job/{job_id}``: a ``JobRegisterRequest`` holding ``job_json``."""
    return {"Job": job_json(spec)}


def scale_request(group: str, count: int, message: str) -> JSONObject:
    """The body of ``POST /v1/job/{job_id}/scale``: a ``ScalingRequest`` for ``group``.

    Raises:
        ConfigError: ``count`` is negative or not an integer.
    """
    given: object = count
    _check(
        not isinstance(given, bool) and isinstance(given, int) and given >= 0,
        "count",
        f"must be an integer >= 0, got {count!r}",
    )
    return {"Count": count, "Target": {"Group": group}, "Message": message}
