"""How the fake Nomad client runs a task: a child process in its own process group.

``raw_exec`` and ``exec`` tasks run this way, on loopback ports. A ``docker`` task runs as a real
container through a container engine's CLI (``podman`` or ``docker``, the ``engine`` words):
``<engine> run --rm --name <name>`` in the foreground, so the child process is the container's
life; its ports published on ``127.0.0.1`` at the same numbers inside and out (as Nomad's docker
driver maps a port without ``to``), Nomad's task, secrets and alloc directories mounted at
``/local``, ``/secrets`` and ``/alloc``, the environment passed through a file in the secrets
directory (the token never appears on a command line), and the task's ``security_opt``,
``ulimit`` and ``privileged`` as the engine spells them (podman says ``unmask=ALL`` where docker
says ``systempaths=unconfined``). ``remove_container`` removes it, whatever state it is in.

The containers do not outlive the fake's process, however it ends (a test run killed by
SIGTERM or SIGKILL included): each carries the container pool's labels (``trajcore.pool``: the
fake's ``container_prefix``; ``trajcore.owner``: this fake, in this process), and a
``ContainerGuard``, the container pool's guard process (``container_guard``), removes every
container with both labels when the fake's process ends without closing it (``--rm`` acts only
when a container exits, and a killed fake's containers never do).

For a child process, the task directory gets Nomad's layout (``local``, ``secrets``, ``tmp``,
``alloc/logs``), templates are rendered into it, ``${NOMAD_*}`` references in the command, its
arguments and ``Env`` are interpolated, and the command's output goes to
``alloc/logs/<task>.stdout.<restart>``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import attrs

from trajcore.adapters.pools.container_guard import LABEL, OWNER_LABEL, guard_argv
from trajcore.adapters.pools.guard_process import GuardProcess
from trajcore.testing.fake_nomad.jobs import ENV_TEMPLATE, Alloc, DockerConfig

__all__ = [
    "ContainerGuard",
    "free_port",
    "interpolate",
    "remove_container",
    "signal_group",
    "start_container",
    "start_task",
    "task_environment",
]

_REF: Final = re.compile(r"\$\{([^}]+)\}")


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _nomad_variables(alloc: Alloc, *, alloc_dir: str, local: str, secrets: str) -> dict[str, str]:
    """Nomad's variables for the task, with its directories as the task sees them.

    ``NOMAD_HOST_IP_<label>`` and ``NOMAD_HOST_ADDR_<label>`` are only given to ``raw_exec``
    tasks (the caller adds them).
    """
    spec = alloc.spec
    env = {
        "NOMAD_ALLOC_ID": alloc.id,
        "NOMAD_ALLOC_NAME": alloc.name,
        "NOMAD_ALLOC_INDEX": str(alloc.index),
        "NOMAD_ALLOC_DIR": alloc_dir,
        "NOMAD_TASK_DIR": local,
        "NOMAD_SECRETS_DIR": secrets,
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
    for label, port in alloc.ports.items():
        env |= {
            f"NOMAD_IP_{label}": "127.0.0.1",
            f"NOMAD_PORT_{label}": str(port),
            f"NOMAD_ADDR_{label}": f"127.0.0.1:{port}",
            f"NOMAD_HOST_PORT_{label}": str(port),
        }
    return env


def _with_task_env(alloc: Alloc, env: dict[str, str]) -> dict[str, str]:
    """``env`` and then the task's ``Env``, with ``${...}`` references interpolated."""
    for key, value in alloc.spec.env:
        env[key] = interpolate(value, env)
    return env


def task_environment(alloc: Alloc, task_dir: Path, alloc_dir: Path) -> dict[str, str]:
    """The task's environment: this process's (``raw_exec`` inherits the client's), Nomad's
    variables, then the task's ``Env`` with ``${...}`` references interpolated."""
    env = dict(os.environ)  # raw_exec inherits the client's environment
    env |= _nomad_variables(
        alloc,
        alloc_dir=str(alloc_dir),
        local=str(task_dir / "local"),
        secrets=str(task_dir / "secrets"),
    )
    for label, port in alloc.ports.items():
        env[f"NOMAD_HOST_IP_{label}"] = "127.0.0.1"
        env[f"NOMAD_HOST_ADDR_{label}"] = f"127.0.0.1:{port}"
    return _with_task_env(alloc, env)


async def start_task(alloc: Alloc, task_dir: Path, alloc_dir: Path) -> anyio.abc.Process:
    """Prepare the task directory, render the templates and start the command.

    Raises ``OSError`` when the directory cannot be made or the command cannot start.
    """
    spec = alloc.spec
    for sub in ("local", "secrets", "tmp"):
        (task_dir / sub).mkdir(parents=True, exist_ok=True)
    (task_dir / "secrets").chmod(0o700)
    (alloc_dir / "logs").mkdir(parents=True, exist_ok=True)
    env = task_environment(alloc, task_dir, alloc_dir)
    for text, destination, mode in spec.templates:
        rendered = ENV_TEMPLATE.sub(lambda m: env.get(m.group(1), ""), text)
        target = task_dir / destination
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rendered, encoding="utf-8")
        target.chmod(mode)
    argv = [interpolate(spec.command, env), *(interpolate(a, env) for a in spec.args)]
    log = alloc_dir / "logs" / f"{spec.task}.stdout.{alloc.restarts}"
    with log.open("wb") as output:
        return await anyio.open_process(
            argv, stdin=-3, stdout=output, stderr=output, env=env, cwd=task_dir,
            start_new_session=True,
        )  # fmt: skip


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Nomad's ``${NAME}`` and ``${env["NAME"]}`` references; unknown ones stay as written."""

    def value(found: re.Match[str]) -> str:
        key = found.group(1).strip()
        if key.startswith('env["') and key.endswith('"]'):
            key = key[5:-2]
        return env.get(key, found.group(0))

    return _REF.sub(value, text)


