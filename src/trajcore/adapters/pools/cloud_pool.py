"""``CloudSandboxPool``: slot servers as a cloud provider's sandboxes (Modal, Daytona).

One slot server per sandbox. The pool asks the provider for a sandbox running
``python -m trajcore.entrypoints.slot_server --listen 0.0.0.0:PORT --token-env ...``, reaches it
through the provider's own exposure of that port (Modal's encrypted tunnels, Daytona's preview
URLs: HTTPS with the provider's certificate) and speaks the slot-server protocol to it with the
pool's bearer token, as every other pool does (``pool_core``). The token travels in the
sandbox's environment (or the provider's secret), never on a command line.

What a provider must offer is ``CloudProvider``: create a sandbox with labels, list the
sandboxes carrying labels, describe one, delete one. ``modal_pool`` and ``daytona_pool`` write
it over each provider's official SDK (``modal_sdk``, ``daytona_sdk``: the only modules that
import them); ``trajcore.testing.fake_cloud`` is the double the contract suites run against.

How the pool follows its sandboxes: every ``poll_interval_s`` it lists the sandboxes labelled
with its owner and hands them to the Nomad pool's reconciler (``domain.nomad_reconcile``), each
sandbox as an allocation (its server index from its label, its state as a client status). The
decisions are carried out by the loop the Nomad and Slurm pools share (``reconciled``): join,
drain, lose, remove, replace (delete the sandbox), the count; ``plan_sandboxes`` keeps one live
sandbox per index below the count and deletes the rest. A sandbox whose server failed to start
is created again after a growing delay (0.5 s doubling to 60 s); a creation the provider refuses
(a quota, a missing image) is noted with the provider's message and retried the same way.

Labels: every sandbox carries ``trajcore-owner`` (the pool's owner: one name per env run
series, ``owner`` in the config), ``trajcore-run`` (this pool's run ID, new at every start)
and ``trajcore-index``. At start the pool deletes every sandbox of its owner (what a crashed
run left: it holds an old token); on close it deletes every sandbox of its run and waits until
the list is empty (``stop_timeout_s``).

Faults: a sandbox the provider stops (its timeout, an eviction, an operator) or whose port
exposure drops ends the server's calls in flight as ``INFRA_ERROR`` (never scored); the pool
asks the provider what happened and puts the provider's message into those results, the
container leaves service, and a replacement is created.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, Literal, Protocol, TypeVar

import anyio
import attrs

from trajcore.adapters.pools.reconciled import (
    IndexedPool,
    IndexedSource,
    composed_settings,
    part,
)
from trajcore.domain.errors import ConfigError, InvalidInput, SandboxUnavailable
from trajcore.domain.nomad_reconcile import Join
from trajcore.domain.scaling import ScaleSettings
from trajcore.domain.slot_server_flags import isolation_argv
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolOutcome, ToolResult
from trajcore.domain.validators import (
    nonempty_text,
    positive_seconds,
    whole_number,
)

__all__ = [
    "DEFAULT_IMAGE",
    "OWNER_LABEL",
    "RUN_LABEL",
    "CloudPoolConfig",
    "CloudProvider",
    "CloudSandbox",
    "CloudSandboxPool",
    "ProviderError",
    "ProviderPoolConfig",
    "ProviderSdk",
    "SandboxSpec",
    "SandboxState",
    "check_provider",
    "plan_sandboxes",
    "require_sdk",
    "server_argv",
]

_log = logging.getLogger(__name__)
OWNER_LABEL = "trajcore-owner"
RUN_LABEL = "trajcore-run"
INDEX_LABEL = "trajcore-index"
DEFAULT_IMAGE = "ghcr.io/trajcore/slot-server:latest"
"""The registry image a cloud sandbox runs unless its settings name another."""
TOKEN_ENV = "TRAJCORE_SLOT_TOKEN"  # noqa: S105 - the name of the variable, not a token

SandboxState = Literal["pending", "running", "stopped", "failed"]
"""A sandbox's state in the pool's words; each provider maps its own states onto these."""

_CLIENT_STATUS: Mapping[SandboxState, str] = {
    "pending": "pending",
    "running": "running",
    "stopped": "complete",
    "failed": "failed",
}


class ProviderError(SandboxUnavailable):
    """The provider refused or failed a request (quota, authentication, a missing image, an
    unreachable API); the message is the provider's."""


