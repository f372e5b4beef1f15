"""``serve`` against a real Atropos ``run-api``: failing groups, and groups the pool cannot hold.

- Atropos runs each group in a worker task and logs and drops any exception it raises, so a
  bound raised there (``GroupsFailing`` at ``max_failed_groups``) would stop nothing: the env
  would run failing groups forever. The env process must end by itself, naming the failures.
- Atropos starts up to 8 groups at once by default, whatever the pool holds; the members that
  wait for a slot spend their deadline waiting and fail as ``infra_error``. ``serve`` runs at
  most the groups the pool's slots hold, so no member waits out its deadline.
- ``run-api`` not reachable: Atropos's quick retries end in tenacity's ``RetryError``, which
  names neither the URL nor the setting; ``serve`` ends naming ``rollout_server_url``.

Each test starts ``run-api`` on loopback, registers as a trainer and starts this file as the
env (``ENV_KIND`` picks which), and kills both process groups at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from tests.integration.test_atropos_run_api import RunApiEnv, _child_env
from tests.processes import free_port, process_group, run_api, wait_until
from trajcore.adapters.fakes.llm import FakeTokenServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams, TokenCompletion
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.ports.token_server import TokenServer
from trajcore.rollout.tools import SlotTools

TURN_S = 1.0  # the slow model's seconds per turn


class BrokenScoreEnv(RunApiEnv):
    """Every score hook call raises: each member fails as ``env_error``, each group fails."""

    name = "broken_score_env"

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        raise RuntimeError("the score hook is broken")


class SlowTokenServer(FakeTokenServer):
    """The fake model, taking ``TURN_S`` per turn."""

    async def generate(
        self, prompt_ids: Sequence[int], *, sampling: SamplingParams
    ) -> TokenCompletion:
        await anyio.sleep(TURN_S)
        return await super().generate(prompt_ids, sampling=sampling)


class SmallPoolEnv(RunApiEnv):
    """A slow model and a pool of 8 slots: 2 groups of 4 at once."""

    name = "small_pool_env"

    def make_pool(self) -> AbstractAsyncContextManager[SandboxPool]:
        return FakeSandboxPool(containers=2, slots_per_container=4)

    def make_token_server(self) -> TokenServer:
        fast = super().make_token_server()
        assert isinstance(fast, FakeTokenServer)
        return SlowTokenServer(policy=fast.policy)


def _common_flags(url: str, name: str) -> list[str]:
    return [
        "--env.rollout_server_url", url,
        "--env.tokenizer_name", str(qwen3_tokenizer_path()),
        "--env.mode", "managed",
        "--env.tool_call_parser", "hermes",
        "--env.use_wandb", "false",
        "--env.wandb_name", name,
        "--env.group_size", "4",
        "--env.max_token_length", "8192",
        "--env.max_turns", "3",
        "--env.max_tokens", "256",
        "--env.total_steps", "100",
        "--env.enabled_toolsets", "file,terminal",
    ]  # fmt: skip


@contextmanager
def _trainer(tmp_path: Path) -> Iterator[tuple[str, httpx.Client, Path]]:
    """``run-api`` on a free loopback port, registered with as a trainer (batch size 8)."""
    with run_api(tmp_path, _env(tmp_path), batch_size=8) as trainer:
        yield str(trainer.base_url).rstrip("/"), trainer, tmp_path / "run-api.log"


def _env(tmp_path: Path, kind: str = "") -> dict[str, str]:
    return {**_child_env(tmp_path), "ENV_KIND": kind}  # run as the env, it imports tests.*


@pytest.mark.slow
def test_failed_groups_in_a_row_end_a_serve_run(tmp_path: Path) -> None:
    deadline = time.monotonic() + 90
    env_log = tmp_path / "env.log"
    with _trainer(tmp_path) as (url, trainer, api_log):
        argv = [
            sys.executable, __file__, "serve", *_common_flags(url, "broken_score_env"),
            "--env.slot_lifetime_s", "30", "--env.max_failed_groups", "3",
        ]  # fmt: skip
        with process_group(argv, env_log, _env(tmp_path, "broken")) as env:

            def ended() -> int | None:
                return env.poll()

            returncode = wait_until(deadline, "the env to end", [env_log, api_log], ended)
        log = env_log.read_text(errors="replace")
        assert returncode != 0, log[-3000:]
        assert "groups in a row failed (max_failed_groups=3)" in log
        assert "env_error: score hook raised RuntimeError: the score hook is broken" in log
        assert trainer.get("/batch").json()["batch"] is None  # nothing was sent


@pytest.mark.slow
def test_serve_runs_no_more_groups_than_the_pools_slots_hold(tmp_path: Path) -> None:
    deadline = time.monotonic() + 120
    env_log = tmp_path / "env.log"
    with _trainer(tmp_path) as (url, trainer, api_log):
        argv = [
            sys.executable, __file__, "serve", *_common_flags(url, "small_pool_env"),
            "--env.slot_lifetime_s", str(3.5 * TURN_S), "--env.max_failed_groups", "1000",
        ]  # fmt: skip
        batches: list[list[dict[str, object]]] = []
        with process_group(argv, env_log, _env(tmp_path, "small_pool")):

            def next_batch() -> list[dict[str, object]] | None:
                batch: list[dict[str, object]] | None = trainer.get("/batch").json()["batch"]
                return batch

            while len(batches) < 2:
                batches.append(wait_until(deadline, "a batch", [env_log, api_log], next_batch))
    log = env_log.read_text(errors="replace")
    assert "no slot before the trajectory deadline" not in log
    assert "infra_error" not in log
    assert "serve runs at most 2 groups at once: 8 slots hold 2 groups of group_size=4" in log


@pytest.mark.slow
def test_serve_without_run_api_ends_naming_rollout_server_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    argv = [sys.executable, __file__, "serve", *_common_flags(url, "no_api_env")]
    ended = subprocess.run(
        argv, env=_env(tmp_path, "small_pool"), capture_output=True, timeout=90, check=False
    )
    err = ended.stderr.decode(errors="replace")
    assert ended.returncode != 0
    assert f"TrainerApiUnavailable: rollout_server_url: the trainer's API at {url} could " in err
    assert "start run-api and register the trainer before serve" in err


if __name__ == "__main__":
    {"broken": BrokenScoreEnv, "small_pool": SmallPoolEnv}[os.environ["ENV_KIND"]].cli()
