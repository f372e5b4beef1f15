"""The sandbox isolation: decisions ``test_isolation`` and its neighbours left open, found by
mutation testing (docs/testing.md)."""

from __future__ import annotations

import math

import attrs
import pytest

from trajcore.domain.bwrap import bwrap_argv
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import (
    MAX_SLOT_UID,
    MIN_SLOT_UID_BASE,
    Bind,
    SlotIsolation,
    _switch,
    check_slot_uid_range,
    clamp_timeout,
)


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


def test_a_slot_uid_range_may_reach_the_largest_uid_and_start_at_the_smallest_base() -> None:
    """The uid range's bounds are inclusive: the base may be ``MIN_SLOT_UID_BASE`` and the last
    slot's uid ``MAX_SLOT_UID``; one past either is refused with the field and the reason."""
    check_slot_uid_range("slot_uid_base", MIN_SLOT_UID_BASE, 1)
    check_slot_uid_range("slot_uid_base", MAX_SLOT_UID - 3, 4)
    check_slot_uid_range("slot_uid_base", MAX_SLOT_UID, 1)
    with pytest.raises(ConfigError) as caught:
        check_slot_uid_range("slot_uid_base", MAX_SLOT_UID - 2, 4)
    assert str(caught.value) == (
        f"{MAX_SLOT_UID - 2} + 4 slots runs past the largest slot uid {MAX_SLOT_UID}"
        " @ slot_uid_base"
    )
    with pytest.raises(ConfigError) as caught:
        check_slot_uid_range("slots.uid", MIN_SLOT_UID_BASE - 1, 1)
    assert str(caught.value) == (
        f"must be >= {MIN_SLOT_UID_BASE} (above ordinary accounts), got {MIN_SLOT_UID_BASE - 1}"
        " @ slots.uid"
    )
    with pytest.raises(ConfigError) as caught:
        check_slot_uid_range("slot_uid_base", True, 1)
    assert str(caught.value) == "must be an integer, got True @ slot_uid_base"
    with pytest.raises(ConfigError) as caught:
        SlotIsolation(slot_uid_base=MAX_SLOT_UID + 1)
    assert str(caught.value) == (
        f"{MAX_SLOT_UID + 1} + 1 slots runs past the largest slot uid {MAX_SLOT_UID}"
        " @ slot_uid_base"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ws", "'ws' is not an absolute path @ workspace_path"),
        ("", "'' is not an absolute path @ workspace_path"),
        (5, "5 is not an absolute path @ workspace_path"),
        ("/work\0space", "'/work\\x00space' is not an absolute path @ workspace_path"),
        ("\0/x", "'\\x00/x' is not an absolute path @ workspace_path"),
        ("/a/../b", "'/a/../b' must not contain '..' @ workspace_path"),
        ("/a/..", "'/a/..' must not contain '..' @ workspace_path"),
    ],
)
def test_the_workspace_path_must_be_absolute_without_nul_or_parent_steps(
    value: object, message: str
) -> None:
    """An absolute path is a string starting with ``/`` with no NUL and no ``..`` component;
    each refusal names the field and says which rule the path broke."""
    with pytest.raises(ConfigError) as caught:
        SlotIsolation(workspace_path=value)  # type: ignore[arg-type]  # bad input on purpose
    assert str(caught.value) == message


def test_a_path_with_dots_that_are_not_a_parent_step_is_absolute() -> None:
    """Only a whole ``..`` component is refused: ``/a..b`` and ``/..x`` name ordinary entries."""
    assert SlotIsolation(workspace_path="/a..b").workspace_path == "/a..b"
    assert SlotIsolation(workspace_path="/..x/y").workspace_path == "/..x/y"
    bind = Bind(source="/src/a..b", dest="/mnt/..c")
    assert (bind.source, bind.dest) == ("/src/a..b", "/mnt/..c")


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("source", "'rel' is not an absolute path @ source"),
        ("dest", "'rel' is not an absolute path @ dest"),
    ],
)
def test_each_end_of_a_bind_must_be_absolute_naming_that_end(field: str, message: str) -> None:
    """A bind's source and destination are each checked as absolute paths, by their own name."""
    ends = {"source": "/a", "dest": "/b", field: "rel"}
    with pytest.raises(ConfigError) as caught:
        Bind(source=ends["source"], dest=ends["dest"])
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must be a program name or path, got '' @ bwrap"),
        (" bwrap", "must be a program name or path, got ' bwrap' @ bwrap"),
        ("bwrap\n", "must be a program name or path, got 'bwrap\\n' @ bwrap"),
        ("bw\0rap", "must be a program name or path, got 'bw\\x00rap' @ bwrap"),
        (None, "must be a program name or path, got None @ bwrap"),
    ],
)
def test_the_bwrap_executable_is_a_nonempty_name_without_edge_space_or_nul(
    value: object, message: str
) -> None:
    """``bwrap`` must be a non-empty string, not padded with whitespace and free of NUL; the
    refusal names the field and shows what came."""
    with pytest.raises(ConfigError) as caught:
        SlotIsolation(bwrap=value)  # type: ignore[arg-type]  # bad input on purpose
    assert str(caught.value) == message
    assert SlotIsolation(bwrap="/usr/bin/bwrap").bwrap == "/usr/bin/bwrap"
    assert SlotIsolation(bwrap="b").bwrap == "b"


