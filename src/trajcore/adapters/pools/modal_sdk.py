"""``ModalProvider``: the cloud pool's ``CloudProvider`` over Modal's official SDK (``modal``).

The only module that imports ``modal`` (the ``modal`` extra); ``modal_pool`` imports it lazily.
Everything is called through the SDK's ``.aio`` interfaces, typed by the SDK's own stubs.

- A sandbox is ``modal.Sandbox.create(*argv, app=, image=, tags=, secrets=, encrypted_ports=)``:
  the slot server is the sandbox's command, the token a ``modal.Secret.from_dict`` (never on
  the command line), its port an encrypted tunnel (``Sandbox.tunnels()[port].url``: HTTPS
  with Modal's certificate).
- Labels are Modal's sandbox tags; ``Sandbox.list(app_id=, tags=)`` returns the sandboxes
  carrying at least those tags (running ones; Modal does not list finished sandboxes).
- ``delete`` is ``terminate``; ``describe`` is ``Sandbox.from_id`` and ``poll`` (an exit code
  means the sandbox stopped: its timeout, an eviction, or its command ended).
- Credentials are Modal's own, as ``modal_pool.modal_credentials`` found them: a token
  (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``) becomes the SDK's client
  (``Client.from_credentials``), passed to every call; a profile (``~/.modal.toml``) is read by
  the SDK itself. Neither is logged.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import modal
import modal.exception

from trajcore.adapters.pools.cloud_pool import CloudSandbox, ProviderError, SandboxSpec
from trajcore.adapters.pools.modal_pool import ModalCredentials, ModalSandboxSettings

__all__ = ["ModalProvider"]


def _said(error: BaseException) -> ProviderError:
    return ProviderError(f"Modal: {type(error).__name__}: {error}")


@attrs.define(eq=False)
class ModalProvider:
    """``CloudProvider`` over the Modal SDK (one app, found or created by name)."""

    settings: ModalSandboxSettings
    credentials: ModalCredentials = attrs.field(factory=ModalCredentials)
    _client: modal.Client | None = attrs.field(init=False, default=None)
    _app: modal.App | None = attrs.field(init=False, default=None)
    _image: modal.Image | None = attrs.field(init=False, default=None)

    @property
    def name(self) -> str:
        return "Modal"

    async def _the_app(self) -> modal.App:
        if self._app is None:
            token_id, token_secret = self.credentials.token_id, self.credentials.token_secret
            try:
                if token_id and token_secret and self._client is None:
                    self._client = await modal.Client.from_credentials.aio(token_id, token_secret)
                self._app = await modal.App.lookup.aio(
                    self.settings.app_name,
                    client=self._client,
                    create_if_missing=True,
                    environment_name=self.settings.environment,
                )
            except modal.exception.Error as error:
                raise _said(error) from None
            self._image = modal.Image.from_registry(
                self.settings.image, add_python=self.settings.add_python
            )
        return self._app

    async def create(self, spec: SandboxSpec) -> str:
        app = await self._the_app()
        settings = self.settings
        try:
            sandbox = await modal.Sandbox.create.aio(
                *spec.argv,
                app=app,
                image=self._image,
                tags=dict(spec.labels),
                secrets=[modal.Secret.from_dict(dict(spec.env))],
                encrypted_ports=[spec.port],
                timeout=round(settings.sandbox_timeout_s),
                region=settings.region,
                cpu=settings.cpu,
                memory=settings.memory_mib,
                environment_name=settings.environment,
                client=self._client,
            )
        except modal.exception.Error as error:
            raise _said(error) from None
        return sandbox.object_id

    async def url(self, sandbox_id: str, port: int) -> str:
        await self._the_app()
        try:
            sandbox = await modal.Sandbox.from_id.aio(sandbox_id, client=self._client)
            tunnels = await sandbox.tunnels.aio()
        except modal.exception.Error as error:
            raise _said(error) from None
        if port not in tunnels:
            raise ProviderError(f"Modal: sandbox {sandbox_id} has no tunnel for port {port}")
        return tunnels[port].url

    async def list(self, labels: Mapping[str, str]) -> list[CloudSandbox]:
        app = await self._the_app()
        found: list[CloudSandbox] = []
        try:
            async for sandbox in modal.Sandbox.list.aio(
                app_id=app.app_id, tags=dict(labels), client=self._client
            ):
                tags = await sandbox.get_tags.aio()
                code = await sandbox.poll.aio()
                found.append(_view(sandbox.object_id, tags, code))
        except modal.exception.Error as error:
            raise _said(error) from None
        return found

    async def describe(self, sandbox_id: str) -> CloudSandbox | None:
        await self._the_app()
        try:
            sandbox = await modal.Sandbox.from_id.aio(sandbox_id, client=self._client)
            tags = await sandbox.get_tags.aio()
            code = await sandbox.poll.aio()
        except modal.exception.NotFoundError:
            return None
        except modal.exception.Error as error:
            raise _said(error) from None
        return _view(sandbox_id, tags, code)

    async def delete(self, sandbox_id: str) -> None:
        await self._the_app()
        try:
            sandbox = await modal.Sandbox.from_id.aio(sandbox_id, client=self._client)
            await sandbox.terminate.aio()
        except modal.exception.NotFoundError:
            return
        except modal.exception.Error as error:
            raise _said(error) from None

    async def aclose(self) -> None:
        client, self._client, self._app = self._client, None, None
        if client is not None:
            await client.close.aio()


def _view(sandbox_id: str, tags: Mapping[str, str], code: int | None) -> CloudSandbox:
    if code is None:
        return CloudSandbox(id=sandbox_id, labels=dict(tags), state="running")
    return CloudSandbox(
        id=sandbox_id,
        labels=dict(tags),
        state="stopped",
        message=f"the sandbox ended with exit code {code}",
    )
