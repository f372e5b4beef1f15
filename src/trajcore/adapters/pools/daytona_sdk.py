"""``DaytonaProvider``: the cloud pool's ``CloudProvider`` over Daytona's official SDK
(``daytona``, its ``AsyncDaytona`` client).

The only module that imports ``daytona`` (the ``daytona`` extra); ``daytona_pool`` imports it
lazily.

- A sandbox is ``AsyncDaytona.create(CreateSandboxFromImageParams(image=, labels=, env_vars=,
  resources=, public=True, auto_stop_interval=))``; the slot server is started in it as a
  background session command (Daytona images keep their own entrypoint). The token is in the
  sandbox's environment, never on the command line.
- Its port is reached through Daytona's preview URL (``get_preview_link(port).url``: HTTPS with
  Daytona's certificate). The sandbox is created public so that the preview proxy needs no
  header of its own; the slot server's bearer token is what guards it.
- Labels are Daytona's sandbox labels; ``list(ListSandboxesQuery(labels=))`` filters by them.
- ``delete`` is ``AsyncSandbox.delete``; ``describe`` is ``AsyncDaytona.get``; Daytona's states
  map onto the pool's (``_STATES``), ``error_reason`` is the provider's message.
- Credentials are Daytona's own, as ``daytona_pool.daytona_credentials`` found them
  (``DAYTONA_API_KEY``, or ``DAYTONA_JWT_TOKEN`` with ``DAYTONA_ORGANIZATION_ID``;
  ``DAYTONA_API_URL``): they configure the client (``DaytonaConfig``); ``DAYTONA_TARGET`` is
  read by the SDK when the pool names no target. Neither is logged.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

import attrs
from daytona import (
    AsyncDaytona,
    AsyncSandbox,
    CreateSandboxFromImageParams,
    DaytonaConfig,
    DaytonaError,
    DaytonaNotFoundError,
    ListSandboxesQuery,
    Resources,
    SessionExecuteRequest,
)

from trajcore.adapters.pools.cloud_pool import (
    CloudSandbox,
    ProviderError,
    SandboxSpec,
    SandboxState,
)
from trajcore.adapters.pools.daytona_pool import DaytonaCredentials, DaytonaSandboxSettings

__all__ = ["DaytonaProvider", "create_params"]

_SESSION = "trajcore-slot-server"
_STATES: Mapping[str, SandboxState] = {
    "started": "running",
    "stopped": "stopped",
    "stopping": "stopped",
    "archived": "stopped",
    "archiving": "stopped",
    "destroyed": "stopped",
    "destroying": "stopped",
    "error": "failed",
    "build_failed": "failed",
}


def create_params(
    settings: DaytonaSandboxSettings, spec: SandboxSpec
) -> CreateSandboxFromImageParams:
    """The SDK's creation parameters for ``spec`` (a pure function, checked in the tests
    against the API client's own model of Daytona's ``CreateSandbox`` request)."""
    resources = None
    if settings.cpu is not None or settings.memory_gib is not None or settings.disk_gib is not None:
        resources = Resources(cpu=settings.cpu, memory=settings.memory_gib, disk=settings.disk_gib)
    return CreateSandboxFromImageParams(
        image=settings.image,
        labels=dict(spec.labels),
        env_vars=dict(spec.env),
        resources=resources,
        public=True,
        auto_stop_interval=settings.auto_stop_min,
    )


def _said(error: BaseException) -> ProviderError:
    return ProviderError(f"Daytona: {error}")


def _view(sandbox: AsyncSandbox) -> CloudSandbox:
    state = str(getattr(sandbox.state, "value", sandbox.state) or "unknown")
    return CloudSandbox(
        id=sandbox.id,
        labels=dict(sandbox.labels),
        state=_STATES.get(state, "pending"),
        message=sandbox.error_reason or ("" if state == "started" else state),
    )


@attrs.define(eq=False)
class DaytonaProvider:
    """``CloudProvider`` over the Daytona SDK (one ``AsyncDaytona`` client)."""

    settings: DaytonaSandboxSettings
    credentials: DaytonaCredentials = attrs.field(factory=DaytonaCredentials)
    _client: AsyncDaytona | None = attrs.field(init=False, default=None)

    @property
    def name(self) -> str:
        return "Daytona"

    def _daytona(self) -> AsyncDaytona:
        if self._client is None:
            try:
                self._client = AsyncDaytona(self.client_config())
            except DaytonaError as error:
                raise _said(error) from None
        return self._client

    def client_config(self) -> DaytonaConfig:
        """The SDK client's configuration: the credentials found, the pool's target."""
        credentials = self.credentials
        return DaytonaConfig(
            api_key=credentials.api_key,
            jwt_token=credentials.jwt_token,
            organization_id=credentials.organization_id,
            api_url=credentials.api_url,
            target=self.settings.target,
        )

    async def create(self, spec: SandboxSpec) -> str:
        daytona = self._daytona()
        try:
            sandbox = await daytona.create(
                create_params(self.settings, spec), timeout=self.settings.create_timeout_s
            )
            await sandbox.process.create_session(_SESSION)
            command = shlex.join(spec.argv)
            await sandbox.process.execute_session_command(
                _SESSION, SessionExecuteRequest(command=command, run_async=True)
            )
        except DaytonaError as error:
            raise _said(error) from None
        return sandbox.id

    async def url(self, sandbox_id: str, port: int) -> str:
        try:
            sandbox = await self._daytona().get(sandbox_id)
            link = await sandbox.get_preview_link(port)
        except DaytonaError as error:
            raise _said(error) from None
        return link.url

    async def list(self, labels: Mapping[str, str]) -> list[CloudSandbox]:
        found: list[CloudSandbox] = []
        try:
            async for sandbox in self._daytona().list(ListSandboxesQuery(labels=dict(labels))):
                view = _view(sandbox)
                if str(getattr(sandbox.state, "value", sandbox.state)) != "destroyed":
                    found.append(view)
        except DaytonaError as error:
            raise _said(error) from None
        return found

    async def describe(self, sandbox_id: str) -> CloudSandbox | None:
        try:
            return _view(await self._daytona().get(sandbox_id))
        except DaytonaNotFoundError:
            return None
        except DaytonaError as error:
            raise _said(error) from None

    async def delete(self, sandbox_id: str) -> None:
        try:
            sandbox = await self._daytona().get(sandbox_id)
            await sandbox.delete()
        except DaytonaNotFoundError:
            return
        except DaytonaError as error:
            raise _said(error) from None

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
