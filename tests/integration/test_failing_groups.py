"""A ``process`` run whose every group fails stops after ``max_failed_groups`` in a row, with an
error naming the last group's failures; before, Atropos took the next item forever, logging
only that it retried. Run as a real program (``failing_env.py``) over the fakes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trajcore.adapters.tokenizers import qwen3_tokenizer_path

SCRIPT = Path(__file__).with_name("failing_env.py")
LIMIT_S = 90.0


def _run(tmp_path: Path, failing: str, *extra: str) -> tuple[int, str]:
    argv = [
        sys.executable, str(SCRIPT), "process",
        "--env.tokenizer_name", str(qwen3_tokenizer_path()), "--env.use_wandb", "false",
        "--env.total_steps", "1", "--env.max_token_length", "4096", "--env.max_tokens", "64",
        "--env.data_path_to_save_groups", str(tmp_path / "groups.jsonl"), *extra,
    ]  # fmt: skip
    environment = {
        **os.environ, "FAILING_ENV": failing, "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
    }  # fmt: skip
    log = tmp_path / "env.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=environment, cwd=tmp_path,
            start_new_session=True,
        )  # fmt: skip
    try:
        code = process.wait(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        text = log.read_text(errors="replace")
        pytest.fail(f"still running after {LIMIT_S} s: {text[-1500:]}")
    return code, log.read_text(errors="replace")


@pytest.mark.slow
def test_a_run_whose_score_hook_always_raises_stops_naming_it(tmp_path: Path) -> None:
    code, text = _run(tmp_path, "score", "--env.max_failed_groups", "3")
    assert code != 0, text[-2000:]
    assert "3 groups in a row failed (max_failed_groups=3)" in text, text[-2000:]
    assert "members 0, 1 env_error: score hook raised ValueError: the reward's bug" in text
    assert "(at failing_env.py:" in text
    assert text.count("Failed to process group") <= 3, text[-2000:]


@pytest.mark.slow
def test_a_run_whose_model_server_fails_every_call_stops_naming_it(tmp_path: Path) -> None:
    code, text = _run(tmp_path, "model")
    assert code != 0, text[-2000:]
    assert "5 groups in a row failed (max_failed_groups=5)" in text, text[-2000:]
    assert "model_error" in text, text[-2000:]


@pytest.mark.slow
def test_a_run_whose_groups_are_healthy_is_not_stopped(tmp_path: Path) -> None:
    code, text = _run(tmp_path, "none", "--env.max_failed_groups", "1")
    assert code == 0, text[-2000:]
    assert "groups in a row failed" not in text