def test_every_extra_bind_must_be_a_bind_naming_its_index() -> None:
    """An extra bind that is not a ``Bind`` is refused by its index, showing what came."""
    with pytest.raises(ConfigError) as caught:
        SlotIsolation(extra_binds=(Bind(source="/a", dest="/b"), "/c"))  # type: ignore[arg-type]
    assert str(caught.value) == "expected a Bind, got '/c' @ extra_binds[1]"


def test_a_switch_field_has_its_default_and_takes_only_a_bool() -> None:
    """``_switch`` makes a field defaulting to the given bool whose validator refuses non-bools
    by the field's name (called directly: the class body runs it at import)."""

    @attrs.frozen(kw_only=True)
    class Switches:
        on: bool = _switch(True)
        off: bool = _switch(False)

    made = Switches()
    assert (made.on, made.off) == (True, False)
    assert Switches(on=False, off=True) == Switches(on=False, off=True)
    with pytest.raises(ConfigError) as caught:
        Switches(off=0)  # type: ignore[arg-type]  # bad input on purpose
    assert str(caught.value) == "must be true or false, got 0 @ off"
    with pytest.raises(ConfigError) as caught:
        Switches(on="yes")  # type: ignore[arg-type]  # bad input on purpose
    assert str(caught.value) == "must be true or false, got 'yes' @ on"


def test_the_isolation_switches_default_to_closed_network_and_cgroups_and_read_only_root() -> None:
    """The switches' defaults: no network, no required sandbox, a read-only root, cgroups."""
    isolation = SlotIsolation()
    assert (
        isolation.allow_network,
        isolation.require_sandbox,
        isolation.read_only_root,
        isolation.use_cgroups,
    ) == (False, False, True, True)


@pytest.mark.parametrize("path", ["/", "/tmp", "/proc", "/dev"])
def test_the_workspace_may_not_be_a_path_the_sandbox_itself_provides(path: str) -> None:
    """``/``, the private ``/tmp``, ``/proc`` and ``/dev`` are reserved as the workspace, by the
    field's name; a path below one of them is not."""
    with pytest.raises(ConfigError) as caught:
        SlotIsolation(workspace_path=path)
    assert str(caught.value) == f"{path!r} is reserved @ workspace_path"
    assert SlotIsolation(workspace_path=path.rstrip("/") + "/ws").workspace_path.endswith("/ws")


def test_the_default_timeout_must_lie_between_the_bounds_inclusive() -> None:
    """``min <= default <= max``, bounds included; outside, the default is named with both."""
    SlotIsolation(min_timeout_s=2.0, default_timeout_s=2.0, max_timeout_s=2.0)
    with pytest.raises(ConfigError) as caught:
        SlotIsolation(min_timeout_s=2.0, default_timeout_s=1.5, max_timeout_s=3.0)
    assert str(caught.value) == (
        "must lie in [min_timeout_s, max_timeout_s] = [2.0, 3.0], got 1.5 @ default_timeout_s"
    )
    with pytest.raises(ConfigError) as caught:
        SlotIsolation(min_timeout_s=2.0, default_timeout_s=3.5, max_timeout_s=3.0)
    assert str(caught.value) == (
        "must lie in [min_timeout_s, max_timeout_s] = [2.0, 3.0], got 3.5 @ default_timeout_s"
    )


@pytest.mark.parametrize("requested", [None, True, False, 0, 0.0, -1.0, math.inf, math.nan])
def test_an_env_timeout_that_is_no_positive_finite_number_means_the_default(
    requested: float | None,
) -> None:
    """The env's figure is used only when it is a positive finite number and not a bool;
    otherwise the call gets the isolation's default."""
    isolation = SlotIsolation(min_timeout_s=0.1, default_timeout_s=30.0, max_timeout_s=600.0)
    assert clamp_timeout(isolation, requested) == 30.0


@pytest.mark.parametrize("requested", [0.25, 1.0, 1, 500.0])
def test_a_positive_env_timeout_is_used_even_below_one_second(requested: float) -> None:
    """Any positive finite figure inside the bounds is the limit, fractions of a second too."""
    isolation = SlotIsolation(min_timeout_s=0.1, default_timeout_s=30.0, max_timeout_s=600.0)
    result = clamp_timeout(isolation, requested)
    assert result == requested
    assert type(result) is float


@pytest.mark.parametrize("model", [True, False, 0, 0.0, -5, math.inf, math.nan, "5", None, [5]])
def test_a_model_timeout_that_is_no_positive_finite_number_is_ignored(model: object) -> None:
    """A model's figure shortens the limit only when it is a positive finite int or float, not a
    bool (``True`` is not one second)."""
    isolation = SlotIsolation(min_timeout_s=0.1, default_timeout_s=30.0, max_timeout_s=600.0)
    assert clamp_timeout(isolation, 60.0, model) == 60.0


@pytest.mark.parametrize("model", [0.5, 1, 1.0, 7])
def test_a_positive_model_timeout_shortens_the_limit_even_below_one_second(
    model: float,
) -> None:
    """A positive model figure below the env's shortens the call's limit (down to the minimum),
    a fraction of a second included; above the env's it changes nothing."""
    isolation = SlotIsolation(min_timeout_s=0.1, default_timeout_s=30.0, max_timeout_s=600.0)
    assert clamp_timeout(isolation, 60.0, model) == float(model)
    assert clamp_timeout(isolation, 0.2, model) == 0.2
    assert clamp_timeout(isolation, None, 0.01) == 0.1
