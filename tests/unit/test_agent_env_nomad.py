"""AgentEnv with ``sandbox="nomad"``: settings checked at start, a real run over the fake Nomad.

The env builds its ``NomadSandboxPool`` from the ``nomad_*`` fields; a bad one fails at start
named by its env field. The run goes through ``make_pool`` to the fake Nomad API, whose
allocations are real slot servers.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Sequence
from typing import Any

import pytest

from tests.nomad_testbed import OPENAPI, SLOT_SERVER
from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.pools.nomad_pool import NomadSandboxPool
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.errors import ConfigError, SlotFileError
from trajcore.domain.groups import GroupStatus
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.rollout.tools import SlotTools
from trajcore.testing.fake_nomad.agent import FakeNomadAPI

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class DoneEnv(AgentEnv[str]):
    """The model must write the item's text to ``done.txt``."""

    name = "done_env"

    async def get_next_item(self) -> str:
        return "ok"

    def build_task(self, item: str) -> str:
        return f"Write {item} to done.txt."

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        try:
            return 1.0 if (await tools.read_file("done.txt")) == item else 0.0
        except SlotFileError:
            return 0.0


def _config(**fields: Any) -> AgentEnvConfig:
    base: dict[str, Any] = {
        "tokenizer_name": str(qwen3_tokenizer_path()),
        "use_wandb": False,
        "group_size": 2,
        "max_turns": 3,
        "max_token_length": 8192,
        "slot_lifetime_s": 30.0,
        "acquire_timeout_s": 20.0,
        "terminal_timeout_s": 5.0,
        "sandbox": "nomad",
    }
    base.update(fields)
    return AgentEnvConfig(**base)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"nomad_address": "nomad.internal:4646"}, "nomad_address"),
        ({"nomad_driver": "podman"}, "nomad_driver"),
        ({"nomad_image": ""}, "nomad_image"),
        ({"nomad_job_id": "my slots"}, "nomad_job_id"),
        ({"nomad_command": ""}, "nomad_command"),
        ({"nomad_token": " "}, "nomad_token"),
        ({"nomad_namespace": "a b"}, "nomad_namespace"),
        ({"nomad_datacenters": ","}, "nomad_datacenters"),
        ({"nomad_driver": "raw_exec", "privileged": True}, "privileged"),
        ({"min_containers": 3, "max_containers": 2}, "max_containers"),
        ({"nomad_artifacts": "[{}]", "image_cache_dir": "/cache"}, "nomad_artifacts"),
        ({"nomad_artifacts": '{"source": "/a"}', "image_cache_dir": "/cache"}, "nomad_artifacts"),
        ({"nomad_artifacts": "not json", "image_cache_dir": "/cache"}, "nomad_artifacts"),
        (
            {"nomad_artifacts": '[{"source": "/a", "destination": "../up"}]'},
            "nomad_artifacts",
        ),
        ({"nomad_image_cache_volume": "cache"}, "image_cache_dir"),  # a volume for no cache
        ({"nomad_client_alloc_dir": "/var/lib/nomad/alloc"}, "nomad_client_alloc_dir"),  # docker
    ],
)
def test_bad_nomad_settings_fail_at_start_named_by_their_env_field(
    fields: dict[str, Any], field: str
) -> None:
    config = _config(tokenizer_name="/no/such/tokenizer", **fields)
    with pytest.raises(ConfigError) as caught:
        DoneEnv(config)  # before Atropos loads the (missing) tokenizer
    assert caught.value.field == field


