"""Slot servers as Slurm batch jobs: the job, the commands, and what Slurm's answers mean.

The Slurm pool runs each slot server as one batch job and reads the queue back through the
Slurm command line (``sbatch``, ``squeue``, ``scancel``, ``scontrol``). Everything it decides
without I/O lives here: the job script and the ``sbatch`` words of one job, the ``squeue``
listing parsed into ``SlurmJob`` values, what each Slurm job state means to the pool's
reconciler (``trajcore.domain.nomad_reconcile``, which the Slurm pool shares with the Nomad
pool), the address a job reports when its server is ready, and which jobs to submit or cancel
for a count of servers (``plan_jobs``).

Rules it keeps:

- Every job of one pool carries the pool's job name and a comment ``trajcore:<run>:<index>``;
  ``run`` is drawn afresh by every pool start, so a pool never joins another run's job. Two
  pools may share a name (a training run and an eval run of one user), so another run's jobs
  are cancelled only once that run is proved dead: the heartbeat every pool touches in its run
  directory has gone stale while this pool could poll (``dead_runs``). A pool cancels its own
  run's jobs and no others.
- The job script holds no secret: the bearer token stays in a file only its owner reads, named
  on the server's command line; the script and the words are what ``scontrol show job`` shows.
- A job Slurm ends (``scancel``, time limit, node failure, preemption) gets SIGTERM in every
  process, the slot's own commands included, so a call in flight could finish early and be
  answered as if it had run. The job script kills the server outright on that signal instead of
  letting it close gracefully, so such a call ends without an answer (``INFRA_ERROR``). The
  server's own SIGTERM handling races the script's kill; the tests find the kill first.
- Bad answers raise ``InvalidInput`` naming what was read and why; nothing is guessed.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from trajcore.domain.converters import command_words
from trajcore.domain.errors import ConfigError, InvalidInput
from trajcore.domain.isolation import check_slot_uid_range
from trajcore.domain.slot_server_flags import isolation_argv
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.validators import (
    optional_positive_int,
    optional_text,
    positive_int,
    whole_number,
)

__all__ = [
    "JOB_STATES",
    "JobPlan",
    "SlurmJob",
    "SlurmJobSettings",
    "dead_runs",
    "job_script",
    "parse_node_address",
    "parse_ready",
    "parse_squeue",
    "parse_time_left",
    "plan_jobs",
    "sbatch_argv",
    "sbatch_refusal",
    "scancel_argv",
    "squeue_argv",
    "watch_start",
]

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_WORD = re.compile(r"^[A-Za-z0-9_.,:=+@\-/\[\]|&!()*]{1,256}$")
_RUN = re.compile(r"^[a-z0-9]{1,32}$")
SQUEUE_FORMAT: Final = "%i|%T|%L|%B|%k"
"""``squeue -o``: job ID, state, time left, batch host, comment (last: it may hold ``|``)."""

JOB_STATES: Final[dict[str, str]] = {
    # what a Slurm job state is to the reconciler (Nomad's client statuses)
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_HOLD": "pending",
    "REQUEUE_FED": "pending",
    "RESV_DEL_HOLD": "pending",
    "RESIZING": "pending",
    "SIGNALING": "running",
    "STAGE_OUT": "complete",
    "RUNNING": "running",
    "COMPLETING": "complete",
    "COMPLETED": "complete",
    "CANCELLED": "complete",
    "SPECIAL_EXIT": "failed",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed",
    "DEADLINE": "failed",
    # its server stopped with it, or its node is gone: lost, never scored
    "SUSPENDED": "lost",
    "STOPPED": "lost",
    "PREEMPTED": "lost",
    "NODE_FAIL": "lost",
    "REVOKED": "lost",
}
"""Each Slurm job state as a Nomad client status; a state not listed is ``lost``."""

_LIVE: Final = frozenset({"pending", "running"})


def _name(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise ConfigError(
            attribute.name, f"must be 1-64 letters, digits, '_', '.' or '-', got {value!r}"
        )


def _optional_word(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, str) or _WORD.fullmatch(value) is None):
        raise ConfigError(attribute.name, f"must be one Slurm word without spaces, got {value!r}")


def _words(_: object, attribute: attrs.Attribute[tuple[str, ...]], value: object) -> None:
    if not isinstance(value, tuple) or not all(
        isinstance(w, str) and w.startswith("--") and "\n" not in w for w in value
    ):
        raise ConfigError(attribute.name, f"must be sbatch options (--name=value), got {value!r}")


def _options(value: str | Iterable[str]) -> tuple[str, ...]:
    """Options as words: a string split on whitespace, or a sequence's items as they are."""
    return tuple(value.split()) if isinstance(value, str) else tuple(value)


