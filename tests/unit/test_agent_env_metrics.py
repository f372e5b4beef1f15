"""Metrics: hermes's tool-error metrics, drift in the group log line, pool and dispatcher
statistics as ``trajcore/pool/*`` and ``trajcore/dispatcher/*``."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from tests.unit.test_agent_env import FileEnv, _alternating_chat, _config, _turn, _write
from trajcore.adapters.fakes.llm import FakeChatServer, FakeTokenServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _failing_reads() -> FakeChatServer:
    ids = itertools.count()

    def respond(messages: Sequence[Message]) -> Any:
        if messages[-1].role == "tool":
            return _turn(Message.assistant("done"))
        n = next(ids)
        call = ToolCall(id=f"r{n}", name="read_file", arguments={"path": f"missing-{n}.txt"})
        return _turn(Message.assistant("reading", tool_calls=[call]))

    return FakeChatServer(policy=respond)


async def test_hermes_tool_error_metrics_are_logged_and_start_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = FileEnv(_config(group_size=2, ensure_scores_are_not_same=False))
    caplog.set_level(logging.INFO, logger="trajcore.env")
    async with (
        FakeSandboxPool() as pool,
        env.rollout_services(pool=pool, policy=env.make_policy(chat=_failing_reads())),
    ):
        await env.collect_trajectories("ok")
        assert env.tool_error_metrics()["train/tool_errors_count"] == 2
        details = env._counters.details()
        lines = details.splitlines()
        assert len(lines) == 2
        assert all(line.startswith("[turn 1] read_file({") for line in lines)
        assert all("-> tool_error: " in line for line in lines)
        await env.wandb_log({})
    logged = next(r.getMessage() for r in caplog.records if "trajcore metrics" in r.getMessage())
    metrics = json.loads(logged.split("trajcore metrics: ", 1)[1])
    assert metrics["train/tool_errors_count"] == 2
    assert env.tool_error_metrics()["train/tool_errors_count"] == 0
    assert env._counters.details() == ""


async def test_pool_and_dispatcher_statistics_are_metrics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = FileEnv(_config(group_size=4))
    assert env.service_metrics() == {}
    caplog.set_level(logging.INFO, logger="trajcore.env")
    async with (
        FakeSandboxPool(containers=1, slots_per_container=4) as pool,
        env.rollout_services(pool=pool, policy=env.make_policy(chat=_alternating_chat())),
    ):
        await env.collect_trajectories("ok")
        metrics = env.service_metrics()
        await env.wandb_log({})
    assert metrics["trajcore/pool/free"] == 4
    assert metrics["trajcore/pool/leased"] == 0
    assert metrics["trajcore/pool/waiting"] == 0
    assert metrics["trajcore/pool/quarantined"] == 0
    assert metrics["trajcore/pool/leases_granted"] == 4
    assert metrics["trajcore/dispatcher/calls"] >= 8  # 4 prepare writes + 4 model writes (+reads)
    batches = metrics["trajcore/dispatcher/batches"]
    assert 1 <= batches <= metrics["trajcore/dispatcher/calls"]
    assert metrics["trajcore/dispatcher/calls_per_batch"] == (
        metrics["trajcore/dispatcher/calls"] / batches
    )
    logged = next(r.getMessage() for r in caplog.records if "trajcore metrics" in r.getMessage())
    assert '"trajcore/pool/free": 4.0' in logged


async def test_the_group_log_line_says_the_drift(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trajcore.env")
    openai_env = FileEnv(_config(group_size=2))
    async with FakeSandboxPool() as pool:
        await openai_env.run_task(
            "ok", pool=pool, policy=openai_env.make_policy(chat=_alternating_chat())
        )
    env = FileEnv(_config(mode="managed", tool_call_parser="hermes", group_size=2))
    tokenizer = env.tokenizer_port()
    im_end = tokenizer.encode("<|im_end|>")
    parser = get_parser("hermes")

    def respond(prompt: Sequence[int]) -> TokenCompletion:
        done = tokenizer.decode(prompt).count("<|im_start|>assistant") > 1
        text = "Done." if done else parser.render([_write("x", "ok")], content="Writing.")
        ids = [*tokenizer.encode(text), *im_end]
        return TokenCompletion.of(ids, [-0.5] * len(ids), FinishReason.STOP)

    async with FakeSandboxPool() as pool:
        managed = await env.run_task(
            "ok", pool=pool, policy=env.make_policy(token=FakeTokenServer(policy=respond))
        )
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("group ")]
    assert len(lines) == 2
    assert "drift not measured (tokens not exact)" in lines[0]
    drifts = [m.drift for m in managed.members if m.drift is not None]
    assert len(drifts) == 2
    drifted = sum(not d.exact for d in drifts)
    tokens = sum(d.ledger_only_tokens + d.rendered_only_tokens for d in drifts)
    assert f"drift {drifted}/2 members, {tokens} tokens" in lines[1]
