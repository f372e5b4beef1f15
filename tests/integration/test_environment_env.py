"""An env whose items name their own root filesystem, end to end on the local pool: real slot
servers with an image cache, real bubblewrap and the compiled keeper, the shipped fake chat
server as the model. The image is made at test time from the host's own programs
(``tests/environment_roots.py``); the model's command and the verify step both run over it and
see its ``/etc/os-release``, while a group naming no image sees the host's; a group naming a
missing image fails as infrastructure, naming it, and leaves every slot free."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.environment_roots import IMAGE_OS_RELEASE, image_problem, write_shell_image
from tests.unit.test_agent_env import _config, _turn
from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.environment_leases import EnvironmentStatistics, ForkRefused
from trajcore.domain.groups import GroupStatus, TrajectoryStatus
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import PoolStatistics
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.group import GroupResult
from trajcore.rollout.tools import SlotTools, ToolRouter

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(image_problem() is not None, reason=str(image_problem())),
]

RELEASE = IMAGE_OS_RELEASE.decode()
HOST_RELEASE = Path("/etc/os-release").read_text()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def image_dir() -> Iterator[Path]:
    """A folder every slot uid may search, holding the image's layout and the cache."""
    folder = Path(tempfile.mkdtemp(prefix="trajcore-env-e2e-"))
    folder.chmod(0o711)
    try:
        write_shell_image(folder / "layout")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class OsReleaseEnv(AgentEnv[str]):
    """Each item is the image its task runs over ("" for none); the score is 1 when verify
    reads, in the slot, the os-release the item's image holds."""

    name = "os_release"

    async def get_next_item(self) -> str:
        return ""

    def build_task(self, item: str) -> str:
        return "Show /etc/os-release."

    def task_environment(self, item: str) -> str | None:
        return item or None

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        report = await tools.run("cat /etc/os-release")
        expected = RELEASE if item else HOST_RELEASE
        return 1.0 if report.stdout == expected else 0.0


def _shows_os_release() -> FakeChatServer:
    def respond(messages: Sequence[Message]) -> Any:
        if messages[-1].role == "tool":
            return _turn(Message.assistant("shown"))
        call = ToolCall(id="c", name="bash", arguments={"command": "cat /etc/os-release"})
        return _turn(Message.assistant("showing", tool_calls=[call]))

    return FakeChatServer(policy=respond)


async def test_an_items_image_is_the_root_of_every_member_and_of_verify(image_dir: Path) -> None:
    image = f"oci:{image_dir / 'layout'}"
    env = OsReleaseEnv(_config(group_size=3, ensure_scores_are_not_same=False))
    config = LocalPoolConfig(
        containers=2,
        server=SlotServerSettings(
            slots_per_container=2, isolation=SlotIsolation(require_sandbox=True)
        ),
        image_cache_dir=image_dir / "cache",
    )
    policy = env.make_policy(chat=_shows_os_release())
    async with LocalSandboxPool(config) as pool:
        over = await env.run_task(image, pool=pool, policy=policy)
        plain = await env.run_task("", pool=pool, policy=policy)
        missing = await env.run_task(f"oci:{image_dir / 'no-layout'}", pool=pool, policy=policy)
        environments = pool.environment_statistics()
        stats = pool.statistics()
    assert over.environment == image
    assert over.verdict.member_scores == (1.0, 1.0, 1.0)
    assert [e.result.content for m in over.members for e in m.exchanges] == [RELEASE] * 3
    assert plain.verdict.member_scores == (1.0, 1.0, 1.0)  # the host's root, as before
    assert missing.verdict.status is GroupStatus.FAILED
    for member in missing.members:
        assert member.outcome.status is TrajectoryStatus.INFRA_ERROR
        assert f"task environment oci:{image_dir / 'no-layout'}" in str(member.outcome.detail)
    assert (environments.leases, environments.refused) == (6, 3)
    assert environments.hits + environments.misses == 3
    assert environments.misses >= 1
    assert (stats.leased, stats.quarantined, stats.free) == (0, 0, 4)


class PreparedOnceEnv(OsReleaseEnv):
    """Preparation writes a file over the image once; verify needs it in every member."""

    preparations = 0

    async def prepare_workspace(self, item: str, tools: SlotTools) -> JSONObject | None:
        type(self).preparations += 1
        await tools.write_file("prepared.txt", "ready")
        report = await tools.run("echo made-over-the-image > /prepared-root.txt")
        assert report.exit_code == 0, report
        return {"preparations": type(self).preparations}

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        both = await tools.run("cat prepared.txt /prepared-root.txt /etc/os-release")
        return 1.0 if both.stdout == "ready" + "made-over-the-image\n" + RELEASE else 0.0


