"""The container pool's guard process over a scripted engine (no podman needed): what it removes
when its pool's process ends without saying its close is done, and what it never touches.

The engine is a small shell script over a state file (one container a line: ID, name, pool
label, owner label); it lists every container whatever the filters say, so the guard's own
check of each container's labels is what keeps others' containers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

OWNER = "host/1/42/7/abc"
ENGINE = """#!/bin/sh
state={state}
exec 9>>"$state.lock"
flock 9  # one command at a time over the state file (the guard removes in parallel)
echo "$*" >> {log}
case "$1" in
    ps) cut -d' ' -f1 "$state" ;;
    inspect) shift 3; for id in "$@"; do grep "^$id " "$state"; done ;;
    rm) grep -v "^$4 " "$state" > "$state.new"; mv "$state.new" "$state" ;;
    *) exit 1 ;;
esac
"""


def _guard(tmp_path: Path, containers: list[str], pool_says: str) -> tuple[list[str], str, str]:
    """Run the guard of pool ``p`` (owner ``OWNER``) over ``containers`` until it exits, after
    ``pool_says`` on its stdin and the end of it; (the containers left, the engine's log, what
    the guard said: its stderr, which its pool points at the guards' log)."""
    state, log = tmp_path / "state", tmp_path / "log"
    state.write_text("".join(f"{line}\n" for line in containers), encoding="utf-8")
    log.touch()
    engine = tmp_path / "engine"
    engine.write_text(ENGINE.format(state=state, log=log), encoding="utf-8")
    engine.chmod(0o755)
    folder = tmp_path / "token-folder"
    folder.mkdir()
    code = "from trajcore.adapters.pools.container_guard import guard_containers as g; g()"
    done = subprocess.run(
        [sys.executable, "-c", code, str(engine), "p", OWNER, str(folder), "20"],
        input=pool_says, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert folder.exists() == pool_says.endswith("done\n")
    left = state.read_text(encoding="utf-8").splitlines()
    return left, log.read_text(encoding="utf-8"), done.stderr


def test_a_pool_that_ended_without_its_close_loses_its_containers_and_no_others(
    tmp_path: Path,
) -> None:
    ours = ["c1 p-0-1 p " + OWNER, "c2 p-1-2 p " + OWNER]
    others = [
        "c3 p-0-1 p host/1/42/7/another-pool",  # the same process's other pool, same prefix
        "c4 q-0-1 q " + OWNER,  # another prefix
        "c5 p-0-1 p host/1/43/7/abc",  # another process
    ]
    left, log, said = _guard(tmp_path, ours + others, "run p-0-1\nran p-0-1\n")
    assert left == others
    (line,) = said.splitlines()
    assert line.endswith(
        "trajcore container pool p: its process ended without closing it; removed its "
        "containers (p-0-1, p-1-2) and its token folder"
    ), said
    assert "rm --force --volumes c1" in log
    assert "rm --force --volumes c2" in log
    assert not any(f"rm --force --volumes {c.split()[0]}" in log for c in others)


def test_a_start_under_way_when_the_pool_died_is_waited_for(tmp_path: Path) -> None:
    """A ``run`` told but not ``ran``: the guard lists again until that name has appeared
    (here it is there at once) and removes it."""
    left, _, _ = _guard(tmp_path, ["c9 p-2-3 p " + OWNER], "run p-2-3\n")
    assert left == []


def test_a_closed_pool_s_guard_exits_touching_nothing(tmp_path: Path) -> None:
    ours = ["c1 p-0-1 p " + OWNER]
    left, log, said = _guard(tmp_path, ours, "run p-0-1\nran p-0-1\ndone\n")
    assert left == ours
    assert log == ""
    assert said == ""
