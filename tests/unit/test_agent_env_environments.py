"""Task environments from the env: the ``task_environment`` hook and the ``environment_field``
of the built-in dataset, called once per group and named in every member's lease; a malformed
reference fails the group's members as ``env_error`` naming the field, before any slot is
leased; an image the pool refuses fails each member as ``infra_error`` naming the image (never
a score); the metrics count the leases. All against the fake pool, which honours images."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.unit.test_agent_env import _config, _turn
from trajcore.adapters.fakes.llm import FakeChatServer, LLMFault
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.agent_loop import StopReason
from trajcore.domain.groups import GroupStatus, TrajectoryStatus
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.rollout.tools import SlotTools

pytestmark = pytest.mark.anyio

IMAGE = "oci:/images/task-1"
RELEASE = "ID=task-1\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _reads_os_release() -> FakeChatServer:
    """The model reads the image's /etc/os-release once, then stops."""

    def respond(messages: Sequence[Message]) -> Any:
        if messages[-1].role == "tool":
            return _turn(Message.assistant("read it"))
        call = ToolCall(id="c", name="bash", arguments={"command": "cat /etc/os-release"})
        return _turn(Message.assistant("reading", tool_calls=[call]))

    return FakeChatServer(policy=respond)


class ImageEnv(AgentEnv[str]):
    """Items are image references; the score is whether the slot runs over the image."""

    name = "image_env"
    asked: list[str]

    async def get_next_item(self) -> str:
        return IMAGE

    def build_task(self, item: str) -> str:
        return "Read /etc/os-release."

    def task_environment(self, item: str) -> str | None:
        self.asked = [*getattr(self, "asked", []), item]
        return item

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        report = await tools.run("cat /etc/os-release")
        return 1.0 if report.stdout == RELEASE else 0.0


def _pool() -> FakeSandboxPool:
    files = {IMAGE: {"/etc/os-release": RELEASE}}
    return FakeSandboxPool(containers=1, slots_per_container=4, images=files)


async def test_every_member_leases_the_items_environment_and_verify_sees_the_image() -> None:
    env = ImageEnv(_config(group_size=3, ensure_scores_are_not_same=False))
    chat = _reads_os_release()
    async with _pool() as pool:
        result = await env.run_task(IMAGE, pool=pool, policy=env.make_policy(chat=chat))
    assert env.asked == [IMAGE]  # once per group
    assert result.environment == IMAGE
    assert result.verdict.member_scores == (1.0, 1.0, 1.0)
    assert sorted(r.holder for r in pool.environment_leases) == [
        m.trajectory_id for m in result.members
    ]
    assert {r.environment for r in pool.environment_leases} == {IMAGE}
    assert all(r.refusal is None for r in pool.environment_leases)
    # the model's own command ran over the image too
    outputs = [e.result.content for m in result.members for e in m.exchanges]
    assert outputs == [RELEASE] * 3


async def test_a_malformed_reference_fails_the_members_as_env_errors_before_any_lease() -> None:
    env = ImageEnv(_config(group_size=2, ensure_scores_are_not_same=False))
    async with _pool() as pool:
        result = await env.run_task(
            "ubuntu:22.04", pool=pool, policy=env.make_policy(chat=_reads_os_release())
        )
        assert pool.statistics().leases_granted == 0
    assert result.verdict.status is GroupStatus.FAILED
    for member in result.members:
        assert member.outcome.status is TrajectoryStatus.ENV_ERROR
        assert member.outcome.score is None
        assert "'ubuntu:22.04' names no known transport" in str(member.outcome.detail)
        assert str(member.outcome.detail).endswith("@ task_environment")
    assert pool.environment_leases == []


