"""``FakeCloud``: a cloud sandbox provider (Modal, Daytona) at the SDK boundary, running REAL slot
servers on loopback.

It implements ``CloudProvider`` as the providers' SDKs document their behaviour: a created
sandbox is listed at once as pending, runs its command, turns running, and is listed with its
labels (both SDKs filter a list by "at least these labels/tags"); a deleted one disappears from
the list; a stopped one stays listed as stopped with the provider's message until it is
deleted; a refused creation raises ``ProviderError`` with the provider's words.

What it stands for and what it does not:

- Each sandbox is the slot server command the pool asked for, run as a child process in its
  own process group on this machine; its filesystem is a directory of the fake's (the
  ``--root`` word is moved under it), and the exposed port is a free loopback port (the
  ``--listen`` word ``0.0.0.0:PORT`` becomes ``127.0.0.1:<free>``).
- A sandbox's environment is its own, as a provider's is: the image's (``PATH``, with this
  interpreter's directory first, standing for an image whose ``python3`` has trajcore) and
  what the spec sets (the bearer token); nothing of the pool's process (its credentials
  included) reaches it.
- The tunnel or preview URL is plain ``http://127.0.0.1:<port>``: the double stands for the
  provider's TLS-terminating proxy, so TLS itself is not exercised here (the client's HTTPS
  path is the same ``adapters.http1`` client every HTTPS endpoint uses).
- Fault injection, as the providers produce them: ``stop`` (the provider ends the sandbox: its
  timeout, an eviction, an operator; it stays listed as stopped with a message),
  ``drop_tunnel`` (the exposure ends, the process lives on), ``refuse_creates`` (a quota).
- Inspection: ``created`` (every spec asked for, in order), ``deleted``, ``live()``.
- ``leave(spec)`` plants a sandbox as a crashed earlier run would have left it.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Self

import anyio
import anyio.abc
import attrs

from trajcore.adapters.pools.cloud_pool import (
    CloudSandbox,
    ProviderError,
    SandboxSpec,
    SandboxState,
)

__all__ = ["FakeCloud", "FakeSandbox"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@attrs.define(eq=False)
class FakeSandbox:
    """One sandbox of the fake: its spec, process, loopback port and state."""

    id: str
    spec: SandboxSpec
    directory: Path
    port: int
    state: SandboxState = "pending"
    message: str = ""
    process: anyio.abc.Process | None = None
    tunnel_open: bool = True

    def view(self) -> CloudSandbox:
        return CloudSandbox(
            id=self.id, labels=dict(self.spec.labels), state=self.state, message=self.message
        )


def _image_environment() -> dict[str, str]:
    """What a sandbox's environment holds before the spec's: the image's ``PATH``."""
    path = [str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]
    return {"PATH": os.pathsep.join(path), "LANG": "C.UTF-8"}


def _rewrite(argv: tuple[str, ...], *, port: int, listen_port: int, root: Path) -> list[str]:
    out = list(argv)
    for i, word in enumerate(out):
        if word == f"0.0.0.0:{port}":
            out[i] = f"127.0.0.1:{listen_port}"
        elif i > 0 and out[i - 1] == "--root":
            out[i] = str(root / word.lstrip("/"))
    return out