def _nonempty_words(_: object, attribute: attrs.Attribute[tuple[str, ...]], value: object) -> None:
    if not value:
        raise ConfigError(attribute.name, "must name the slot server program")


@attrs.frozen(kw_only=True)
class SlurmJobSettings:
    """One slot server's batch job as an operator sets it. The pool's settings
    (``SlurmPoolConfig``) hold it beside the slot servers' settings (``SlotServerSettings``);
    ``sbatch_argv`` adds their slots and isolation, the run and the index. Each field is also
    the env's flag ``--env.slurm_<field>`` (``sandbox_settings.JOB_SECTIONS``).

    Attributes:
        job_name: The name of every job of the pool (``squeue --name``); other pools may share it.
        command: The slot server program as the node runs it, e.g. ``"/opt/venv/bin/python -m
            trajcore.entrypoints.slot_server"`` (a string is split on whitespace); it must exist
            at that path on every node.
        cpus_per_task: ``--cpus-per-task``.
        memory_mb: ``--mem`` in MB (``None``: 512 MB plus 256 MB per slot, ``memory``).
        time_limit_min: ``--time`` in minutes; the pool drains a job before it.
        partition, account, qos, constraint: ``--partition``, ``--account``, ``--qos``,
            ``--constraint`` (``None``: the cluster's defaults).
        extra_options: More ``sbatch`` options, each one word ``--name=value`` (a string is
            split on whitespace).
        bind_host: The address the server listens on, on its node (``0.0.0.0``: every one).
        workspace_dir: Where on the node the server keeps its slots (``None``:
            ``$TMPDIR``, else ``/tmp``), in a directory of the job's own, removed at its end.
    """

    job_name: str = attrs.field(default="trajcore-slots", validator=_name)
    command: tuple[str, ...] = attrs.field(
        default=("trajcore", "slot-server"), converter=command_words, validator=_nonempty_words
    )
    cpus_per_task: int = attrs.field(default=1, validator=positive_int)
    memory_mb: int | None = attrs.field(default=None, validator=optional_positive_int)
    time_limit_min: int = attrs.field(default=240, validator=whole_number(1))
    partition: str | None = attrs.field(default=None, validator=_optional_word)
    account: str | None = attrs.field(default=None, validator=_optional_word)
    qos: str | None = attrs.field(default=None, validator=_optional_word)
    constraint: str | None = attrs.field(default=None, validator=_optional_word)
    extra_options: tuple[str, ...] = attrs.field(default=(), converter=_options, validator=_words)
    bind_host: str = attrs.field(default="0.0.0.0", validator=_optional_word)  # noqa: S104
    workspace_dir: str | None = attrs.field(default=None, validator=optional_text)

    def memory(self, slots_per_container: int) -> int:
        """``--mem`` in MB for a server of ``slots_per_container`` slots."""
        return self.memory_mb or 512 + 256 * slots_per_container