async def test_an_image_the_pool_refuses_fails_each_member_as_infra_naming_the_image(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = ImageEnv(_config(group_size=2, ensure_scores_are_not_same=False))
    caplog.set_level(logging.INFO, logger="trajcore")
    async with _pool() as pool:
        result = await env.run_task(
            "oci:/images/missing", pool=pool, policy=env.make_policy(chat=_reads_os_release())
        )
        stats = pool.statistics()
        metrics = env.service_metrics()
        environments = pool.environment_statistics()
    assert result.verdict.status is GroupStatus.FAILED
    assert result.verdict.member_scores == (None, None)
    for member in result.members:
        assert member.outcome.status is TrajectoryStatus.INFRA_ERROR
        detail = str(member.outcome.detail)
        assert "EnvironmentUnavailable: task environment oci:/images/missing" in detail
        assert "is not one of the fake pool's images" in detail
        assert member.stats.turns == 0
    assert (stats.leased, stats.free, stats.quarantined) == (0, 4, 0)  # released cleanly
    assert (environments.leases, environments.refused) == (2, 2)
    assert metrics == {}  # the services were closed with run_task
    assert any("over oci:/images/missing" in r.getMessage() for r in caplog.records)


async def test_the_environment_metrics_appear_once_there_were_leases() -> None:
    env = ImageEnv(_config(group_size=2, ensure_scores_are_not_same=False))
    async with (
        _pool() as pool,
        env.rollout_services(pool=pool, policy=env.make_policy(chat=_reads_os_release())),
    ):
        assert not any(k.startswith("trajcore/environments/") for k in env.service_metrics())
        await env.run_group(IMAGE)
        await env.run_group(IMAGE)
        metrics = env.service_metrics()
    assert metrics["trajcore/environments/leases"] == 4
    assert metrics["trajcore/environments/refused"] == 0
    assert metrics["trajcore/environments/misses"] == 1  # one container: made once
    assert metrics["trajcore/environments/hits"] == 3


class _ServerFiguresPool(FakeSandboxPool):
    """The fake pool, as a pool of slot servers: it counts the reads of its servers' figures."""

    figures_read = 0

    async def refresh_environment_figures(self) -> None:
        self.figures_read += 1


async def test_the_servers_figures_are_read_afresh_before_the_metrics_are_logged() -> None:
    env = ImageEnv(_config(group_size=2, ensure_scores_are_not_same=False))
    files = {IMAGE: {"/etc/os-release": RELEASE}}
    async with (
        _ServerFiguresPool(containers=1, slots_per_container=4, images=files) as pool,
        env.rollout_services(pool=pool, policy=env.make_policy(chat=_reads_os_release())),
    ):
        await env.wandb_log({})
        assert pool.figures_read == 0  # no lease over an environment yet: nothing to read
        await env.run_group(IMAGE)
        await env.wandb_log({})
        assert pool.figures_read == 1


# ----------------------------------------------------------------------- the dataset field


class RowsEnv(AgentEnv[dict[str, JSON]]):
    name = "rows"

    async def verify_and_score(
        self, item: dict[str, JSON], tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        report = await tools.run("cat /etc/os-release")
        return 1.0 if report.stdout == item.get("release") else 0.0


def _rows(tmp_path: Path, *rows: dict[str, JSON]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


async def test_the_dataset_field_names_each_rows_environment(tmp_path: Path) -> None:
    path = _rows(
        tmp_path,
        {"prompt": "read", "image": IMAGE, "release": RELEASE},
        {"prompt": "read", "image": None, "release": ""},
    )
    env = RowsEnv(
        _config(
            dataset=str(path), environment_field="image", group_size=2,
            ensure_scores_are_not_same=False,
        )
    )  # fmt: skip
    async with _pool() as pool:
        over = await env.run_task(
            await env.get_next_item(), pool=pool, policy=env.make_policy(chat=_reads_os_release())
        )
        plain = await env.run_task(
            await env.get_next_item(), pool=pool, policy=env.make_policy(chat=_reads_os_release())
        )
    assert (over.environment, plain.environment) == (IMAGE, None)
    assert over.verdict.member_scores == (1.0, 1.0)
    assert plain.verdict.member_scores == (1.0, 1.0)  # no image: no os-release in the fake
    assert [r.environment for r in pool.environment_leases] == [IMAGE, IMAGE]


async def test_the_dataset_field_is_off_by_default_and_a_row_without_it_is_named(
    tmp_path: Path,
) -> None:
    path = _rows(tmp_path, {"prompt": "read", "img": IMAGE, "release": RELEASE})
    off = RowsEnv(_config(dataset=str(path), group_size=1, ensure_scores_are_not_same=False))
    assert off.task_environment(await off.get_next_item()) is None
    env = RowsEnv(
        _config(
            dataset=str(path), environment_field="image", group_size=1,
            ensure_scores_are_not_same=False,
        )
    )  # fmt: skip
    async with _pool() as pool:
        result = await env.run_task(
            await env.get_next_item(), pool=pool, policy=env.make_policy(chat=_reads_os_release())
        )
    (member,) = result.members
    assert member.outcome.status is TrajectoryStatus.ENV_ERROR
    assert "@ environment_field" in str(member.outcome.detail)
    assert "no field 'image'" in str(member.outcome.detail)
    assert pool.environment_leases == []


async def test_a_malformed_reference_in_a_row_names_the_rows_field(tmp_path: Path) -> None:
    path = _rows(tmp_path, {"prompt": "read", "image": "images/task-1"})
    env = RowsEnv(
        _config(
            dataset=str(path), environment_field="image", group_size=1,
            ensure_scores_are_not_same=False,
        )
    )  # fmt: skip
    async with _pool() as pool:
        result = await env.run_task(
            await env.get_next_item(), pool=pool, policy=env.make_policy(chat=_reads_os_release())
        )
    (member,) = result.members
    assert member.outcome.status is TrajectoryStatus.ENV_ERROR
    assert str(member.outcome.detail).endswith("@ image")


# --------------------------------------------------------------------- preparation once


class PreparedEnv(ImageEnv):
    """Preparation writes a file and says how often it ran; verify needs the file."""

    preparations = 0

    async def prepare_workspace(self, item: str, tools: SlotTools) -> JSONObject | None:
        type(self).preparations += 1
        await tools.write_file("prepared.txt", "ready")
        return {"preparation": type(self).preparations}

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        return 1.0 if await tools.read_file("prepared.txt") == "ready" else 0.0


async def test_prepare_once_prepares_the_group_once_and_forks_every_member() -> None:
    PreparedEnv.preparations = 0
    env = PreparedEnv(_config(group_size=3, ensure_scores_are_not_same=False, prepare_once=True))
    async with _pool() as pool:
        result = await env.run_task(
            IMAGE, pool=pool, policy=env.make_policy(chat=_reads_os_release())
        )
        stats = pool.environment_statistics()
    assert PreparedEnv.preparations == 1
    assert result.verdict.member_scores == (1.0, 1.0, 1.0)
    assert [m.prepare_metadata for m in result.members] == [{"preparation": 1}] * 3
    records = pool.environment_leases
    assert [r.holder.rsplit("/", 1)[1] for r in records if not r.forked] == ["prepare"]
    assert sorted(r.holder for r in records if r.forked) == [
        m.trajectory_id for m in result.members
    ]
    assert (stats.snapshots, stats.forks) == (1, 3)
    assert pool._snapshots == {}  # dropped when the group ended


class ForgetfulPreparedEnv(PreparedEnv):
    """Its preparation forgets an await: the shared preparation is not frozen, and each member,
    preparing itself, fails as the env's error, never with a score."""

    async def prepare_workspace(self, item: str, tools: SlotTools) -> JSONObject | None:
        type(self).preparations += 1
        tools.write_file("prepared.txt", "ready")  # type: ignore[unused-coroutine]
        return None


async def test_a_preparation_done_once_that_forgets_an_await_fails_every_member() -> None:
    env = ForgetfulPreparedEnv(
        _config(group_size=2, ensure_scores_are_not_same=False, prepare_once=True)
    )
    async with _pool() as pool:
        result = await env.run_task(
            IMAGE, pool=pool, policy=env.make_policy(chat=_reads_os_release())
        )
        assert pool.environment_statistics().forks == 0  # nothing was frozen
    for member in result.members:
        assert member.outcome.status is TrajectoryStatus.ENV_ERROR
        assert "prepare hook called tools.write_file() at" in str(member.outcome.detail)


async def test_members_on_another_server_prepare_themselves() -> None:
    PreparedEnv.preparations = 0
    env = PreparedEnv(_config(group_size=4, ensure_scores_are_not_same=False, prepare_once=True))
    pool = FakeSandboxPool(
        containers=2, slots_per_container=2, images={IMAGE: {"/etc/os-release": RELEASE}}
    )
    async with pool:
        result = await env.run_task(
            IMAGE, pool=pool, policy=env.make_policy(chat=_reads_os_release())
        )
    assert result.verdict.member_scores == (1.0, 1.0, 1.0, 1.0)
    members = [r for r in pool.environment_leases if not r.holder.endswith("/prepare")]
    (prepare,) = [r for r in pool.environment_leases if r.holder.endswith("/prepare")]
    assert prepare.slot is not None
    forked = [r for r in members if r.forked]
    assert forked
    assert all(r.slot is not None and r.slot.container == prepare.slot.container for r in forked)
    assert PreparedEnv.preparations == 1 + (len(members) - len(forked))


async def test_a_preparation_done_once_spends_the_members_deadline_not_a_second_one() -> None:
    """slot_lifetime_s bounds the group from its start (below Atropos's worker_timeout): the
    members of a group prepared once get what the preparation left, as they would had each
    prepared itself; before, each got a whole lifetime after it."""

    class SlowPreparation(PreparedEnv):
        async def prepare_workspace(self, item: str, tools: SlotTools) -> JSONObject | None:
            await anyio.sleep(2.0)
            return await super().prepare_workspace(item, tools)

    SlowPreparation.preparations = 0
    env = SlowPreparation(
        _config(
            group_size=2, ensure_scores_are_not_same=False, prepare_once=True,
            slot_lifetime_s=2.4,
        )
    )  # fmt: skip
    chat = _reads_os_release()
    chat.inject(LLMFault.delay(30.0), LLMFault.delay(30.0))  # each member waits out its deadline
    async with _pool() as pool:
        started = anyio.current_time()
        result = await env.run_task(IMAGE, pool=pool, policy=env.make_policy(chat=chat))
        took = anyio.current_time() - started
    assert [m.stats.stop_reason for m in result.members] == [StopReason.TIME_BUDGET] * 2
    assert [m.prepare_metadata for m in result.members] == [{"preparation": 1}] * 2
    assert 2.3 < took < 3.6, took  # one lifetime (2.4 s), not the preparation and one more (4.4)


async def test_a_preparation_that_uses_the_whole_lifetime_fails_the_members_as_infra() -> None:
    class EndlessPreparation(PreparedEnv):
        async def prepare_workspace(self, item: str, tools: SlotTools) -> JSONObject | None:
            await anyio.sleep(30.0)
            return None

    env = EndlessPreparation(
        _config(
            group_size=2, ensure_scores_are_not_same=False, prepare_once=True,
            slot_lifetime_s=0.5,
        )
    )  # fmt: skip
    async with _pool() as pool:
        with anyio.fail_after(5):
            result = await env.run_task(
                IMAGE, pool=pool, policy=env.make_policy(chat=_reads_os_release())
            )
    for member in result.members:
        assert member.outcome.status is TrajectoryStatus.INFRA_ERROR
        assert member.outcome.score is None
        assert "preparation used the whole slot_lifetime_s (0.5 s)" in str(member.outcome.detail)


async def test_a_failed_preparation_leaves_each_member_to_prepare_and_report_it() -> None:
    class FailingEnv(PreparedEnv):
        async def prepare_workspace(self, item: str, tools: SlotTools) -> JSONObject | None:
            type(self).preparations += 1
            raise ValueError("no repository")

    FailingEnv.preparations = 0
    env = FailingEnv(_config(group_size=2, ensure_scores_are_not_same=False, prepare_once=True))
    async with _pool() as pool:
        result = await env.run_task(
            IMAGE, pool=pool, policy=env.make_policy(chat=_reads_os_release())
        )
        stats = pool.environment_statistics()
    assert FailingEnv.preparations == 3  # the preparation lease, then each member
    assert stats.snapshots == 0
    for member in result.members:
        assert member.outcome.status is TrajectoryStatus.ENV_ERROR
        assert "prepare hook raised ValueError: no repository" in str(member.outcome.detail)
