"""Where ``trajcore slot-server`` gets its bearer token: a file, or an environment variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.slot_server import _config, parse_args

TOKEN = "a-token-of-sixteen-or-more"
VARIABLE = "TRAJCORE_TEST_SLOT_TOKEN"


def _args(root: Path, *extra: str) -> list[str]:
    return ["--slots", "1", "--root", str(root), "--listen", "127.0.0.1:0", *extra]


def test_the_token_comes_from_the_named_variable_which_is_then_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, f"  {TOKEN}\n")
    _, token = _config(parse_args(_args(tmp_path, "--token-env", VARIABLE)))
    assert token == TOKEN
    # the sandboxes never see it, and neither does anything else the server starts
    assert VARIABLE not in os.environ


@pytest.mark.parametrize("value", [None, "", "   "])
def test_an_unset_or_empty_variable_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(VARIABLE, raising=False)
    else:
        monkeypatch.setenv(VARIABLE, value)
    with pytest.raises(ConfigError) as caught:
        _config(parse_args(_args(tmp_path, "--token-env", VARIABLE)))
    assert caught.value.field == "--token-env"
    assert VARIABLE in caught.value.reason


def test_the_token_file_still_works(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    _, token = _config(parse_args(_args(tmp_path / "root", "--token-file", str(token_file))))
    assert token == TOKEN


def test_tcp_without_any_token_names_both_ways(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _config(parse_args(_args(tmp_path)))
    assert "--token-env" in caught.value.reason


def test_a_file_and_a_variable_together_are_a_usage_error(tmp_path: Path) -> None:
    argv = _args(tmp_path, "--token-file", str(tmp_path / "t"), "--token-env", VARIABLE)
    run = subprocess.run(
        [sys.executable, "-m", "trajcore.entrypoints.slot_server", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert "--token-env" in run.stderr
    assert "not allowed with" in run.stderr
