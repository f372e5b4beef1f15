"""The shipped slot helper: used only when it matches this source and nobody else can replace it;
otherwise the run-time build is the fallback, and when that fails too both reasons are given."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trajcore.adapters.slot_server.native_helper import (
    SHIPPED_SLOT_HELPER,
    NativeBuildError,
    build_slot_helper,
    compile_slot_helper,
    shipped_slot_helper,
)

HAS_COMPILER = any(shutil.which(name) for name in ("cc", "gcc", "clang"))
needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler (cc, gcc, clang)")


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    if not HAS_COMPILER:
        pytest.skip("no C compiler (cc, gcc, clang) to build a helper to ship")
    return compile_slot_helper(tmp_path / "_native" / "slot-helper")


@needs_compiler
def test_a_compiled_helper_is_shipped_with_its_source_digest_and_runs(shipped: Path) -> None:
    assert shipped_slot_helper(shipped) == shipped
    # the keeper refuses a malformed command line: it is the real program, not a stub
    done = subprocess.run([str(shipped)], capture_output=True, timeout=30, check=False)
    assert done.returncode == 2
    assert b"usage: slot-helper keep" in done.stderr


@needs_compiler
def test_a_helper_built_from_another_source_is_refused(shipped: Path) -> None:
    shipped.with_name("slot-helper.sha256").write_text("0" * 64 + "\n")
    with pytest.raises(NativeBuildError, match=r"built from another slot_helper\.c"):
        shipped_slot_helper(shipped)


@needs_compiler
def test_a_helper_others_can_replace_is_refused(shipped: Path) -> None:
    shipped.chmod(0o777)
    with pytest.raises(NativeBuildError, match=r"writable by others \(mode 777\)"):
        shipped_slot_helper(shipped)


@needs_compiler
def test_a_helper_that_cannot_run_is_refused(shipped: Path) -> None:
    shipped.chmod(0o644)
    with pytest.raises(NativeBuildError, match="not executable"):
        shipped_slot_helper(shipped)


def test_a_missing_helper_is_named(tmp_path: Path) -> None:
    with pytest.raises(NativeBuildError, match="no compiled helper ships with this install"):
        shipped_slot_helper(tmp_path / "slot-helper")


def test_a_source_checkout_ships_nothing_and_names_both_reasons_when_it_cannot_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not SHIPPED_SLOT_HELPER.exists()  # this checkout (an editable install) ships none
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("TRAJCORE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(NativeBuildError) as caught:
        build_slot_helper()
    message = str(caught.value)
    assert "no compiled helper ships with this install" in message
    assert "the run-time build failed" in message
    assert "no-such-cc" in message


@needs_compiler
def test_a_source_checkout_falls_back_to_the_run_time_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRAJCORE_CACHE_DIR", str(cache))
    built = build_slot_helper()
    assert built.parent == cache
    assert built.name.startswith("slot-helper-")