@attrs.frozen(kw_only=True)
class SandboxSpec:
    """What the pool asks the provider to run.

    Attributes:
        argv: The slot server's command line (its ``--listen`` word is ``0.0.0.0:PORT``).
        port: The port to expose (the provider's tunnel or preview URL).
        labels: The sandbox's labels (owner, run, index).
        env: Environment of the command; holds the bearer token, so never logged.
    """

    argv: tuple[str, ...]
    port: int
    labels: Mapping[str, str]
    env: Mapping[str, str] = attrs.field(repr=False)


@attrs.frozen(kw_only=True)
class CloudSandbox:
    """One sandbox as the provider lists it.

    Attributes:
        id: The provider's ID.
        labels: Its labels (tags).
        state: Its state in the pool's words.
        message: What the provider says about that state (why it stopped), or ``""``.
    """

    id: str
    labels: Mapping[str, str]
    state: SandboxState
    message: str = ""


class CloudProvider(Protocol):
    """What the cloud pool needs from a provider. Every method raises ``ProviderError`` with the
    provider's message when the provider refuses or fails."""

    @property
    def name(self) -> str:
        """The provider's name, for messages (``Modal``, ``Daytona``)."""
        ...

    async def create(self, spec: SandboxSpec) -> str:
        """Create and start a sandbox running ``spec``; its ID (it may still be pending)."""
        ...

    async def url(self, sandbox_id: str, port: int) -> str:
        """The ``https://`` URL at which ``port`` of the sandbox is exposed."""
        ...

    async def list(self, labels: Mapping[str, str]) -> list[CloudSandbox]:
        """The sandboxes carrying at least ``labels``, deleted ones excluded."""
        ...

    async def describe(self, sandbox_id: str) -> CloudSandbox | None:
        """The sandbox now (``None`` when it no longer exists)."""
        ...

    async def delete(self, sandbox_id: str) -> None:
        """Delete the sandbox; one already gone is fine."""
        ...

    async def aclose(self) -> None:
        """Release the SDK's client; idempotent."""
        ...


Sandboxes_contra = TypeVar("Sandboxes_contra", contravariant=True)
Credentials_contra = TypeVar("Credentials_contra", contravariant=True)


class ProviderSdk(Protocol[Sandboxes_contra, Credentials_contra]):
    """Builds a pool's provider over the provider's SDK from the sandboxes' settings and the
    credentials found (``ModalSdk``, ``DaytonaSdk``; the seam a test fills with ``FakeCloud``)."""

    def __call__(
        self, settings: Sandboxes_contra, credentials: Credentials_contra, /
    ) -> CloudProvider:
        """The provider, not yet connected. Raises ``SandboxUnavailable`` when it cannot be
        built (the SDK missing)."""
        ...


def require_sdk(provider: str) -> None:
    """Raise ``SandboxUnavailable`` naming the extra to install when the SDK of ``provider``
    (``modal``, ``daytona``: the package, the extra and the ``terminal_backend`` share the name)
    is not installed."""
    if importlib.util.find_spec(provider) is None:
        raise SandboxUnavailable(
            f"terminal_backend {provider} needs the {provider} package: "
            f"pip install 'trajcore[{provider}]'"
        )


