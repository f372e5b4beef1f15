"""The SSH hosts' pure parts: settings checked when built, the ssh command line, the start check."""

from __future__ import annotations

import shlex

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSON
from trajcore.domain.ssh_hosts import SshHost, SshSettings, host_lacks, ssh_argv


def test_host_keys_are_checked_strictly_unless_the_host_opts_in() -> None:
    strict = ssh_argv(SshHost(address="gpu-1"), SshSettings(), ["true"])
    assert "StrictHostKeyChecking=yes" in strict
    assert "BatchMode=yes" in strict
    trusting = ssh_argv(SshHost(address="gpu-1", accept_new_host_key=True), SshSettings(), ["x"])
    assert "StrictHostKeyChecking=accept-new" in trusting


def test_the_command_line_names_key_known_hosts_port_forward_and_quotes_the_remote() -> None:
    host = SshHost(address="gpu-1", user="rl", port=2222, identity_file="/k", known_hosts="/kh")
    argv = ssh_argv(host, SshSettings(config_file="/cfg"), ["echo", "a b;c"], forward=("/l", "/r"))
    assert argv[:3] == ["ssh", "-F", "/cfg"]
    assert argv[argv.index("-i") : argv.index("-i") + 2] == ["-i", "/k"]
    assert "UserKnownHostsFile=/kh" in argv
    assert argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-L") + 1] == "/l:/r"
    assert argv[-3:-1] == ["--", "rl@gpu-1"]
    assert shlex.split(argv[-1]) == ["echo", "a b;c"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("address", "-oProxyCommand=x"),
        ("user", "-l"),
        ("address", "two words"),
        ("port", 0),
        ("port", 70000),
        ("servers", 0),
        ("remote_dir", "relative"),
        ("transport", "udp"),
        ("ssh_options", ["-v"]),
    ],
)
def test_bad_host_settings_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        SshHost(**({"address": "h"} | {field: value}))  # type: ignore[arg-type]
    assert caught.value.field.startswith(field)


def test_the_start_check_names_what_a_host_lacks() -> None:
    fine: dict[str, JSON] = {
        "python": [3, 11, 2],
        "trajcore": "0.1",
        "bwrap": "/usr/bin/bwrap",
        "tmux": None,
    }
    assert host_lacks(fine, python="p", need_bwrap=True, need_tmux=False) == []
    old = fine | {"python": [3, 9, 0], "trajcore": None, "trajcore_error": "ImportError: x"}
    lacks = host_lacks(old, python="p", need_bwrap=True, need_tmux=True)
    assert lacks[0] == "Python >= 3.11 at p (it is 3.9.0)"
    assert "trajcore in p" in lacks[1]
    assert lacks[1].endswith("ImportError: x")
    assert lacks[2].startswith("tmux")
    unusable = fine | {"bwrap_error": "bwrap: No permissions"}
    assert host_lacks(unusable, python="p", need_bwrap=True, need_tmux=False) == [
        "a usable bubblewrap: bwrap: No permissions"
    ]
    assert host_lacks(unusable, python="p", need_bwrap=False, need_tmux=False) == []
