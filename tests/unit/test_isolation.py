"""Properties of the bubblewrap argument vector and of the timeout clamp."""

from __future__ import annotations

import errno
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.domain.bwrap import KEEPER_CAPABILITIES, bwrap_argv, private_tmp_binds
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import (
    Bind,
    SlotIsolation,
    check_slot_uid_range,
    clamp_timeout,
    positive_seconds,
)
from trajcore.domain.kernel_masks import MASKED_PATHS, READ_ONLY_PATHS
from trajcore.domain.seccomp_rules import SECCOMP_RULES

segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8)
abs_path = st.lists(segment, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))

isolations = st.builds(
    SlotIsolation,
    allow_network=st.booleans(),
    require_sandbox=st.booleans(),
    read_only_root=st.booleans(),
    workspace_path=st.sampled_from(["/workspace", "/work/slot", "/home/agent", "/tmp/ws"]),
    extra_binds=st.lists(
        st.builds(
            Bind,
            source=abs_path,
            dest=abs_path | abs_path.map(lambda path: "/tmp" + path),
            writable=st.booleans(),
            optional=st.booleans(),
        ),
        max_size=3,
    ),
)


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def _options(argv: list[str]) -> list[str]:
    return argv[: argv.index("--")]


@given(isolation=isolations, workspace=abs_path, cmd=st.lists(segment, min_size=1, max_size=3))
def test_namespaces_and_hardening_always_present(
    isolation: SlotIsolation, workspace: str, cmd: list[str]
) -> None:
    argv = bwrap_argv(isolation, workspace=workspace, command=cmd)
    opts = _options(argv)
    for flag in (
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
    ):
        assert flag in opts
    assert opts[opts.index("--cap-drop") + 1] == "ALL"
    assert ("--unshare-net" in opts) is (not isolation.allow_network)
    assert argv[argv.index("--") + 1 :] == cmd
    assert opts[opts.index("--chdir") + 1] == isolation.workspace_path


@given(isolation=isolations, workspace=abs_path)
def test_workspace_is_the_only_writable_host_path_besides_explicit_binds(
    isolation: SlotIsolation, workspace: str
) -> None:
    argv = bwrap_argv(isolation, workspace=workspace, command=["agent"])
    writable = _pairs(argv, "--bind") + _pairs(argv, "--bind-try")
    explicit = {(b.source, b.dest) for b in isolation.extra_binds if b.writable}
    assert (workspace, isolation.workspace_path) in writable
    assert set(writable) - explicit == {(workspace, isolation.workspace_path)}
    # The workspace bind comes after every other bind, so no later bind can shadow it.
    last_bind = max(i for i, a in enumerate(argv) if a.startswith(("--bind", "--ro-bind")))
    assert argv[last_bind : last_bind + 3] == ["--bind", workspace, isolation.workspace_path]


@given(isolation=isolations, workspace=abs_path)
def test_root_is_never_bound_and_is_remounted_read_only(
    isolation: SlotIsolation, workspace: str
) -> None:
    argv = bwrap_argv(isolation, workspace=workspace, command=["agent"])
    sources = [
        s for flag in ("--bind", "--ro-bind", "--ro-bind-try") for s, _ in _pairs(argv, flag)
    ]
    assert "/" not in sources
    assert ("--remount-ro" in argv) is isolation.read_only_root
    if isolation.read_only_root:
        assert argv[argv.index("--remount-ro") + 1] == "/"
        # The remount comes after every mount, so everything but the submounts is read-only.
        assert argv.index("--remount-ro") > argv.index("--tmpfs")


@given(isolation=isolations, under_tmp=st.lists(segment, min_size=1, max_size=3))
def test_paths_under_tmp_are_bound_back_after_the_private_tmp(
    isolation: SlotIsolation, under_tmp: list[str]
) -> None:
    venv = "/tmp/" + "/".join(under_tmp)
    argv = bwrap_argv(isolation, workspace="/srv/ws", command=["python"], rebind=[venv])
    tmpfs_at = argv.index("--tmpfs")
    assert argv[tmpfs_at + 1] == "/tmp"
    bind_at = argv.index(venv)
    assert argv[bind_at - 1] == "--ro-bind"
    assert bind_at > tmpfs_at


