"""``startup.check_wandb``: a run whose wandb has no credentials anywhere is refused before it
waits on anything (Atropos's ``process`` turns ``use_wandb`` on whatever ``config_init`` set);
any place wandb reads a key from lets wandb decide."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.atropos.startup import check_wandb


def _bare(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path)}


def test_wandb_on_without_credentials_is_refused_naming_the_ways_out(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        check_wandb(True, _bare(tmp_path))
    assert caught.value.field == "use_wandb"
    for way_out in ("--env.use_wandb false", "WANDB_MODE=disabled", "wandb login"):
        assert way_out in caught.value.reason
    assert str(tmp_path / ".netrc") in caught.value.reason


@pytest.mark.parametrize(
    "extra",
    [
        {"WANDB_MODE": "disabled"},
        {"WANDB_MODE": "offline"},
        {"WANDB_MODE": "Disabled"},
        {"WANDB_DISABLED": "true"},
        {"WANDB_API_KEY": "k"},
        {"WANDB_IDENTITY_TOKEN_FILE": "/x"},
    ],
)
def test_wandb_switched_off_or_with_a_key_passes(tmp_path: Path, extra: dict[str, str]) -> None:
    check_wandb(True, {**_bare(tmp_path), **extra})


def test_wandb_off_passes_whatever_the_machine(tmp_path: Path) -> None:
    check_wandb(False, _bare(tmp_path))


@pytest.mark.parametrize(
    "place", [".netrc", "_netrc", ".config/wandb/settings", "elsewhere/netrc", "conf/settings"]
)
def test_any_place_wandb_reads_a_key_from_lets_wandb_decide(tmp_path: Path, place: str) -> None:
    # a `wandb login` for whichever host wandb's version uses, or its settings file
    (tmp_path / place).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / place).write_text("machine any.host login user password k\n")
    env = {**_bare(tmp_path), "NETRC": str(tmp_path / "elsewhere/netrc")}
    env["WANDB_CONFIG_DIR"] = str(tmp_path / "conf") if place.startswith("conf") else ""
    check_wandb(True, env)
