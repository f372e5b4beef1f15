"""``python my_env.py process ...`` with a setting that cannot work: one line naming the setting
and why (a mistyped flag gets the setting it most likely meant; a value of the wrong type is
refused at its flag, in every command), exit status 2, no traceback;
as ``trajcore run`` answers the same mistakes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trajcore.adapters.tokenizers import qwen3_tokenizer_path

pytestmark = pytest.mark.slow

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello.py"


def _process(*flags: str, command: str = "process") -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    environment.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled")
    argv = [sys.executable, str(HELLO), command, "--env.use_wandb", "false", *flags]
    return subprocess.run(
        argv, env=environment, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (
            ("--env.group_sise", "2"),
            "HelloEnv: unknown setting; did you mean --env.group_size? @ env.group_sise",
        ),
        (
            ("--env.max_turns", "0"),
            "HelloEnv: Input should be greater than or equal to 1 @ max_turns",
        ),
    ],
    ids=["typo", "out_of_range"],
)
def test_a_setting_that_cannot_work_is_one_line_and_status_2(
    flags: tuple[str, ...], said: str
) -> None:
    done = _process(*flags, "--env.tokenizer_name", str(qwen3_tokenizer_path()))
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == said, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


_NOT_AN_INTEGER = "Input should be a valid integer, unable to parse string as an integer"


@pytest.mark.parametrize(
    ("command", "flags", "said"),
    [
        (command, ("--env.group_size", "two"), f"HelloEnv: {_NOT_AN_INTEGER} @ env.group_size")
        for command in ("serve", "process", "evaluate")
    ]
    + [("process", ("--openai.timeout", "abc"), f"HelloEnv: {_NOT_AN_INTEGER} @ openai.timeout")],
    ids=["serve", "process", "evaluate", "openai"],
)
def test_a_value_of_the_wrong_type_is_one_line_naming_the_flag_and_status_2(
    command: str, flags: tuple[str, ...], said: str
) -> None:
    done = _process(*flags, command=command)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == said, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