def test_the_pool_settings_come_from_the_env_fields() -> None:
    config = _config(
        nomad_address="https://nomad.internal:4646",
        nomad_job_id="rl-slots",
        nomad_image="registry/trajcore:1",
        nomad_token="acl-secret",
        nomad_namespace="rl",
        nomad_region="eu",
        nomad_datacenters="dc1, dc2",
        slots_per_container=4,
        min_containers=2,
        max_containers=6,
        privileged=True,
        purge_on_start=True,
        purge_on_shutdown=False,
        allow_network=True,
        require_stateful_sandbox=True,
    )
    pool = config.nomad_pool_config()
    assert (pool.address, pool.job.job_id, pool.job.driver, pool.job.image) == (
        "https://nomad.internal:4646", "rl-slots", "docker", "registry/trajcore:1",
    )  # fmt: skip
    assert (pool.token, pool.job.namespace, pool.job.region) == ("acl-secret", "rl", "eu")
    assert pool.job.datacenters == ("dc1", "dc2")
    assert pool.job.command == ("trajcore", "slot-server")
    server = pool.server
    scaling = pool.scaling
    assert (server.slots_per_container, scaling.min_containers, scaling.max_containers) == (4, 2, 6)
    assert (pool.job.privileged, pool.purge_on_start, pool.purge_on_shutdown) == (True, True, False)
    assert server.acquire_timeout_s == 20.0
    assert server.isolation.allow_network is True
    assert server.isolation.require_sandbox is True  # the persistent shell lives in the sandbox
    assert server.require_tmux is True
    assert server.isolation.default_timeout_s == 5.0
    assert server.start_timeout_s == 120.0  # the Nomad pool's own, kept
    assert isinstance(DoneEnv(config).make_pool(), NomadSandboxPool)


async def test_a_group_runs_on_slot_servers_that_nomad_schedules() -> None:
    ids = itertools.count()

    def respond(messages: Sequence[Message]) -> ChatTurn:
        if messages[-1].role == "tool":
            return ChatTurn(message=Message.assistant("done"), finish_reason=FinishReason.STOP)
        call = ToolCall(
            id=f"w{next(ids)}", name="write_file", arguments={"path": "done.txt", "content": "ok"}
        )
        return ChatTurn(
            message=Message.assistant("writing", tool_calls=[call]),
            finish_reason=FinishReason.TOOL_CALLS,
        )

    async with FakeNomadAPI(openapi=OPENAPI) as fake:
        env = DoneEnv(
            _config(
                nomad_address=fake.address,
                nomad_driver="raw_exec",
                nomad_command=shlex.join(SLOT_SERVER),
                slots_per_container=2,
                min_containers=1,
                max_containers=1,
            )
        )
        result = await env.run_task(
            "ok", policy=env.make_policy(chat=FakeChatServer(policy=respond))
        )
        assert fake.job("trajcore-slots") is None  # purged when the run's services closed
        assert fake.violations == []
    assert result.verdict.status is GroupStatus.COMPLETE
    assert result.verdict.member_scores == (1.0, 1.0)
    assert any(r.path == "/v1/job/trajcore-slots" and r.method == "POST" for r in fake.requests)


def test_task_environments_on_nomad_come_from_the_env_fields() -> None:
    """The cache's host volume, the artifacts (a JSON list) and the raw_exec clients'
    allocation directory each reach the job from a flag of their own."""
    docker = _config(
        image_cache_dir="/cache",
        nomad_image_cache_volume="trajcore-cache",
        nomad_artifacts=(
            '[{"source": "https://store.internal/task-17.tar", "destination": "task-17.tar",'
            ' "checksum": "sha256:' + "0" * 64 + '"},'
            ' {"source": "/srv/layouts/task-18", "destination": "task-18", "unpack": true}]'
        ),
    ).nomad_pool_config()
    assert docker.job.image_cache_volume == "trajcore-cache"
    assert [(a.source, a.destination, a.unpack) for a in docker.job.artifacts] == [
        ("https://store.internal/task-17.tar", "task-17.tar", False),
        ("/srv/layouts/task-18", "task-18", True),
    ]
    assert docker.job.artifacts[0].checksum == "sha256:" + "0" * 64
    raw = _config(
        image_cache_dir="/cache",
        nomad_driver="raw_exec",
        nomad_client_alloc_dir="/var/lib/nomad/alloc",
    ).nomad_pool_config()
    assert raw.job.client_alloc_dir == "/var/lib/nomad/alloc"
    assert raw.job.artifacts == ()
    assert raw.job.image_cache_volume is None
