"""The sandbox policy: decisions ``test_sandbox_policy`` and its neighbours left open, found by
mutation testing (docs/testing.md)."""

from __future__ import annotations

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.domain.sandbox_policy import Bind, SlotPolicy, bwrap_argv


def test_the_bwrap_vector_is_exactly_the_policy() -> None:
    # Every flag, in order: namespaces, no network, no nested user namespaces, capabilities
    # dropped but the kept one, the fixed hostname, system paths bound read-only (a host
    # symlink recreated), a private /tmp, /proc and /dev, the rebinds (a staged Bind always, a
    # path a system bind covers skipped, the others bound), the extra binds (optional -> -try,
    # writable -> --bind), the workspace, the read-only root, then the command.
    policy = SlotPolicy(
        system_paths=("/usr", "/lib", "/bin"),
        extra_binds=(
            Bind(source="/data", dest="/mnt/data", optional=True),
            Bind(source="/cache", dest="/mnt/cache", writable=True),
        ),
    )
    argv = bwrap_argv(
        policy,
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
        bwrap_argv(SlotPolicy(), **arguments)  # type: ignore[arg-type]  # each case's own types
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
        SlotPolicy(system_paths=paths)  # type: ignore[arg-type]  # bad input on purpose
    assert str(caught.value) == message
    SlotPolicy(system_paths=("/usr", "/lib/x86_64-linux-gnu", "/a..b"))
