"""Decisions of the SSH hosts' pure parts that ``test_ssh_hosts.py`` checks only in part (found by
mutation testing): each test's docstring names the decision it pins."""

from __future__ import annotations

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSON
from trajcore.domain.ssh_hosts import SshHost, SshSettings, host_lacks, remote_command, ssh_argv

ALWAYS = [
    "-o", "BatchMode=yes",
    "-o", "StrictHostKeyChecking=yes",
    "-o", "ConnectTimeout=10",
    "-o", "ServerAliveInterval=5",
    "-o", "ServerAliveCountMax=3",
    "-o", "ExitOnForwardFailure=yes",
    "-o", "StreamLocalBindUnlink=yes",
    "-o", "ControlMaster=no",
    "-o", "ControlPath=none",
    "-o", "RequestTTY=no",
]  # fmt: skip


def test_a_plain_hosts_command_line_is_the_fixed_options_and_the_quoted_remote() -> None:
    """Pins the whole command line of a host with no optional setting: the ssh program, the
    options every connection gets in their order, no ``-F``/``-i``/``-p``/``-L``, then ``-T --``,
    the destination and the remote words as one quoted line."""
    assert ssh_argv(SshHost(address="gpu-1"), SshSettings(), ["echo", "a b"]) == [
        "ssh", *ALWAYS, "-T", "--", "gpu-1", "echo 'a b'",
    ]  # fmt: skip


def test_every_setting_lands_in_its_place_on_the_command_line() -> None:
    """Pins where each optional setting goes: ``-F`` first, ``-i`` before the options, the
    known_hosts pair and ``IdentitiesOnly`` after the fixed options, the host's own options
    last, then ``-p`` and ``-L``; the settings' deadlines in their options."""
    host = SshHost(
        address="gpu-1",
        user="rl",
        port=2222,
        identity_file="/k",
        known_hosts="/kh",
        accept_new_host_key=True,
        ssh_options=("Compression=yes",),
    )
    settings = SshSettings(
        ssh="/usr/bin/ssh", config_file="/cfg", connect_timeout_s=7, keepalive_s=2,
        keepalive_count=4,
    )  # fmt: skip
    assert ssh_argv(host, settings, ["true"], forward=("/l", "/r")) == [
        "/usr/bin/ssh", "-F", "/cfg", "-i", "/k",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=accept-new",
        "-o", "ConnectTimeout=7",
        "-o", "ServerAliveInterval=2",
        "-o", "ServerAliveCountMax=4",
        "-o", "ExitOnForwardFailure=yes",
        "-o", "StreamLocalBindUnlink=yes",
        "-o", "ControlMaster=no",
        "-o", "ControlPath=none",
        "-o", "RequestTTY=no",
        "-o", "UserKnownHostsFile=/kh",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "IdentitiesOnly=yes",
        "-o", "Compression=yes",
        "-p", "2222", "-L", "/l:/r", "-T", "--", "rl@gpu-1", "true",
    ]  # fmt: skip


def test_the_remote_words_are_joined_for_the_remote_shell() -> None:
    """Pins ``remote_command``: each word quoted as the shell reads it back."""
    assert remote_command(["echo", "a b", "$HOME", ""]) == "echo 'a b' '$HOME' ''"


def _refusal(**settings: object) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        SshHost(**({"address": "h"} | settings))  # type: ignore[arg-type]
    return caught.value


WORD = "must be one word without whitespace that does not start with '-', got "


@pytest.mark.parametrize(
    ("settings", "field", "reason"),
    [
        ({"address": "-x"}, "address", WORD + "'-x'"),
        ({"address": 5}, "address", WORD + "5"),
        ({"address": "a b"}, "address", WORD + "'a b'"),
        ({"user": "a\tb"}, "user", WORD + "'a\\tb'"),
        ({"python": "-c"}, "python", WORD + "'-c'"),
        (
            {"remote_dir": "rel"},
            "remote_dir",
            "must be an absolute path without whitespace, got 'rel'",
        ),
        (
            {"remote_dir": "/a b"},
            "remote_dir",
            "must be an absolute path without whitespace, got '/a b'",
        ),
        ({"remote_dir": 5}, "remote_dir", "must be an absolute path without whitespace, got 5"),
        ({"transport": "udp"}, "transport", "must be 'auto', 'unix' or 'tcp', got 'udp'"),
        (
            {"name": "a b"},
            "name",
            "must be None or a short name ([A-Za-z0-9][A-Za-z0-9_.-]*), got 'a b'",
        ),
        ({"name": 5}, "name", "must be None or a short name ([A-Za-z0-9][A-Za-z0-9_.-]*), got 5"),
        ({"ssh_options": "A=b"}, "ssh_options", "must be a list of 'Key=Value' words, got 'A=b'"),
        ({"ssh_options": 5}, "ssh_options", "must be a list of 'Key=Value' words, got 5"),
        (
            {"ssh_options": ["A=b", "-v"]},
            "ssh_options[1]",
            "must read 'Key=Value' (an ssh -o option), got '-v'",
        ),
        ({"ssh_options": [5]}, "ssh_options[0]", "must read 'Key=Value' (an ssh -o option), got 5"),
        ({"port": 65536}, "port", "must be a TCP port in [1, 65535], got 65536"),
    ],
)
def test_a_bad_host_setting_is_refused_with_its_field_and_reason(
    settings: dict[str, object], field: str, reason: str
) -> None:
    """Pins each host setting's check: the field it names (the index of a bad ssh option) and the
    reason, with the value as given."""
    error = _refusal(**settings)
    assert (error.field, error.reason) == (field, reason)


