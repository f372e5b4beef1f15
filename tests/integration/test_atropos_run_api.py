"""A real Atropos ``run-api``, an AgentEnv in ``serve`` mode on the fakes, and a trainer stub.

The test starts atroposlib's ``run-api`` on a free loopback port, registers as a trainer, starts
this very file as an env (``python test_atropos_run_api.py serve --env.* ...``, the command an
env author runs) whose model is a fake token server and whose sandbox is the in-memory pool, and
pulls batches from ``/batch`` until two arrive. It checks what a trainer relies on: exactly
``batch_size`` sequences per batch, tokens and masks of equal length, ``-100`` outside the
completions, the sampled logprobs aligned with the tokens, scores that differ within a group,
and the groups marked token-exact. Both processes run in their own process groups and are
killed, group and all, at the end.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.processes import child_environment, process_group, run_api, wait_until
from trajcore.adapters.fakes.llm import FakeTokenServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.errors import SlotFileError
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.domain.token_ledger.ledger import MASKED_LABEL
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.ports.token_server import TokenServer
from trajcore.rollout.tools import SlotTools

GROUP_SIZE = 4
BATCH_SIZE = 8
LOGPROB = -0.5


class RunApiEnv(AgentEnv[str]):
    """Write ``done.txt``; the fake model gets it right about half the time."""

    name = "run_api_env"

    async def get_next_item(self) -> str:
        return "ok"

    async def eval_items(self) -> Sequence[str]:
        return ["ok"] * 4

    def build_task(self, item: str) -> str:
        return f"Create done.txt containing {item}."

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        try:
            return 1.0 if (await tools.read_file("done.txt")) == item else 0.0
        except SlotFileError:
            return 0.0

    def make_pool(self) -> AbstractAsyncContextManager[SandboxPool]:
        return FakeSandboxPool(containers=2, slots_per_container=4)

    def make_token_server(self) -> TokenServer:
        tokenizer = self.tokenizer_port()
        end = tokenizer.encode("<|im_end|>")
        parser = get_parser("hermes")
        ids = itertools.count()
        rng = random.Random(0)

        def respond(prompt: Sequence[int]) -> TokenCompletion:
            if tokenizer.decode(prompt).count("<|im_start|>assistant") > 1:
                text = "Done."
            else:
                content = "ok" if rng.random() < 0.5 else "no"
                call = ToolCall(
                    id=f"c{next(ids)}",
                    name="write_file",
                    arguments={"path": "done.txt", "content": content},
                )
                text = parser.render([call], content="Writing the file.")
            tokens = [*tokenizer.encode(text), *end]
            return TokenCompletion.of(tokens, [LOGPROB] * len(tokens), FinishReason.STOP)

        return FakeTokenServer(policy=respond)


def _child_env(tmp_path: Path) -> dict[str, str]:
    """The children's environment; their temporary files go under the test's own directory.

    A process that imports wandb makes temporary directories at import and removes them only on
    a clean exit; the serve-mode children end by signal, so those directories would stay in /tmp.
    """
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    return child_environment(scratch)


@pytest.mark.slow
def test_serve_mode_feeds_a_trainer_through_run_api(tmp_path: Path) -> None:
    started = time.monotonic()
    deadline = started + 80
    child_env = _child_env(tmp_path)
    api_log, env_log = tmp_path / "run-api.log", tmp_path / "env.log"
    with run_api(tmp_path, child_env, batch_size=BATCH_SIZE) as trainer:
        url = str(trainer.base_url).rstrip("/")
        argv = [
            sys.executable, __file__, "serve",
            "--env.rollout_server_url", url,
            "--env.tokenizer_name", str(qwen3_tokenizer_path()),
            "--env.mode", "managed",
            "--env.tool_call_parser", "hermes",
            "--env.use_wandb", "false",
            "--env.wandb_name", "run_api_env",
            "--env.include_messages", "true",
            "--env.group_size", str(GROUP_SIZE),
            "--env.max_token_length", "8192",
            "--env.max_turns", "3",
            "--env.max_tokens", "256",
            "--env.total_steps", "100",
            "--env.enabled_toolsets", "file,terminal",
            "--env.slot_lifetime_s", "30",
        ]  # fmt: skip
        batches: list[list[dict[str, Any]]] = []
        with process_group(argv, env_log, child_env):

            def next_batch() -> list[dict[str, Any]] | None:
                batch: list[dict[str, Any]] | None = trainer.get("/batch").json()["batch"]
                return batch

            while len(batches) < 2:
                batches.append(wait_until(deadline, "a batch", [env_log, api_log], next_batch))
    for batch in batches:
        assert sum(len(group["tokens"]) for group in batch) == BATCH_SIZE
        for group in batch:
            size = len(group["tokens"])
            assert size == GROUP_SIZE  # every member healthy: complete groups
            assert len(group["masks"]) == len(group["scores"]) == size
            assert len(group["messages"]) == size
            assert len(set(group["scores"])) > 1  # Atropos drops groups of equal scores
            assert set(group["scores"]) <= {0.0, 1.0}
            assert group["group_overrides"]["token_exact"] is True
            logprobs = group["inference_logprobs"]
            assert logprobs is not None
            for tokens, masks, lps in zip(group["tokens"], group["masks"], logprobs, strict=True):
                assert len(tokens) == len(masks) == len(lps)
                trained = [i for i, m in enumerate(masks) if m != MASKED_LABEL]
                assert trained
                assert all(masks[i] == tokens[i] and lps[i] == LOGPROB for i in trained)
                assert masks[0] == MASKED_LABEL  # the prompt is never trained on
            for messages in group["messages"]:
                assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
                assert messages[1]["tool_calls"][0]["function"]["name"] == "write_file"


@pytest.mark.slow
def test_process_and_evaluate_commands_write_their_files(tmp_path: Path) -> None:
    child_env = _child_env(tmp_path)
    common = [
        "--env.tokenizer_name", str(qwen3_tokenizer_path()),
        "--env.mode", "managed",
        "--env.tool_call_parser", "hermes",
        "--env.max_token_length", "8192",
        "--env.max_tokens", "256",
        "--env.slot_lifetime_s", "30",
    ]  # fmt: skip
    groups = tmp_path / "groups.jsonl"
    process = subprocess.run(
        [sys.executable, __file__, "process", *common, "--env.total_steps", "2",
         "--env.group_size", str(GROUP_SIZE), "--env.data_path_to_save_groups", str(groups)],
        env=child_env, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr.decode(errors="replace")[-3000:]
    written = [json.loads(line) for line in groups.read_text().splitlines()]
    assert len(written) == 2
    for group in written:
        assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == GROUP_SIZE
        assert group["group_overrides"]["token_exact"] is True
    assert groups.with_suffix(".html").is_file()

    evals = tmp_path / "evals"
    evaluate = subprocess.run(
        [sys.executable, __file__, "evaluate", *common, "--env.use_wandb", "false",
         "--env.data_dir_to_save_evals", str(evals)],
        env=child_env, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert evaluate.returncode == 0, evaluate.stderr.decode(errors="replace")[-3000:]
    metrics = json.loads((evals / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/items"] == 4
    assert 0.0 <= metrics["eval/mean_score"] <= 1.0
    assert len((evals / "samples.jsonl").read_text().splitlines()) == 4


if __name__ == "__main__":
    RunApiEnv.cli()
