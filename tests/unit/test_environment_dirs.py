"""The folders ``directory:`` trees may come from (``environment_dirs``): carried from the env's
settings and the pools' to the slot server's ``--environment-dir``, and refused at start when a
listed folder is ``/`` or holds (or lies in) the server's root or the image cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajcore.adapters.pools.container_pool import ContainerPoolConfig
from trajcore.adapters.pools.local_pool import LocalPoolConfig
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig, check_config
from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.atropos.sandbox_settings import SandboxSettings
from trajcore.entrypoints.slot_server import _config, parse_args


def _runtime(tmp_path: Path, *folders: Path, cache: bool = True) -> RuntimeConfig:
    return RuntimeConfig(
        slots=1,
        root=tmp_path / "server" / "root",
        image_cache=tmp_path / "cache" if cache else None,
        environment_dirs=folders,
        slot_uid_lock=None,
    )


def test_a_listed_folder_apart_from_the_servers_own_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "trees").mkdir()
    check_config(_runtime(tmp_path, tmp_path / "trees"))
    check_config(_runtime(tmp_path))  # none listed: every directory: is refused at its lease


@pytest.mark.parametrize(
    ("listed", "reason"),
    [
        ("/", "the host's root"),
        ("{tmp}", "holds or lies in the server's root"),
        ("{tmp}/server", "holds or lies in the server's root"),
        ("{tmp}/server/root/slots", "holds or lies in the server's root"),
        ("{tmp}/cache", "holds or lies in the server's image_cache"),
        ("{tmp}/missing", "is not an absolute directory"),
    ],
)
def test_a_folder_that_would_show_the_servers_own_is_refused_at_start(
    tmp_path: Path, listed: str, reason: str
) -> None:
    for folder in ("server/root/slots", "cache"):
        (tmp_path / folder).mkdir(parents=True)
    named = Path(listed.format(tmp=tmp_path))
    with pytest.raises(ConfigError, match=reason) as refused:
        check_config(_runtime(tmp_path, named))
    assert refused.value.field == "environment_dirs"
    argv = ["--slots", "1", "--root", str(tmp_path / "server" / "root"), "--unix", "s"]
    argv += ["--slot-uid-lock", "none", "--image-cache", str(tmp_path / "cache")]
    argv += ["--environment-dir", str(named)]
    with pytest.raises(ConfigError, match=reason) as flagged:
        _config(parse_args(argv))
    assert flagged.value.field == "--environment-dir"


def test_a_list_without_an_image_cache_is_refused(tmp_path: Path) -> None:
    (tmp_path / "trees").mkdir()
    with pytest.raises(ConfigError, match="need an image_cache"):
        check_config(_runtime(tmp_path, tmp_path / "trees", cache=False))
    with pytest.raises(ConfigError, match="image_cache_dir") as refused:
        LocalPoolConfig(environment_dirs=(tmp_path / "trees",))
    assert refused.value.field == "environment_dirs"


def test_the_list_travels_from_the_envs_settings_to_the_servers_flags() -> None:
    settings = SandboxSettings(image_cache_dir="/var/cache/images", environment_dirs="/a, /b/c")
    local = settings.local_pool_config()
    assert local.environment_dirs == (Path("/a"), Path("/b/c"))
    argv = local.server_argv(root=Path("/r"), listen=[])
    assert argv[argv.index("--image-cache") :][-4:] == [
        "--environment-dir", "/a", "--environment-dir", "/b/c",
    ]  # fmt: skip
    # the container pool's folders are mounted at their paths, and listed alike
    container = ContainerPoolConfig(image_cache_dir=Path("/c"), environment_dirs="/layouts")
    assert container.server_args(0)[-2:] == ["--environment-dir", "/layouts"]
    assert "/layouts:/layouts:ro" in container.volume_args()
    with pytest.raises(ConfigError) as refused:
        SandboxSettings(image_cache_dir="/c", environment_dirs="relative").local_pool_config()
    assert refused.value.field == "environment_dirs"


def test_a_list_the_chosen_pool_does_not_read_is_refused_naming_what_it_reads() -> None:
    """``environment_dirs`` is the local pool's: the container pool reads its mounted folders
    (``container_environment_dirs``) and the Nomad pool takes no ``directory:`` tree, so the
    setting given with either is refused, never dropped."""
    given = SandboxSettings(image_cache_dir="/c", environment_dirs="/trees")
    with pytest.raises(ConfigError) as refused:
        given.container_pool_config()
    assert (refused.value.field, refused.value.reason) == (
        "environment_dirs",
        "the container pool takes directory: trees only from the folders it mounts: set "
        "container_environment_dirs instead",
    )
    with pytest.raises(ConfigError) as refused:
        given.nomad_pool_config()
    assert refused.value.field == "environment_dirs"
    assert "the Nomad pool takes no directory: trees" in refused.value.reason
    both = SandboxSettings(
        image_cache_dir="/c", environment_dirs="/trees", container_environment_dirs="/trees"
    )
    assert both.container_pool_config().environment_dirs == (Path("/trees"),)
    assert SandboxSettings(image_cache_dir="/c").nomad_pool_config().job is not None