def test_the_settings_each_check_accepts() -> None:
    """Pins what the checks let through: an absent user, key, known_hosts or name; every
    transport; the highest port; ``Key=Value`` options as a list."""
    for transport in ("auto", "unix", "tcp"):
        assert SshHost(address="h", transport=transport).transport == transport
    host = SshHost(address="h", port=65535, name="n-1.a", ssh_options=["A=b", "C=d e"])
    assert (host.port, host.name, host.ssh_options) == (65535, "n-1.a", ("A=b", "C=d e"))
    assert SshHost(address="h", user=None, identity_file=None, known_hosts=None).user is None
    assert SshHost(address="h", remote_dir="/").remote_dir == "/"


def test_a_bad_shared_setting_is_refused_with_its_field() -> None:
    """Pins that the shared settings' program and config file are checked as words."""
    with pytest.raises(ConfigError) as caught:
        SshSettings(ssh="-oProxyCommand=x")
    assert caught.value.field == "ssh"
    with pytest.raises(ConfigError) as caught:
        SshSettings(config_file="a b")
    assert caught.value.field == "config_file"


FINE: dict[str, JSON] = {"python": [3, 11], "trajcore": "0.1", "bwrap": "/b", "tmux": "/t"}


@pytest.mark.parametrize("version", [None, "3.11", [3], [3, "11"], ["3", 11], [3, 11.0]])
def test_a_python_version_that_is_no_list_of_numbers_is_lacking(version: JSON) -> None:
    """Pins that the version must be a list of at least two integers, every part of it."""
    report = FINE | {"python": version}
    assert host_lacks(report, python="p", need_bwrap=False, need_tmux=False) == [
        "a Python that reports its version at p"
    ]


@pytest.mark.parametrize(
    ("version", "fine"), [([3, 11], True), ([3, 10, 9], False), ([4, 0], True), ([2, 12], False)]
)
def test_a_python_older_than_3_11_is_lacking_saying_which_it_is(
    version: list[int], fine: bool
) -> None:
    """Pins the version floor (3.11 itself is enough, major then minor compared) and the
    reason, which shows the version reported."""
    reported: list[JSON] = [*version]
    report = FINE | {"python": reported}
    lacks = host_lacks(report, python="p", need_bwrap=False, need_tmux=False)
    shown = ".".join(str(v) for v in version)
    assert lacks == ([] if fine else [f"Python >= 3.11 at p (it is {shown})"])


def test_each_missing_tool_is_lacking_in_order_with_its_remedy() -> None:
    """Pins every reason a host lacks something, in the order reported: Python, trajcore (with
    the import's error when it says one, else ``not importable``), bubblewrap, tmux."""
    report: dict[str, JSON] = {"python": None, "trajcore": None, "trajcore_error": 5}
    assert host_lacks(report, python="/v/p", need_bwrap=True, need_tmux=True) == [
        "a Python that reports its version at /v/p",
        "trajcore in /v/p (pip install trajcore: the core install): not importable",
        "bubblewrap (bwrap is not on PATH; apt-get install bubblewrap)",
        "tmux (the persistent shell needs it; apt-get install tmux)",
    ]


def test_bubblewrap_and_tmux_are_asked_of_a_host_only_when_needed() -> None:
    """Pins that a missing bubblewrap or tmux is lacking only when the pool needs it, and that a
    bubblewrap that works (no error reported) is enough."""
    bare: dict[str, JSON] = {"python": [3, 12], "trajcore": "1", "bwrap": None, "tmux": None}
    assert host_lacks(bare, python="p", need_bwrap=False, need_tmux=False) == []
    assert (
        host_lacks(FINE | {"bwrap_error": None}, python="p", need_bwrap=True, need_tmux=True) == []
    )