def job_script(settings: SlurmJobSettings) -> str:
    """The batch script every job of the pool runs: ``script DIR COMMAND...``.

    It runs ``COMMAND`` with ``--root`` (a directory of the job's own on the node) and
    ``--listen``, puts the server's ready line whole in ``DIR/<job id>.ready`` (where the pool
    reads it), kills the server when Slurm signals the job, and removes the directory after,
    writable first (a slot may have made a directory of it read-only, ``chmod -w``; symbolic
    links are not followed).
    """
    root = settings.workspace_dir
    base = '"${TMPDIR:-/tmp}"' if root is None else shlex.quote(root)
    listen = shlex.quote(f"{settings.bind_host}:0")
    return f"""#!/bin/sh
# trajcore slot server (one per job); the pool reads its ready line from "$1/<job id>.ready"
ready=$1/$SLURM_JOB_ID.ready; shift
root={base}/trajcore-slots-"$SLURM_JOB_ID"
mkdir -p "$root" || exit 1
"$@" --root "$root/slots" --listen {listen} > "$ready.part" &
server=$!
# Slurm signals every process of the job at once, the slot's own commands too: the server is
# killed outright, so that no call a signal cut short is answered as if it had run
trap 'kill -KILL "$server" 2>/dev/null' TERM INT
# the ready line is moved into place whole, so the pool never reads half of it
( while kill -0 "$server" 2>/dev/null; do
    if [ -s "$ready.part" ]; then mv -f "$ready.part" "$ready"; break; fi; sleep 0.1
  done ) &
wait "$server"; status=$?
# a trapped signal ends the first wait early: wait for the server itself
while kill -0 "$server" 2>/dev/null; do wait "$server"; status=$?; done
# a killed server removed nothing: a slot may have left a directory its owner may not write
chmod -R u+rwX "$root" 2>/dev/null; rm -rf "$root"
exit "$status"
"""


def sbatch_argv(
    settings: SlurmJobSettings,
    *,
    server: SlotServerSettings,
    script: str,
    run_dir: str,
    run: str,
    index: int,
    uid_base: int,
    token_file: str,
) -> list[str]:
    """The ``sbatch`` words that submit server ``index`` of run ``run`` (``--parsable``: it
    prints the job ID), a slot server told ``server``'s slots and isolation. ``uid_base`` is
    the first slot uid of this job's server."""
    slots_per_container = server.slots_per_container
    if _RUN.fullmatch(run) is None:
        raise InvalidInput("run", f"must be 1-32 lowercase letters or digits, got {run!r}")
    check_slot_uid_range("uid_base", uid_base, slots_per_container)
    words = [
        "sbatch", "--parsable", f"--job-name={settings.job_name}",
        f"--comment=trajcore:{run}:{index}", "--nodes=1", "--ntasks=1",
        f"--cpus-per-task={settings.cpus_per_task}",
        f"--mem={settings.memory(slots_per_container)}",
        f"--time={settings.time_limit_min}", "--no-requeue", "--export=NONE",
        f"--output={run_dir}/%j.log", f"--chdir={run_dir}",
    ]  # fmt: skip
    for option, value in (
        ("partition", settings.partition),
        ("account", settings.account),
        ("qos", settings.qos),
        ("constraint", settings.constraint),
    ):
        if value is not None:
            words.append(f"--{option}={value}")
    words.extend(settings.extra_options)
    isolation = attrs.evolve(server.isolation, slot_uid_base=uid_base)
    command = [
        *settings.command, "--slots", str(slots_per_container),
        "--token-file", token_file, *isolation_argv(isolation),
    ]  # fmt: skip
    return [*words, script, run_dir, *command]


_REFUSALS: Final = (
    # sbatch's words for a job it will never take, first match wins -> the env field
    # (SlurmJobSettings field; "job": the settings as a whole). Whole phrases only: "account"
    # alone would match "accounting" in a QOS submit limit, which is transient.
    ("invalid account or account/partition combination specified", "account"),
    ("invalid qos specification", "qos"),
    ("invalid partition name specified", "partition"),
    ("invalid partition specified", "partition"),  # "invalid partition specified: gpu"
    ("invalid feature specification", "constraint"),
    ("memory specification can not be satisfied", "memory_mb"),
    ("memory required by task is not available", "memory_mb"),
    ("requested time limit is invalid", "time_limit_min"),
    ("requested time limit exceeds partition limit", "time_limit_min"),
    ("requested node configuration is not available", "job"),
    ("access/permission denied", "job"),
)


def sbatch_refusal(text: str) -> ConfigError | None:
    """The error for an ``sbatch`` that refused the pool's first job (``text``: what it
    printed) when its words are a known refusal of the job's settings: the ``slurm_<field>``
    setting they name (account, QOS, partition, constraint, memory, time limit), else
    ``slurm_job`` (the job settings as a whole, e.g. a node configuration no node has), with
    sbatch's own words. ``None`` for any other refusal (a timeout, ``Resource temporarily
    unavailable``, a QOS limit on submitted jobs): it may pass, so it is retried."""
    said = " ".join(text.split())
    lowered = said.lower()
    field = next((f for phrase, f in _REFUSALS if phrase in lowered), None)
    if field is None:
        return None
    return ConfigError(f"slurm_{field}", f"sbatch refused the job: {said[:500]}")


