"""``trajcore model SCRIPT``: a script of the model served as an OpenAI-compatible endpoint, so
that an env's Atropos ``process`` mode runs end to end with no model: the README's env and its
script, the group written with its scores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trajcore.adapters.tokenizers import qwen3_tokenizer_path

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "examples" / "hello.py"


def _environment() -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    environment.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled")
    return environment


@contextmanager
def _model(script: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    argv = [sys.executable, "-m", "trajcore.entrypoints.cli", "model", script]
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_environment()
    ) as process:
        try:
            assert process.stdout is not None
            url = process.stdout.readline().strip()  # its first line, once it listens
            assert url.startswith("http://127.0.0.1:"), url
            yield url, process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)


def test_process_mode_runs_against_the_script_served_as_a_model(tmp_path: Path) -> None:
    groups = tmp_path / "groups.jsonl"
    with _model(f"{HELLO}:solve") as (url, server):
        argv = [
            sys.executable, str(HELLO), "process",
            "--openai.base_url", url, "--openai.model_name", "stub-model",
            "--env.use_wandb", "false", "--env.total_steps", "1", "--env.group_size", "2",
            "--env.ensure_scores_are_not_same", "false",
            "--env.tokenizer_name", str(qwen3_tokenizer_path()),
            "--env.data_path_to_save_groups", str(groups),
        ]  # fmt: skip
        done = subprocess.run(
            argv, env=_environment(), capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert server.returncode == 128 + signal.SIGTERM
    (group,) = [json.loads(line) for line in groups.read_text().splitlines()]
    assert group["scores"] == [1.0, 1.0]
    for conversation in group["messages"]:
        assert conversation[-1]["content"] == "Done."  # the script's last step


def test_a_script_that_is_not_there_is_one_line_and_status_2() -> None:
    argv = [sys.executable, "-m", "trajcore.entrypoints.cli", "model", f"{HELLO}:nothing"]
    done = subprocess.run(
        argv, env=_environment(), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"trajcore model: {HELLO}:nothing: {HELLO} has no 'nothing'"
    )