@attrs.define(eq=False)
class FakeCloud:
    """A provider double: ``async with FakeCloud(name="Modal") as cloud``; ends every sandbox
    it still runs on exit.

    Attributes:
        name: The provider it stands for, in messages.
        refuse_creates: When set, every ``create`` raises ``ProviderError`` with this message.
        created: Every spec ``create`` was given, in order.
        deleted: The IDs ``delete`` removed, in order.
    """

    name: str = "FakeCloud"
    refuse_creates: str | None = None
    created: list[SandboxSpec] = attrs.field(factory=list)
    deleted: list[str] = attrs.field(factory=list)
    _boxes: dict[str, FakeSandbox] = attrs.field(init=False, factory=dict)
    _next: int = attrs.field(init=False, default=0)
    _dir: tempfile.TemporaryDirectory[str] | None = attrs.field(init=False, default=None)
    _group: anyio.abc.TaskGroup | None = attrs.field(init=False, default=None)
    _stack: contextlib.AsyncExitStack = attrs.field(init=False, factory=contextlib.AsyncExitStack)
    closed_clients: int = attrs.field(init=False, default=0)

    async def __aenter__(self) -> Self:
        self._dir = tempfile.TemporaryDirectory(prefix="trajcore-fake-cloud-")
        # a root slot server runs its slots as unprivileged uids that must reach their workspaces
        Path(self._dir.name).chmod(0o711)  # noqa: ASYNC240 - once, on a fresh directory
        self._group = await self._stack.enter_async_context(anyio.create_task_group())
        return self

    async def __aexit__(self, *_: object) -> None:
        for box in list(self._boxes.values()):
            await self._end(box)
        assert self._group is not None
        self._group.cancel_scope.cancel()
        await self._stack.aclose()
        if self._dir is not None:
            self._dir.cleanup()

    # ------------------------------------------------------------------------- CloudProvider

    async def create(self, spec: SandboxSpec) -> str:
        self.created.append(spec)
        if self.refuse_creates is not None:
            raise ProviderError(self.refuse_creates)
        return await self._start(spec)

    async def url(self, sandbox_id: str, port: int) -> str:
        box = self._boxes.get(sandbox_id)
        if box is None:
            raise ProviderError(f"sandbox {sandbox_id} not found")
        if port != box.spec.port:
            raise ProviderError(f"port {port} of sandbox {sandbox_id} is not exposed")
        while box.state == "pending":  # noqa: ASYNC110 - both SDKs poll the state too
            await anyio.sleep(0.01)
        if box.state != "running" or not box.tunnel_open:
            raise ProviderError(f"sandbox {sandbox_id} is {box.state}: {box.message}")
        return f"http://127.0.0.1:{box.port}"

    async def list(self, labels: Mapping[str, str]) -> list[CloudSandbox]:
        return [
            box.view()
            for box in self._boxes.values()
            if all(box.spec.labels.get(k) == v for k, v in labels.items())
        ]

    async def describe(self, sandbox_id: str) -> CloudSandbox | None:
        box = self._boxes.get(sandbox_id)
        return None if box is None else box.view()

    async def delete(self, sandbox_id: str) -> None:
        box = self._boxes.pop(sandbox_id, None)
        if box is not None:
            self.deleted.append(sandbox_id)
            await self._end(box)

    async def aclose(self) -> None:
        self.closed_clients += 1

    # ------------------------------------------------------------------------- faults

    def live(self) -> builtins.list[FakeSandbox]:
        """The sandboxes not deleted, in creation order."""
        return list(self._boxes.values())

    def box(self, sandbox_id: str) -> FakeSandbox:
        """The sandbox ``sandbox_id``. Raises ``KeyError``."""
        return self._boxes[sandbox_id]

    def stop(self, sandbox_id: str, message: str = "stopped by the provider") -> None:
        """The provider ends the sandbox (its process is killed); listed as stopped."""
        box = self._boxes[sandbox_id]
        box.state, box.message = "stopped", message
        self._kill(box)

    def drop_tunnel(self, sandbox_id: str) -> None:
        """The sandbox's port exposure ends: its server is unreachable, its process lives."""
        box = self._boxes[sandbox_id]
        box.tunnel_open = False
        assert box.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(box.process.pid, signal.SIGSTOP)  # unreachable: connections hang

    async def leave(self, spec: SandboxSpec) -> str:
        """Plant a sandbox as a crashed earlier run left it (running ``spec``)."""
        return await self._start(spec)

    # ------------------------------------------------------------------------- processes

    async def _start(self, spec: SandboxSpec) -> str:
        assert self._dir is not None
        assert self._group is not None
        self._next += 1
        box_id = f"sb-{self._next:04d}"
        directory = Path(self._dir.name) / box_id
        directory.mkdir(mode=0o711)
        box = FakeSandbox(id=box_id, spec=spec, directory=directory, port=_free_port())
        self._boxes[box_id] = box
        argv = _rewrite(spec.argv, port=spec.port, listen_port=box.port, root=directory)
        env = {**_image_environment(), **spec.env}
        with (directory / "log").open("wb") as log:
            box.process = await anyio.open_process(
                argv, stdin=-3, stdout=log, stderr=log, env=env, cwd=directory,
                start_new_session=True,
            )  # fmt: skip
        self._group.start_soon(self._follow, box)
        return box_id

    async def _follow(self, box: FakeSandbox) -> None:
        """Running once the port answers; failed (with the log's tail) if the process ends."""
        process = box.process
        assert process is not None
        while process.returncode is None and box.state == "pending":
            with contextlib.suppress(OSError):
                stream = await anyio.connect_tcp("127.0.0.1", box.port)
                await stream.aclose()
                box.state = "running"
                break
            await anyio.sleep(0.02)
        code = await process.wait()
        if box.state in ("pending", "running"):
            tail = (box.directory / "log").read_text(errors="replace").strip()[-300:]
            box.state, box.message = "failed", f"the command exited with {code}: {tail}"

    def _kill(self, box: FakeSandbox) -> None:
        if box.process is not None and box.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(box.process.pid, signal.SIGKILL)

    async def _end(self, box: FakeSandbox) -> None:
        self._kill(box)
        if box.process is not None:
            with anyio.move_on_after(10), anyio.CancelScope(shield=True):
                await box.process.wait()
            await box.process.aclose()