@composed_settings
@attrs.frozen(kw_only=True)
class CloudPoolConfig:
    """The settings every cloud pool shares: how it runs, scales and reaches its slot servers.
    Each provider's config (``ModalPoolConfig``, ``DaytonaPoolConfig``) holds it as its
    ``pool`` beside its sandboxes' settings.

    Attributes:
        owner: The label every sandbox of this pool carries; at start, every sandbox carrying
            it is deleted (what a crashed run left), so give each concurrent pool its own.
        server: The slot servers' settings (``SlotServerSettings``; by default 4 slots per
            sandbox, and 600 s for the start and each sandbox's join).
        python: The interpreter in the image that runs the slot server.
        workspace_dir: Where the slot workspaces live inside the sandbox.
        port: The port the server listens on inside the sandbox and the provider exposes.
        scaling: The scaling rules' settings (``ScaleSettings``; by default 1 to 4
            sandboxes): the range the sandbox count is scaled in and its damping.
        poll_interval_s: How often the sandboxes are listed.
        request_timeout_s: Longest one provider request may take.
        stop_timeout_s: Longest the close waits for the sandboxes to be deleted.
    """

    owner: str = attrs.field(default="trajcore", validator=nonempty_text)
    server: SlotServerSettings = part(
        SlotServerSettings, lambda: SlotServerSettings(start_timeout_s=600.0)
    )
    python: str = attrs.field(default="python3", validator=nonempty_text)
    workspace_dir: str = attrs.field(default="/tmp/trajcore-slots")  # noqa: S108 - in the sandbox
    port: int = attrs.field(default=8765, validator=whole_number(1))
    scaling: ScaleSettings = part(ScaleSettings, lambda: ScaleSettings(max_containers=4))
    poll_interval_s: float = attrs.field(default=2.0, validator=positive_seconds)
    request_timeout_s: float = attrs.field(default=60.0, validator=positive_seconds)
    stop_timeout_s: float = attrs.field(default=60.0, validator=positive_seconds)

    def __attrs_post_init__(self) -> None:
        if self.port > 65535:
            raise ConfigError("port", f"must be a TCP port (1-65535), got {self.port}")


Settings_co = TypeVar("Settings_co", covariant=True)


@attrs.frozen(kw_only=True)
class ProviderPoolConfig(Generic[Settings_co]):
    """A provider's pool settings: the cloud pool's and each sandbox's. Each provider's config
    (``ModalPoolConfig``, ``DaytonaPoolConfig``) is this with its own sandbox settings as
    ``sandbox`` (and their defaults when not given).

    Attributes:
        pool: How the pool runs, scales and reaches its slot servers (``CloudPoolConfig``).
        sandbox: What each of the provider's sandboxes is created with.
    """

    pool: CloudPoolConfig = part(CloudPoolConfig)
    sandbox: Settings_co


def check_provider(provider: str, credentials: Callable[[], object]) -> None:
    """Raise ``SandboxUnavailable`` naming what is missing for a pool over ``provider``: its SDK
    (``require_sdk``), then its credentials (``credentials`` raises, naming them)."""
    require_sdk(provider)
    credentials()


def server_argv(config: CloudPoolConfig) -> tuple[str, ...]:
    """The slot server's command line in every sandbox of ``config``."""
    return (
        config.python, "-m", "trajcore.entrypoints.slot_server",
        "--slots", str(config.server.slots_per_container),
        "--root", config.workspace_dir,
        "--listen", f"0.0.0.0:{config.port}",
        "--token-env", TOKEN_ENV,
        *isolation_argv(config.server.isolation),
    )  # fmt: skip


@attrs.frozen(kw_only=True)
class SandboxPlan:
    """What ``plan_sandboxes`` decided: indexes to create, sandbox IDs to delete."""

    create: tuple[int, ...]
    delete: tuple[str, ...]


def _index(sandbox: CloudSandbox) -> int | None:
    text = sandbox.labels.get(INDEX_LABEL, "")
    return int(text) if text.isdigit() else None


def plan_sandboxes(
    sandboxes: Sequence[CloudSandbox], *, run: str, count: int, deleting: frozenset[str]
) -> SandboxPlan:
    """What keeps ``count`` live sandboxes of run ``run``, one per index below ``count``.

    Deleted: sandboxes of another run (strays), without an index, at an index at or above
    ``count``, a second live one on an index (the pending one first), and stopped or failed
    ones (a provider may keep listing them). Created: every index below ``count`` with no live
    sandbox of this run.
    """
    if count < 0:
        raise InvalidInput("count", f"must be >= 0, got {count}")
    delete: list[str] = []
    serving: dict[int, list[CloudSandbox]] = {}
    for sandbox in sandboxes:
        if sandbox.id in deleting:
            continue
        index = _index(sandbox)
        live = sandbox.state in ("pending", "running")
        if not live or sandbox.labels.get(RUN_LABEL) != run or index is None or index >= count:
            delete.append(sandbox.id)
            continue
        serving.setdefault(index, []).append(sandbox)
    for on_index in serving.values():
        extra = sorted(on_index, key=lambda s: (s.state != "running", s.id))[1:]
        delete.extend(s.id for s in extra)
    create = tuple(i for i in range(count) if i not in serving)
    return SandboxPlan(create=create, delete=tuple(delete))