def squeue_argv(job_name: str) -> list[str]:
    """``squeue`` words that list every job (any state) of ``job_name`` owned by the caller."""
    return ["squeue", "--me", f"--name={job_name}", "--states=all", "--noheader",
            f"--format={SQUEUE_FORMAT}"]  # fmt: skip


def scancel_argv(job_ids: Iterable[str] = (), *, job_name: str | None = None) -> list[str]:
    """``scancel`` words for ``job_ids``, or for every job of ``job_name`` the caller owns."""
    ids = list(job_ids)
    if job_name is not None:
        return ["scancel", "--me", f"--name={job_name}", *ids]
    return ["scancel", *ids]


# ============================================================================ answers


@attrs.frozen(kw_only=True)
class SlurmJob:
    """One job of the pool's name as ``squeue`` lists it.

    Attributes:
        job_id: Slurm's job ID.
        state: Slurm's job state (``RUNNING``, ``NODE_FAIL``, ...).
        time_left_s: Seconds before its time limit (``None``: none, or not known).
        node: Its batch host (``None`` while it has none).
        run: The pool run that submitted it (from its comment; ``None``: not trajcore's).
        index: Its server index in that run (``-1`` when ``run`` is ``None``).
    """

    job_id: str
    state: str
    time_left_s: float | None
    node: str | None
    run: str | None
    index: int

    @property
    def client_status(self) -> str:
        """The state as the reconciler's client status (``JOB_STATES``)."""
        return JOB_STATES.get(self.state, "lost")

    @property
    def live(self) -> bool:
        """Pending or running: it holds (or will hold) a place in the cluster."""
        return self.client_status in _LIVE


_TIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")


def parse_time_left(text: str) -> float | None:
    """``squeue %L`` (``[days-][hours:]minutes:seconds``) in seconds; ``None`` for
    ``UNLIMITED``, ``NOT_SET`` or ``INVALID``. Raises ``InvalidInput`` naming ``time_left``."""
    text = text.strip()
    if text in {"UNLIMITED", "NOT_SET", "INVALID", ""}:
        return None
    found = _TIME.fullmatch(text)
    if found is None:
        raise InvalidInput("time_left", f"not [days-][hours:]minutes:seconds: {text!r}")
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_squeue(text: str) -> list[SlurmJob]:
    """The jobs of an ``squeue_argv`` listing. Raises ``InvalidInput`` naming ``squeue`` and the
    line that is not ``SQUEUE_FORMAT``."""
    jobs: list[SlurmJob] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|", 4)
        if len(parts) != 5 or not parts[0].strip():
            raise InvalidInput("squeue", f"expected {SQUEUE_FORMAT!r}, got {line!r}")
        job_id, state, left, node, comment = (part.strip() for part in parts)
        state = state.split()[0].rstrip("+") if state else ""
        run: str | None = None
        index = -1
        tag = comment.split(":")
        if len(tag) == 3 and tag[0] == "trajcore" and _RUN.fullmatch(tag[1]) and tag[2].isdigit():
            run, index = tag[1], int(tag[2])
        jobs.append(
            SlurmJob(
                job_id=job_id,
                state=state,
                time_left_s=parse_time_left(left),
                node=None if node in {"", "(null)", "n/a"} else node,
                run=run,
                index=index,
            )
        )
    return jobs


def parse_ready(text: str) -> int | None:
    """The port in a slot server's ready line (``None`` while the line is incomplete).
    Raises ``InvalidInput`` naming ``ready`` when the line is not a ready line."""
    line, newline, _ = text.partition("\n")
    if not newline:
        return None
    try:
        ready = json.loads(line)
    except json.JSONDecodeError:
        raise InvalidInput("ready", f"not a JSON line: {line[:200]!r}") from None
    address = ready.get("address") if isinstance(ready, dict) else None
    if (
        not isinstance(ready, dict)
        or ready.get("ready") is not True
        or not isinstance(address, str)
    ):
        raise InvalidInput("ready", f"not a TCP ready line: {line[:200]!r}")
    port = address.rstrip("/").rpartition(":")[2]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput("ready", f"no port in {address!r}")
    return int(port)


