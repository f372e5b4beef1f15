"""The slot isolation on the slot server's command line: written by ``isolation_argv``, read by the
parser that ``trajcore slot-server`` builds from the same table."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import (
    DEFAULT_SLOT_UID_BASE,
    MAX_SLOT_UID,
    MIN_SLOT_UID_BASE,
    Bind,
    SlotIsolation,
)
from trajcore.domain.slot_server_flags import ISOLATION_FLAGS, isolation_argv
from trajcore.entrypoints.slot_server import isolation_of, parse_args

_SERVER = ["--slots", "1", "--root", "/w", "--unix", "/s"]

segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-., :\"'\\", min_size=1)
abs_path = st.lists(segment, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))
abs_path = abs_path.filter(lambda path: ".." not in path.split("/"))
optional_count = st.none() | st.integers(1, 1 << 40)
seconds = st.floats(min_value=1e-3, max_value=1e5, allow_nan=False, allow_infinity=False)


@st.composite
def isolations(draw: st.DrawFn) -> SlotIsolation:
    low, middle, high = sorted(draw(st.lists(seconds, min_size=3, max_size=3)))
    return SlotIsolation(
        allow_network=draw(st.booleans()),
        require_sandbox=draw(st.booleans()),
        read_only_root=draw(st.booleans()),
        workspace_path=draw(abs_path.filter(lambda path: path not in ("/tmp", "/proc", "/dev"))),
        system_paths=draw(st.lists(abs_path, max_size=4)),
        extra_binds=draw(
            st.lists(
                st.builds(
                    Bind,
                    source=abs_path,
                    dest=abs_path,
                    writable=st.booleans(),
                    optional=st.booleans(),
                ),
                max_size=3,
            )
        ),
        max_processes=draw(optional_count),
        memory_bytes=draw(optional_count),
        cpu_seconds=draw(optional_count),
        max_file_bytes=draw(optional_count),
        disk_bytes=draw(optional_count),
        disk_files=draw(optional_count),
        output_cap_bytes=draw(st.integers(1, 1 << 40)),
        file_cap_bytes=draw(st.integers(1, 1 << 40)),
        min_timeout_s=low,
        default_timeout_s=middle,
        max_timeout_s=high,
        use_cgroups=draw(st.booleans()),
        bwrap=draw(st.sampled_from(["bwrap", "/usr/bin/bwrap", "-odd/bwrap", "/opt/b w/bwrap"])),
        slot_uid_base=draw(st.integers(MIN_SLOT_UID_BASE, MAX_SLOT_UID)),
    )


def _parse(words: list[str]) -> SlotIsolation:
    return isolation_of(parse_args([*_SERVER, *words]))


@given(isolations())
def test_a_policy_reads_back_from_its_flags_as_the_same_policy(isolation: SlotIsolation) -> None:
    assert _parse(isolation_argv(isolation)) == isolation


def test_no_flags_give_the_default_policy() -> None:
    assert _parse([]) == SlotIsolation()
    assert _parse(isolation_argv(SlotIsolation())) == SlotIsolation()


def test_every_field_has_exactly_one_flag_and_the_server_takes_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert [flag.field for flag in ISOLATION_FLAGS] == [f.name for f in attrs.fields(SlotIsolation)]
    names = [flag.name for flag in ISOLATION_FLAGS]
    assert len(set(names)) == len(names)
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    listed = {word.strip("[],") for word in capsys.readouterr().out.split()}
    assert set(names) <= listed


def test_switches_appear_only_when_they_differ_from_the_default() -> None:
    assert not {"--allow-network", "--require-sandbox", "--no-cgroups"} & set(
        isolation_argv(SlotIsolation())
    )
    words = isolation_argv(
        SlotIsolation(allow_network=True, use_cgroups=False, read_only_root=False)
    )
    assert {"--allow-network", "--no-cgroups", "--writable-root"} <= set(words)


def test_each_valued_flag_is_one_word_so_a_path_may_start_with_a_dash() -> None:
    words = isolation_argv(SlotIsolation(bwrap="-x/bwrap"))
    assert "--bwrap=-x/bwrap" in words
    assert all(word.startswith("--") for word in words)


def test_memory_travels_in_bytes_and_none_as_none() -> None:
    words = isolation_argv(SlotIsolation(memory_bytes=512 << 20, cpu_seconds=None))
    assert f"--memory-bytes={512 << 20}" in words
    assert "--cpu-seconds=none" in words
    assert _parse(["--memory-bytes=none"]).memory_bytes is None


def test_the_slot_uid_base_travels_on_the_command_line() -> None:
    assert f"--slot-uid-base={DEFAULT_SLOT_UID_BASE}" in isolation_argv(SlotIsolation())
    assert _parse(isolation_argv(SlotIsolation(slot_uid_base=2_000_000))).slot_uid_base == 2_000_000


@pytest.mark.parametrize(
    ("words", "flag", "reason"),
    [
        (["--memory-bytes=0"], "--memory-bytes", "must be None or an integer >= 1"),
        (["--disk-bytes=0"], "--disk-bytes", "must be None or an integer >= 1"),
        (["--disk-bytes=-5"], "--disk-bytes", "must be None or an integer >= 1"),
        (["--disk-files=0"], "--disk-files", "must be None or an integer >= 1"),
        (["--disk-files=-1"], "--disk-files", "must be None or an integer >= 1"),
        (["--min-timeout-s=nan"], "--min-timeout-s", "must be finite seconds > 0"),
        (["--min-timeout-s=9", "--default-timeout-s=2"], "--default-timeout-s", "must lie in"),
        (['--system-paths=["usr"]'], "--system-paths[0]", "is not an absolute path"),
    ],
)
def test_a_bad_value_names_its_flag(words: list[str], flag: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _parse(words)
    assert caught.value.field == flag
    assert reason in caught.value.reason


@pytest.mark.parametrize(
    "word",
    [
        "--max-processes=many",
        "--disk-bytes=1.5",
        "--disk-bytes=10GiB",
        "--disk-files=lots",
        "--system-paths=/usr",
        "--system-paths={}",
        "--extra-binds=[1]",
        '--extra-binds=[{"source": "/a"}]',
        '--extra-binds=[{"source": "/a", "dest": "/b", "writable": 1}]',
    ],
)
def test_a_malformed_word_is_a_usage_error(word: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_args([*_SERVER, word])
    assert caught.value.code == 2
    assert word.split("=", 1)[0] in capsys.readouterr().err