@given(isolation=isolations, under_tmp=st.lists(segment, min_size=1, max_size=3))
def test_a_lease_binds_back_exactly_what_the_sandbox_bound_under_tmp(
    isolation: SlotIsolation, under_tmp: list[str]
) -> None:
    venv = "/tmp/" + "/".join(under_tmp)
    argv = bwrap_argv(isolation, workspace="/srv/ws", command=["python"], rebind=[venv, "/usr/x"])
    opts = argv[: argv.index("--")]
    bound_under_tmp = [
        (opts[i + 2], flag in ("--bind", "--bind-try"))
        for i, flag in enumerate(opts)
        if flag in ("--bind", "--bind-try", "--ro-bind", "--ro-bind-try")
        and (opts[i + 2] == "/tmp" or opts[i + 2].startswith("/tmp/"))
    ]
    assert private_tmp_binds(isolation, rebind=[venv, "/usr/x"]) == bound_under_tmp


@given(isolation=isolations, keep=st.lists(st.sampled_from(KEEPER_CAPABILITIES), unique=True))
def test_kept_capabilities_follow_the_drop_of_all(
    isolation: SlotIsolation, keep: list[str]
) -> None:
    argv = bwrap_argv(isolation, workspace="/srv/ws", command=["keeper"], keep_capabilities=keep)
    opts = argv[: argv.index("--")]
    dropped = opts.index("--cap-drop")
    assert opts[dropped + 1] == "ALL"
    added = [opts[i + 1] for i, flag in enumerate(opts) if flag == "--cap-add"]
    assert added == keep
    assert all(i > dropped for i, flag in enumerate(opts) if flag == "--cap-add")


@pytest.mark.parametrize("capability", ["CAP_NET_RAW", "CAP_SYS_PTRACE", "ALL", ""])
def test_only_the_keeper_capabilities_may_be_kept(capability: str) -> None:
    with pytest.raises(ConfigError) as info:
        bwrap_argv(
            SlotIsolation(), workspace="/srv/ws", command=["k"], keep_capabilities=[capability]
        )
    assert info.value.field == "keep_capabilities"


def test_rebind_covered_by_a_system_path_is_skipped() -> None:
    argv = bwrap_argv(
        SlotIsolation(), workspace="/srv/ws", command=["python"], rebind=["/usr/bin/python3"]
    )
    assert "/usr/bin/python3" not in argv[: argv.index("--")]


def test_host_symlinks_are_recreated_not_bound() -> None:
    argv = bwrap_argv(
        SlotIsolation(),
        workspace="/srv/ws",
        command=["sh"],
        host_symlinks={"/bin": "usr/bin"},
    )
    assert ("usr/bin", "/bin") in _pairs(argv, "--symlink")
    assert ("/bin", "/bin") not in _pairs(argv, "--ro-bind-try")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"workspace_path": "relative"}, "workspace_path"),
        ({"workspace_path": "/tmp"}, "workspace_path"),
        ({"workspace_path": "/a/../b"}, "workspace_path"),
        ({"max_processes": 0}, "max_processes"),
        ({"output_cap_bytes": -1}, "output_cap_bytes"),
        ({"min_timeout_s": math.nan}, "min_timeout_s"),
        ({"min_timeout_s": 10.0, "default_timeout_s": 5.0}, "default_timeout_s"),
        ({"memory_bytes": True}, "memory_bytes"),
        ({"cpu_seconds": 0}, "cpu_seconds"),
        ({"allow_network": "yes"}, "allow_network"),
        ({"use_cgroups": 1}, "use_cgroups"),
        ({"bwrap": ""}, "bwrap"),
        ({"bwrap": " bwrap"}, "bwrap"),
        ({"slot_uid_base": 1000}, "slot_uid_base"),
        ({"system_paths": ["/usr", "lib"]}, "system_paths[1]"),
        ({"extra_binds": ["/data"]}, "extra_binds[0]"),
    ],
)
def test_bad_policy_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        SlotIsolation(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_bad_arguments_to_the_builder() -> None:
    with pytest.raises(ConfigError, match="workspace"):
        bwrap_argv(SlotIsolation(), workspace="ws", command=["sh"])
    with pytest.raises(ConfigError, match="command"):
        bwrap_argv(SlotIsolation(), workspace="/ws", command=[])


finite = st.floats(min_value=0.001, max_value=1e6, allow_nan=False)
anything = st.one_of(
    st.none(), st.booleans(), st.text(max_size=3), st.floats(), st.integers(-5, 10**7),
    st.integers(-(10**400), 10**400),
)  # fmt: skip


@given(
    lo=st.floats(0.1, 10),
    span=st.floats(0, 1000),
    requested=st.one_of(st.none(), st.floats()),
    model=anything,
)
def test_clamp_stays_in_range_and_model_only_shortens(
    lo: float, span: float, requested: float | None, model: object
) -> None:
    isolation = SlotIsolation(
        min_timeout_s=lo, default_timeout_s=lo + span, max_timeout_s=lo + span
    )
    result = clamp_timeout(isolation, requested, model)
    assert isolation.min_timeout_s <= result <= isolation.max_timeout_s
    without_model = clamp_timeout(isolation, requested)
    assert result <= without_model


@given(requested=finite)
def test_clamp_is_identity_inside_the_range(requested: float) -> None:
    isolation = SlotIsolation(min_timeout_s=0.001, default_timeout_s=1.0, max_timeout_s=1e6)
    assert clamp_timeout(isolation, requested) == requested
    assert clamp_timeout(isolation, requested, requested * 2) == requested


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (2, 2.0), (0.5, 0.5), (10**6, 1e6),
        (0, None), (-1, None), (-0.5, None), (True, None), (False, None), ("3", None),
        (None, None), (float("inf"), None), (float("nan"), None), (10**400, None),
        (-(10**400), None), ([1], None),
    ],
)  # fmt: skip
def test_positive_seconds_takes_positive_finite_numbers_only(
    value: object, seconds: float | None
) -> None:
    assert positive_seconds(value) == seconds


