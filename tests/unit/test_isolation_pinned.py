"""The sandbox isolation: decisions ``test_isolation`` and its neighbours left open, found by
mutation testing (docs/testing.md)."""

from __future__ import annotations

import attrs
import pytest

from trajcore.domain.bwrap import bwrap_argv
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import Bind, SlotIsolation


def test_the_bwrap_vector_is_exactly_the_policy() -> None:
    # Every flag, in order: namespaces, no network, no nested user namespaces, capabilities
    # dropped but the kept one, the fixed hostname, system paths bound read-only (a host
    # symlink recreated), a private /tmp, /proc and /dev, the rebinds (a staged Bind always, a
    # path a system bind covers skipped, the others bound), the extra binds (optional -> -try,
    # writable -> --bind), the workspace, the read-only root, then the command.
    isolation = SlotIsolation(
        system_paths=("/usr", "/lib", "/bin"),
        extra_binds=(
            Bind(source="/data", dest="/mnt/data", optional=True),
            Bind(source="/cache", dest="/mnt/cache", writable=True),
        ),
    )
    argv = bwrap_argv(
        isolation,
        workspace="/srv/ws",
        command=["agent", "-v"],
        host_symlinks={"/bin": "usr/bin"},
        rebind=[Bind(source="/stage/x", dest="/usr/x"), "/usr/lib/python3", "/tmp/venv", "/opt/py"],
        keep_capabilities=["CAP_SETPCAP"],
    )
    assert argv == [
        "bwrap",
        "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--unshare-net",
        "--disable-userns", "--die-with-parent", "--new-session",
        "--cap-drop", "ALL", "--cap-add", "CAP_SETPCAP",
        "--hostname", "slot",
        "--ro-bind-try", "/usr", "/usr",
        "--ro-bind-try", "/lib", "/lib",
        "--symlink", "usr/bin", "/bin",
        "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev",
        "--ro-bind", "/stage/x", "/usr/x",
        "--ro-bind", "/tmp/venv", "/tmp/venv",
        "--ro-bind", "/opt/py", "/opt/py",
        "--ro-bind-try", "/data", "/mnt/data",
        "--bind", "/cache", "/mnt/cache",
        "--bind", "/srv/ws", "/workspace",
        "--remount-ro", "/",
        "--chdir", "/workspace", "--", "agent", "-v",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"workspace": "ws", "command": ["agent"]}, "'ws' is not an absolute path @ workspace"),
        ({"workspace": "/ws", "command": []}, "must name a program @ command"),
        (
            {"workspace": "/ws", "command": ["agent"], "keep_capabilities": ["CAP_SYS_PTRACE"]},
            "'CAP_SYS_PTRACE' is not one a keeper may keep "
            "(CAP_SYS_ADMIN, CAP_SETPCAP, CAP_NET_ADMIN) @ keep_capabilities",
        ),
    ],
)
def test_a_bad_vector_request_is_refused_with_the_field_and_reason(
    arguments: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        bwrap_argv(SlotIsolation(), **arguments)  # type: ignore[arg-type]  # each case's own types
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        (("/usr", 5), "expected a path string @ system_paths[1]"),
        (("usr",), "'usr' is not an absolute path @ system_paths[0]"),
        (("/usr/../etc",), "'/usr/../etc' is not an absolute path @ system_paths[0]"),
        (("/usr\0x",), "'/usr\\x00x' is not an absolute path @ system_paths[0]"),
    ],
)
def test_every_system_path_must_be_a_plain_absolute_path(
    paths: tuple[object, ...], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        SlotIsolation(system_paths=paths)  # type: ignore[arg-type]  # bad input on purpose
    assert str(caught.value) == message
    SlotIsolation(system_paths=("/usr", "/lib/x86_64-linux-gnu", "/a..b"))


def test_the_flag_table_is_every_field_in_order_with_its_flag_help_default_and_codec() -> None:
    # Called directly: the table is built when the module is imported.
    from trajcore.domain import slot_server_flags

    assert slot_server_flags._isolation_flags(slot_server_flags._TABLE) == (
        slot_server_flags.ISOLATION_FLAGS
    )
    assert [f.field for f in slot_server_flags.ISOLATION_FLAGS] == [
        a.name for a in attrs.fields(SlotIsolation)
    ]
    first = slot_server_flags.ISOLATION_FLAGS[0]
    assert (first.field, first.name, first.help, first.default, first.codec) == (
        "allow_network",
        "--allow-network",
        "share the host network",
        False,
        None,
    )
    with pytest.raises(ConfigError, match="must be true or false, got 1 @ allow_network"):
        SlotIsolation(allow_network=1)  # type: ignore[arg-type]  # bad input on purpose


def test_a_flag_table_that_misses_a_field_or_mistakes_a_switch_fails_naming_it() -> None:
    from trajcore.domain import slot_server_flags

    table = dict(slot_server_flags._TABLE)
    del table["bwrap"]
    with pytest.raises(ValueError, match=r"lists \[.*'use_cgroups', 'slot_uid_base'\], but"):
        slot_server_flags._isolation_flags(table)
    table = dict(slot_server_flags._TABLE)
    table["use_cgroups"] = ("--no-cgroups", "use rlimits only", table["bwrap"][2])
    with pytest.raises(ValueError, match=r"^use_cgroups: a switch is exactly"):
        slot_server_flags._isolation_flags(table)


@pytest.mark.parametrize(
    ("word", "problem"),
    [
        ('{"a": 1}', "expected a JSON list of paths"),
        ('["/a", 2]', "expected a JSON list of paths"),
    ],
)
def test_system_paths_on_a_command_line_are_a_json_list_of_strings(word: str, problem: str) -> None:
    from trajcore.domain import slot_server_flags

    flag = next(f for f in slot_server_flags.ISOLATION_FLAGS if f.field == "system_paths")
    assert flag.read('["/usr", "/lib"]') == ("/usr", "/lib")
    with pytest.raises(ValueError, match=rf"^{problem}$"):
        flag.read(word)


@pytest.mark.parametrize(
    ("word", "problem"),
    [
        ('{"a": 1}', "expected a JSON list of objects"),
        ('[{"source": "/a", "dest": "/b"}, 3]', "expected a JSON list of objects"),
        ('[{"source": "/a"}]', "missing 1 required keyword-only argument: 'dest'"),
        ('[{"source": "a", "dest": "/b"}]', "'a' is not an absolute path @ source"),
    ],
)
def test_extra_binds_on_a_command_line_are_a_json_list_of_binds(word: str, problem: str) -> None:
    from trajcore.domain import slot_server_flags

    flag = next(f for f in slot_server_flags.ISOLATION_FLAGS if f.field == "extra_binds")
    binds = (Bind(source="/a", dest="/b", writable=True),)
    shown = '[{"source":"/a","dest":"/b","writable":true,"optional":false}]'
    assert flag.codec is not None
    assert flag.codec.show(binds) == shown
    assert flag.read(shown) == binds
    with pytest.raises(ValueError, match=problem):
        flag.read(word)