def parse_node_address(text: str) -> str:
    """``NodeAddr`` of an ``scontrol show node -o NAME`` answer (how Slurm reaches the node).
    Raises ``InvalidInput`` naming ``scontrol`` when it is missing."""
    for word in text.split():
        if word.startswith("NodeAddr="):
            address = word.removeprefix("NodeAddr=")
            if address:
                return address
    raise InvalidInput("scontrol", f"no NodeAddr in {text[:200]!r}")


# ============================================================================ planning


@attrs.frozen(kw_only=True)
class JobPlan:
    """Which server indices to submit and which jobs to cancel for one count."""

    submit: tuple[int, ...] = ()
    cancel: tuple[str, ...] = ()


def plan_jobs(
    jobs: Sequence[SlurmJob],
    *,
    run: str,
    count: int,
    stopping: frozenset[str],
    ending_s: float,
    dead_runs: frozenset[str] = frozenset(),
) -> JobPlan:
    """What keeps ``count`` servers of run ``run`` queued or running.

    Every index below ``count`` without a live job of this run (one not in ``stopping``, not
    within ``ending_s`` of its time limit) gets a submission. Cancelled: live jobs of a run in
    ``dead_runs`` (strays of a pool that crashed), live jobs of this run at an index at or above
    ``count``, and a pending job beside another live one on its index (the later IDs first).
    Jobs of any other run, or of none, are another pool's or someone's own: never touched.
    """
    if count < 0:
        raise InvalidInput("count", f"must be >= 0, got {count}")
    cancel: list[str] = []
    serving: dict[int, list[SlurmJob]] = {}
    for job in jobs:
        if not job.live or job.job_id in stopping:
            continue
        if job.run != run:
            if job.run is not None and job.run in dead_runs:
                cancel.append(job.job_id)
            continue
        if job.index >= count:
            cancel.append(job.job_id)
            continue
        if job.time_left_s is not None and job.time_left_s <= ending_s:
            continue
        serving.setdefault(job.index, []).append(job)
    for on_index in serving.values():
        extra = sorted(on_index, key=lambda j: (j.client_status != "running", _id_key(j)))[1:]
        cancel.extend(j.job_id for j in extra if j.client_status == "pending")
    submit = tuple(i for i in range(count) if i not in serving)
    return JobPlan(submit=submit, cancel=tuple(cancel))


def dead_runs(
    jobs: Sequence[SlurmJob],
    *,
    run: str,
    heartbeat_ages: Mapping[str, float],
    stale_after_s: float,
    watched_s: float,
) -> frozenset[str]:
    """The runs other than ``run`` with a live job that are proved dead: their pool's heartbeat
    is older than ``stale_after_s`` (``heartbeat_ages``: seconds since each run's pool last
    touched it). A run whose heartbeat is not known (not in ``heartbeat_ages``: its run
    directory is elsewhere, or gone) may be alive: it is not dead. No run is dead before this
    pool has itself listed the queue and touched its own heartbeat without a break for
    ``stale_after_s`` (``watched_s``, ``watch_start``): after an outage (the Slurm controller
    or the shared file system down, this process paused) a heartbeat is old because nobody
    could poll, not because its pool is gone."""
    if watched_s < stale_after_s:
        return frozenset()
    return frozenset(
        job.run
        for job in jobs
        if job.live
        and job.run is not None
        and job.run != run
        and heartbeat_ages.get(job.run, -math.inf) > stale_after_s
    )


def watch_start(
    since: float | None, last_poll: float | None, now: float, *, max_gap_s: float
) -> float:
    """When this pool's unbroken stretch of good polls began, given one more good poll at
    ``now``: ``since`` (``None``: the last poll failed, or none was good yet) unless the last
    good poll (``last_poll``) is more than ``max_gap_s`` before ``now`` (the pool stood
    still), else ``now``."""
    if since is None or last_poll is None or now - last_poll > max_gap_s:
        return now
    return since


def _id_key(job: SlurmJob) -> tuple[int, str]:
    head = job.job_id.split("_")[0]
    return (int(head) if head.isdigit() else 0, job.job_id)