def signal_group(process: anyio.abc.Process | None, signum: int) -> None:
    """Signal ``process``'s group (it is its leader); gone already is fine."""
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _container_environment(alloc: Alloc) -> dict[str, str]:
    """Nomad's variables as a docker task sees them, then the task's ``Env``."""
    env = _nomad_variables(alloc, alloc_dir="/alloc", local="/local", secrets="/secrets")
    return _with_task_env(alloc, env)


def _engine_options(engine: tuple[str, ...], docker: DockerConfig) -> list[str]:
    podman = Path(engine[0]).name.startswith("podman")
    options: list[str] = []
    for option in docker.security_opts:
        if podman and option == "systempaths=unconfined":
            option = "unmask=ALL"  # noqa: PLW2901 - podman's word for the same
        options += ["--security-opt", option]
    for name, value in docker.ulimits:
        options += ["--ulimit", f"{name}={value}"]
    if docker.privileged:
        options.append("--privileged")
    return options


@attrs.define(eq=False)
class ContainerGuard:
    """The labels of a fake's containers and the guard process that removes them when the
    fake's process ends without closing it (module doc). ``start``; ``starting`` before each
    container's start and ``remove`` at its end; ``release`` once they are all removed.

    Attributes:
        engine: The container engine's command words.
        prefix: The fake's ``container_prefix`` (the ``trajcore.pool`` label).
        deadline_s: How long the guard of a killed fake may take to remove its containers.
    """

    engine: tuple[str, ...]
    prefix: str
    deadline_s: float = 60.0
    owner: str = attrs.field(
        init=False,
        factory=lambda: f"{socket.gethostname()}/fake-nomad/{os.getpid()}/{secrets.token_hex(6)}",
    )
    _guard: GuardProcess = attrs.field(init=False, factory=GuardProcess)

    @property
    def labels(self) -> list[str]:
        """The engine's ``--label`` options of every container the fake starts."""
        return ["--label", f"{LABEL}={self.prefix}", "--label", f"{OWNER_LABEL}={self.owner}"]

    async def start(self, folder: Path) -> None:
        """Start the guard; a killed fake's guard removes ``folder`` too (after the containers)."""
        await self._guard.start(
            guard_argv(
                engine=self.engine, prefix=self.prefix, owner=self.owner, token_folder=folder,
                deadline_s=self.deadline_s,
            )
        )  # fmt: skip

    def starting(self, name: str) -> None:
        """The container ``name`` may appear from now on."""
        self._guard.tell(f"run {name}")

    async def remove(self, name: str) -> None:
        """Remove the container ``name`` (``remove_container``): the guard waits for it no more."""
        await remove_container(self.engine, name)
        self._guard.tell(f"ran {name}")

    async def release(self) -> None:
        """The fake closed, its containers removed: the guard exits."""
        await self._guard.release()


async def start_container(
    alloc: Alloc, task_dir: Path, alloc_dir: Path, guard: ContainerGuard, name: str
) -> anyio.abc.Process:
    """Start a ``docker`` task as the container ``name`` through ``guard``'s engine, with its
    labels (module doc).

    Raises ``OSError`` when the directories cannot be made or the engine cannot start.
    """
    docker = alloc.spec.docker
    assert docker is not None  # a docker task's spec always has its config
    for sub in ("local", "secrets", "tmp"):
        (task_dir / sub).mkdir(parents=True, exist_ok=True)
    (task_dir / "secrets").chmod(0o700)
    (alloc_dir / "logs").mkdir(parents=True, exist_ok=True)
    env = _container_environment(alloc)
    env_file = task_dir / "secrets" / ".engine-env"
    env_file.write_text("".join(f"{key}={value}\n" for key, value in env.items()))
    env_file.chmod(0o600)
    words = [interpolate(word, env) for word in (*docker.entrypoint, *alloc.spec.args)]
    argv = [
        *guard.engine, "run", "--rm", "--name", name, *guard.labels, "--env-file", str(env_file),
        "--volume", f"{task_dir / 'local'}:/local", "--volume", f"{task_dir / 'secrets'}:/secrets",
        "--volume", f"{alloc_dir}:/alloc",
        *(f"--publish=127.0.0.1:{port}:{port}" for port in alloc.ports.values()),
        *_engine_options(guard.engine, docker),
        *(["--entrypoint", words[0]] if words else []),
        docker.image, *words[1:],
    ]  # fmt: skip
    log = alloc_dir / "logs" / f"{alloc.spec.task}.stdout.{alloc.restarts}"
    with log.open("wb") as output:
        return await anyio.open_process(
            argv, stdin=-3, stdout=output, stderr=output, start_new_session=True
        )


async def remove_container(engine: tuple[str, ...], name: str, timeout_s: float = 60.0) -> None:
    """Remove the container ``name`` (running or not, gone already is fine); bounded, shielded."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(timeout_s):
        await anyio.run_process(
            [*engine, "rm", "--force", name],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
        )  # fmt: skip