async def _group_prepared_once(
    image_dir: Path, *, group_size: int, containers: int
) -> tuple[GroupResult, EnvironmentStatistics, PoolStatistics]:
    """One group of ``group_size`` with ``prepare_once``, over the image, on ``containers``
    servers of 4 slots: its result and the pool's figures after it."""
    PreparedOnceEnv.preparations = 0
    env = PreparedOnceEnv(
        _config(group_size=group_size, ensure_scores_are_not_same=False, prepare_once=True)
    )
    config = LocalPoolConfig(
        containers=containers,
        server=SlotServerSettings(
            slots_per_container=4, isolation=SlotIsolation(require_sandbox=True)
        ),
        image_cache_dir=image_dir / "cache",
    )
    async with LocalSandboxPool(config) as pool:
        result = await env.run_task(
            f"oci:{image_dir / 'layout'}",
            pool=pool,
            policy=env.make_policy(chat=_shows_os_release()),
        )
        return result, pool.environment_statistics(), pool.statistics()


async def test_prepare_once_forks_the_prepared_lease_into_every_member(image_dir: Path) -> None:
    result, environments, stats = await _group_prepared_once(image_dir, group_size=3, containers=1)
    assert PreparedOnceEnv.preparations == 1
    assert result.verdict.member_scores == (1.0, 1.0, 1.0)
    assert [m.prepare_metadata for m in result.members] == [{"preparations": 1}] * 3
    assert (environments.snapshots, environments.forks, environments.refused) == (1, 3, 0)
    assert (stats.leased, stats.quarantined, stats.free) == (0, 0, 4)


async def test_a_group_of_four_prepared_once_forks_every_member_on_two_servers(
    image_dir: Path,
) -> None:
    result, environments, stats = await _group_prepared_once(image_dir, group_size=4, containers=2)
    assert PreparedOnceEnv.preparations == 1
    assert result.verdict.member_scores == (1.0, 1.0, 1.0, 1.0)
    assert [m.prepare_metadata for m in result.members] == [{"preparations": 1}] * 4
    assert (environments.snapshots, environments.forks, environments.fallbacks) == (1, 4, 0)
    assert (stats.leased, stats.quarantined, stats.free) == (0, 0, 8)


async def test_slot_tools_fork_copies_a_running_lease_over_the_image(image_dir: Path) -> None:
    image = f"oci:{image_dir / 'layout'}"
    config = LocalPoolConfig(
        containers=2,
        server=SlotServerSettings(
            slots_per_container=3, isolation=SlotIsolation(require_sandbox=True)
        ),
        image_cache_dir=image_dir / "cache",
    )
    async with (
        LocalSandboxPool(config) as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
        pool.lease("t", environment=image) as lease,
    ):
        router = ToolRouter(
            lease=lease, dispatcher=dispatcher, tool_server=None, offered=frozenset(),
            tool_timeout_s=30.0, trajectory_id="t",
        )  # fmt: skip
        tools = SlotTools(router, pool=pool, environment=image)
        await tools.write_file("turn.txt", "3")
        assert (await tools.run("echo root > /branch.txt")).exit_code == 0
        async with tools.fork(2) as forks:
            assert {fork.lease.slot.container for fork in forks} == {lease.slot.container}
            for number, fork in enumerate(forks):
                seen = await fork.run("cat turn.txt /branch.txt /etc/os-release")
                assert seen.stdout == "3root\n" + RELEASE
                assert (await fork.run(f"echo {number} > /fork.txt")).exit_code == 0
                await fork.write_file("turn.txt", f"4.{number}")
            seen_by = [await fork.run("cat /fork.txt turn.txt") for fork in forks]
            assert [report.stdout for report in seen_by] == ["0\n4.0", "1\n4.1"]
            assert (await tools.run("cat /branch.txt turn.txt")).stdout == "root\n3"
            assert not await tools.check("test -e /fork.txt")
            # the lease's server has no slot left for a third fork
            with pytest.raises(ForkRefused) as refused:
                async with tools.fork(1, timeout_s=0.2):
                    pass
            assert refused.value.reason == "no_slots"
        environments = pool.environment_statistics()
        assert (environments.snapshots, environments.forks) == (2, 2)
    stats = pool.statistics()
    assert (stats.leased, stats.quarantined) == (0, 0)
