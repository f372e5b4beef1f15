"""``serve`` against a real Atropos ``run-api``: what ends a run whose groups keep failing.

Atropos runs each group in a worker task and logs and drops any exception it raises, so a bound
raised there (``GroupsFailing`` at ``max_failed_groups``) would stop nothing: the env would run
failing groups forever. The test starts ``run-api`` on loopback, registers as a trainer, starts
this file as an env whose score hook always raises, and checks that the env process ends by
itself, naming the failures, with nothing of its process group left.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from tests.integration.test_atropos_run_api import (
    RunApiEnv,
    _child_env,
    _free_port,
    _process_group,
    _wait_until,
)
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.messages import Message
from trajcore.rollout.tools import SlotTools


class BrokenScoreEnv(RunApiEnv):
    """Every score hook call raises: each member fails as ``env_error``, each group fails."""

    name = "broken_score_env"

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        raise RuntimeError("the score hook is broken")


@pytest.mark.slow
def test_failed_groups_in_a_row_end_a_serve_run(tmp_path: Path) -> None:
    deadline = time.monotonic() + 90
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    child_env = {**_child_env(tmp_path), "NO_PROXY": "*"}
    api_log, env_log = tmp_path / "run-api.log", tmp_path / "env.log"
    run_api = Path(sys.executable).parent / "run-api"
    with (
        _process_group(
            [str(run_api), "--host", "127.0.0.1", "--port", str(port)], api_log, child_env
        ),
        httpx.Client(base_url=url, timeout=5.0, trust_env=False) as trainer,
    ):

        def api_up() -> bool | None:
            try:
                return trainer.get("/").status_code == 200 or None
            except httpx.TransportError:
                return None

        _wait_until(deadline, "run-api to listen", [api_log], api_up)
        registered = trainer.post(
            "/register",
            json={
                "wandb_group": "trajcore", "wandb_project": "trajcore-test", "batch_size": 8,
                "max_token_len": 8192, "checkpoint_dir": str(tmp_path / "checkpoints"),
                "save_checkpoint_interval": -1, "starting_step": 0, "num_steps": 100,
            },
        )  # fmt: skip
        assert registered.status_code == 200
        trainer.get("/batch")  # starts the run
        argv = [
            sys.executable, __file__, "serve",
            "--env.rollout_server_url", url,
            "--env.tokenizer_name", str(qwen3_tokenizer_path()),
            "--env.mode", "managed",
            "--env.tool_call_parser", "hermes",
            "--env.use_wandb", "false",
            "--env.wandb_name", "broken_score_env",
            "--env.group_size", "4",
            "--env.max_token_length", "8192",
            "--env.max_turns", "3",
            "--env.max_tokens", "256",
            "--env.total_steps", "100",
            "--env.enabled_toolsets", "file,terminal",
            "--env.slot_lifetime_s", "30",
            "--env.max_failed_groups", "3",
        ]  # fmt: skip
        with _process_group(argv, env_log, child_env) as env:

            def ended() -> int | None:
                return env.poll()

            returncode = _wait_until(deadline, "the env to end", [env_log, api_log], ended)
        log = env_log.read_text(errors="replace")
        assert returncode != 0, log[-3000:]
        assert "groups in a row failed (max_failed_groups=3)" in log
        assert "env_error: score hook raised RuntimeError: the score hook is broken" in log
        assert trainer.get("/batch").json()["batch"] is None  # nothing was sent


if __name__ == "__main__":
    BrokenScoreEnv.cli()