@attrs.define(eq=False, kw_only=True)
class _CloudSandboxes(IndexedSource[CloudPoolConfig]):
    """The ``ContainerSource`` of a cloud pool: the sandboxes of one run. The shared loop
    (``ReconciledSource``) decides; this class lists, creates and deletes the sandboxes."""

    unavailable = ProviderError
    noun = "sandbox"
    nothing_started = "no sandbox started"
    stopping = "delete the sandboxes"

    provider: CloudProvider
    names: dict[str, str] = attrs.field(init=False, factory=dict)
    _deleting: set[str] = attrs.field(init=False, factory=set)
    # what the provider last said of a sandbox replaced after a failure (its state and
    # message), kept past its deletion for the calls that failed with it
    last_seen: dict[str, CloudSandbox] = attrs.field(init=False, factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        return {OWNER_LABEL: self.config.owner, RUN_LABEL: self.run}

    @property
    def scheduler(self) -> str:
        return f"{self.provider.name} sandboxes of {self.config.owner}"

    @property
    def tick_timeout_s(self) -> float:
        return self.config.request_timeout_s

    @property
    def no_answer(self) -> str:
        return f"{self.provider.name} did not answer in time"

    # ------------------------------------------------------------------------- source

    async def _set_up(self, stack: contextlib.AsyncExitStack) -> None:
        stack.push_async_callback(self.provider.aclose)
        # what a crashed run of this owner left: its servers hold an old token; delete them
        with anyio.fail_after(self.config.request_timeout_s):
            left = await self.provider.list({OWNER_LABEL: self.config.owner})
        for sandbox in left:
            _log.info("%s pool: deleting sandbox %s left by run %s", self.provider.name,
                      sandbox.id, sandbox.labels.get(RUN_LABEL, "?"))  # fmt: skip
            with anyio.fail_after(self.config.request_timeout_s):
                await self.provider.delete(sandbox.id)
        self._opened(stack)

    async def _stop_runs(self) -> None:
        """Delete every sandbox of the run and wait until none is listed."""
        while left := await self.provider.list(self.labels):
            for sandbox in left:
                await self.provider.delete(sandbox.id)
            await anyio.sleep(0.2)

    # ------------------------------------------------------------------------- the sandboxes

    async def _tick(self) -> None:
        ours = await self.provider.list(self.labels)
        allocations = []
        for sandbox in ours:
            index = _index(sandbox)
            if index is None:
                continue
            allocations.append(
                self._allocation(
                    sandbox.id,
                    index,
                    _CLIENT_STATUS[sandbox.state],
                    desired_status="stop" if sandbox.id in self._deleting else "run",
                )
            )
            if sandbox.state in ("stopped", "failed"):
                self._keep_seen(sandbox)
                if sandbox.id not in self._deleting:
                    message = sandbox.message or sandbox.state
                    self.pool.note(f"sandbox {sandbox.id} {sandbox.state}: {message}")
        now = anyio.current_time()
        self._observed(allocations, now)
        plan = plan_sandboxes(
            ours, run=self.run, count=self.count, deleting=frozenset(self._deleting)
        )
        for sandbox_id in plan.delete:
            self._deleting.add(sandbox_id)
            self.pool.spawn(self._delete, sandbox_id)
        for index in plan.create:
            await self._create(index, now)

    async def _create(self, index: int, now: float) -> None:
        if not self._backoff.due(index, now):
            return
        spec = SandboxSpec(
            argv=server_argv(self.config),
            port=self.config.port,
            labels={**self.labels, INDEX_LABEL: str(index)},
            env={TOKEN_ENV: self.token},
        )
        try:
            box_id = await self.provider.create(spec)
        except ProviderError as error:
            self._backoff.started(index, None, now)
            self.pool.note(f"{self.provider.name} refused sandbox {index}: {error}")
            if not self.pool.container_names() and self._backoff.failures(index) >= 2:
                # nothing serves and the provider keeps refusing: the start fails with its words
                self._fatal = self._fatal or error
                self.pool.signal()
            return
        self._backoff.started(index, box_id, now)
        self.started += 1
        _log.info("%s pool: server %d is sandbox %s", self.provider.name, index, box_id)

    def _replace(self, run_id: str, reason: str) -> None:
        self._deleting.add(run_id)
        self.pool.spawn(self._describe_then_delete, run_id)

    async def _describe_then_delete(self, sandbox_id: str) -> None:
        """Delete a failed sandbox, first keeping what the provider says of it (``last_seen``,
        as a listing that shows a sandbox stopped or failed does; at most 64 kept), so a failed
        call can still name the cause once the sandbox is gone."""
        try:
            with anyio.fail_after(self.config.request_timeout_s):
                seen = await self.provider.describe(sandbox_id)
        except (ProviderError, TimeoutError):
            seen = None
        if seen is not None:
            self._keep_seen(seen)
        await self._delete(sandbox_id)

    def _keep_seen(self, sandbox: CloudSandbox) -> None:
        self.last_seen[sandbox.id] = sandbox
        while len(self.last_seen) > 64:
            del self.last_seen[next(iter(self.last_seen))]

    async def _delete(self, sandbox_id: str) -> None:
        self._deleting.add(sandbox_id)
        try:
            with anyio.fail_after(self.config.request_timeout_s):
                await self.provider.delete(sandbox_id)
        except (ProviderError, TimeoutError) as error:
            self.pool.note(f"could not delete sandbox {sandbox_id}: {str(error) or 'no answer'}")
            self._deleting.discard(sandbox_id)  # the next tick tries again

    # ------------------------------------------------------------------------- joining

    def _container_name(self, join: Join) -> str:
        return f"{self.provider.name.lower()}-{join.index}-{join.alloc_id}"

    async def _address(self, run_id: str) -> str:
        return await self.provider.url(run_id, self.config.port)

    def _joined(self, run_id: str, name: str, address: str) -> None:
        self._backoff.joined(run_id)
        self.names[name] = run_id
        _log.info("%s pool: %s joined", self.provider.name, name)


class CloudSandboxPool(IndexedPool):
    """The SandboxPool port over slot servers run as a cloud provider's sandboxes.

    Entering deletes what a crashed run of the same owner left and waits for
    ``min_containers`` servers (``SlotServerError`` when they are not healthy within
    ``start_timeout_s``; ``ProviderError`` with the provider's message when it keeps refusing
    to create them; ``SandboxUnavailable`` when a sandbox is required and missing). Leaving
    deletes every sandbox of the run (``aclose``).
    """

    def __init__(self, provider: CloudProvider, config: CloudPoolConfig) -> None:
        self.config = config
        self.provider = provider
        self._boxes = _CloudSandboxes(config=config, provider=provider)
        super().__init__(self._boxes, label=provider.name)

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        """See ``SandboxPool.execute``. When the batch ends in infrastructure errors, the
        provider is asked about the sandbox, and its state and message (a stop, an eviction,
        a timeout) are added to those results."""
        results = await super().execute(container, calls)
        failed = [i for i, r in enumerate(results) if r.outcome is ToolOutcome.INFRA_ERROR]
        # (the watch may have seen the sandbox end and removed the member already)
        box_id = self._boxes.names.get(container)
        if not failed or box_id is None:
            return results
        try:
            with anyio.fail_after(self.config.request_timeout_s):
                now = await self.provider.describe(box_id)
        except (ProviderError, TimeoutError) as error:
            said = f"{self.provider.name} could not say what happened: {str(error) or 'no answer'}"
        else:
            now = now or self._boxes.last_seen.get(box_id)
            if now is None:
                said = f"{self.provider.name} sandbox {box_id} no longer exists"
            else:
                said = f"{self.provider.name} sandbox {box_id} is {now.state}"
                said += f": {now.message}" if now.message else ""
        for i in failed:
            result = results[i]
            results[i] = ToolResult.failure(
                calls[i].call, ToolOutcome.INFRA_ERROR, f"{result.error} ({said})"
            )
        return results

    def sandbox_id(self, container: str) -> str:
        """The provider's sandbox behind ``container``. Raises ``KeyError``."""
        return self.run_id(container)
