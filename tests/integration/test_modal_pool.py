"""The Modal pool over the provider double at the SDK boundary (``FakeCloud``), which runs the
real slot server on loopback: the SandboxPool contract, and the cloud pool's own promises
(labels, the crashed run's sandboxes deleted at start, every sandbox deleted on close, a
stopped sandbox or a refused creation reported with the provider's message).

The double's URL is plain HTTP on loopback: it stands for Modal's TLS tunnel. What it does
not check (Modal itself, TLS, the SDK's calls) is said in docs/deploy.md; tests/live/ runs the
same suite against Modal when credentials are present."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from tests.integration.cloud_testbed import (
    FAST,
    agree_with_the_fake,
    cloud_pool_config,
    pool_on,
    shape_settings,
    stop_sandbox,
)
from trajcore.adapters.pools.cloud_pool import (
    OWNER_LABEL,
    RUN_LABEL,
    ProviderError,
    SandboxSpec,
    server_argv,
)
from trajcore.adapters.pools.modal_pool import ModalPoolConfig, ModalSandboxPool
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.fake_cloud import FakeCloud
from trajcore.testing.sandbox_pool_contract import (
    CrashContainer,
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)


def _config(**overrides: object) -> ModalPoolConfig:
    settings = {**FAST, "owner": "test-modal", **overrides}
    return ModalPoolConfig(pool=cloud_pool_config(**settings))


@asynccontextmanager
async def modal_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    async with FakeCloud(name="Modal") as fake:
        config = _config(**shape_settings(shape))
        async with pool_on(fake, lambda f: ModalSandboxPool(config, provider=f)) as pool:
            yield pool


@pytest.mark.slow
class TestModalSandboxPool(SandboxPoolContract):
    supports_crash = True
    machine_scale = 0.02

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return modal_pool

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        return stop_sandbox


@pytest.mark.slow
def test_the_fake_and_the_modal_pool_agree() -> None:
    """The lockstep machine: the fake pool and Modal sandboxes of the provider double (real
    slot servers behind it); a crash is Modal stopping the sandbox."""
    agree_with_the_fake(modal_pool)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _bash(command: str, call_id: str = "c1") -> ToolCall:
    return ToolCall(id=call_id, name="bash", arguments={"command": command})


@pytest.mark.slow
@pytest.mark.anyio
async def test_sandboxes_are_labelled_and_a_crashed_runs_are_deleted_at_start() -> None:
    async with FakeCloud(name="Modal") as fake:
        config = _config(min_containers=1, max_containers=1, slots_per_container=1)
        stale = SandboxSpec(
            argv=server_argv(config.pool),
            port=config.pool.port,
            labels={OWNER_LABEL: "test-modal", RUN_LABEL: "crashed", "trajcore-index": "0"},
            env={"TRAJCORE_SLOT_TOKEN": "old-token"},
        )
        left = await fake.leave(stale)
        async with ModalSandboxPool(config, provider=fake) as pool:
            assert left in fake.deleted
            (box,) = fake.live()
            assert box.spec.labels[OWNER_LABEL] == "test-modal"
            assert box.spec.labels[RUN_LABEL] == pool.run
            assert "TRAJCORE_SLOT_TOKEN" in box.spec.env
            assert box.spec.env["TRAJCORE_SLOT_TOKEN"] not in " ".join(box.spec.argv)
        assert fake.live() == []


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_stopped_sandbox_fails_calls_in_flight_with_the_providers_message() -> None:
    async with FakeCloud(name="Modal") as fake:
        config = _config(min_containers=1, max_containers=1, slots_per_container=1)
        async with ModalSandboxPool(config, provider=fake) as pool:
            async with pool.lease("t1") as lease:
                container = lease.slot.container
                box_id = pool.sandbox_id(container)

                async def stop_soon() -> None:
                    await anyio.sleep(0.5)
                    fake.stop(box_id, "sandbox exceeded its timeout of 300 s")

                async with anyio.create_task_group() as group:
                    group.start_soon(stop_soon)
                    call = SlotCall(lease=lease, call=_bash("sleep 20"), timeout_s=30.0)
                    (result,) = await pool.execute(container, [call])
            assert result.outcome is ToolOutcome.INFRA_ERROR
            assert result.error is not None
            assert "exceeded its timeout of 300 s" in result.error


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_quota_refusal_fails_the_start_with_the_providers_message() -> None:
    async with FakeCloud(name="Modal", refuse_creates="Resource exhausted: sandbox quota") as fake:
        config = _config(min_containers=1, max_containers=1, start_timeout_s=10.0)
        with pytest.raises(ProviderError, match="sandbox quota"):
            async with ModalSandboxPool(config, provider=fake):
                pass
        assert fake.created != []
        assert fake.live() == []
