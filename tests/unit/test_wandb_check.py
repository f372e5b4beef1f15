"""``startup.check_wandb``: a run whose wandb cannot log is refused before it waits on anything
(Atropos's ``process`` turns ``use_wandb`` on whatever ``config_init`` set)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.atropos.startup import check_wandb


def _home(tmp_path: Path, netrc: str | None = None) -> dict[str, str]:
    if netrc is not None:
        (tmp_path / ".netrc").write_text(netrc)
        (tmp_path / ".netrc").chmod(0o600)
    return {"HOME": str(tmp_path)}


def test_wandb_on_without_credentials_is_refused_naming_the_ways_out(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        check_wandb(True, _home(tmp_path))
    assert caught.value.field == "use_wandb"
    for way_out in ("--env.use_wandb false", "WANDB_MODE=disabled", "wandb login"):
        assert way_out in caught.value.reason


@pytest.mark.parametrize(
    "extra",
    [
        {"WANDB_MODE": "disabled"},
        {"WANDB_MODE": "offline"},
        {"WANDB_MODE": "Disabled"},
        {"WANDB_DISABLED": "true"},
        {"WANDB_API_KEY": "k"},
    ],
)
def test_wandb_switched_off_or_with_a_key_passes(tmp_path: Path, extra: dict[str, str]) -> None:
    check_wandb(True, {**_home(tmp_path), **extra})


def test_wandb_off_passes_whatever_the_machine(tmp_path: Path) -> None:
    check_wandb(False, _home(tmp_path))


def test_a_netrc_login_for_wandbs_host_passes(tmp_path: Path) -> None:
    check_wandb(True, _home(tmp_path, "machine api.wandb.ai login user password k\n"))
    other = _home(tmp_path, "machine example.org login user password k\n")
    with pytest.raises(ConfigError):
        check_wandb(True, other)
    own = {**other, "WANDB_BASE_URL": "https://example.org"}  # a server of one's own
    check_wandb(True, own)


def test_netrc_names_the_file_to_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "creds"
    elsewhere.write_text("machine api.wandb.ai login user password k\n")
    elsewhere.chmod(0o600)
    check_wandb(True, {"HOME": str(tmp_path / "nobody"), "NETRC": str(elsewhere)})