def test_a_model_timeout_past_a_floats_range_is_ignored_not_raised() -> None:
    isolation = SlotIsolation(min_timeout_s=0.1, default_timeout_s=30.0, max_timeout_s=60.0)
    assert clamp_timeout(isolation, 10.0, 10**400) == 10.0
    assert clamp_timeout(isolation, 10**400, 5) == 5.0  # the env's own figure, likewise
    assert clamp_timeout(isolation, 10**400) == 30.0


def test_no_sandbox_may_make_user_namespaces() -> None:
    argv = bwrap_argv(SlotIsolation(), workspace="/w", command=["/bin/true"])
    assert "--disable-userns" in argv[: argv.index("--")]


def test_a_staged_source_is_bound_read_only_at_its_destination() -> None:
    staged = Bind(source="/srv/root/runtime/python", dest="/root/.pyenv/versions/3.11.7")
    argv = bwrap_argv(SlotIsolation(), workspace="/w", command=["/bin/true"], rebind=[staged])
    at = argv.index("/srv/root/runtime/python")
    assert argv[at - 1 : at + 2] == ["--ro-bind", staged.source, staged.dest]
    under_tmp = Bind(source="/srv/x", dest="/tmp/venv")
    assert private_tmp_binds(SlotIsolation(), rebind=[under_tmp]) == [("/tmp/venv", False)]


def test_kernel_paths_follow_runc() -> None:
    assert {"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"} <= set(MASKED_PATHS)
    assert {"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"} <= set(READ_ONLY_PATHS)
    assert not set(MASKED_PATHS) & set(READ_ONLY_PATHS)


def test_the_seccomp_rules_refuse_what_an_escape_needs() -> None:
    refused = {rule.name for rule in SECCOMP_RULES if rule.arg is None}
    needed = {
        "add_key", "keyctl", "request_key", "ptrace", "process_vm_readv", "pidfd_getfd",
        "bpf", "perf_event_open", "userfaultfd", "kexec_load", "open_by_handle_at",
        "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "setns",
    }  # fmt: skip
    assert needed <= refused
    by_name = {rule.name: rule for rule in SECCOMP_RULES}
    assert by_name["clone3"].errno == errno.ENOSYS
    for name in ("clone", "unshare"):
        rule = by_name[name]
        assert (rule.arg, rule.mask, rule.value) == (0, 0x10000000, 0x10000000)
    ioctls = {rule.value for rule in SECCOMP_RULES if rule.name == "ioctl"}
    assert ioctls == {0x5412, 0x541C}  # TIOCSTI, TIOCLINUX


@pytest.mark.parametrize(
    ("base", "count", "reason"),
    [(0, 1, "must be >= 65536"), (1000, 1, "must be >= 65536"),
     ((1 << 31) - 2, 4, "runs past the largest"), ("1", 1, "must be an integer")],
)  # fmt: skip
def test_a_bad_slot_uid_range_is_refused(base: object, count: int, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_slot_uid_range("slot_uid_base", base, count)
    assert info.value.field == "slot_uid_base"
    assert reason in str(info.value)
