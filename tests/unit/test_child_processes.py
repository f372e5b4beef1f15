"""The tests' own process-group helper ends a whole group, not only its leader."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.processes import child_environment, process_group


def test_a_member_that_ignores_sigterm_is_killed_after_its_leader_exits(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    member = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "time.sleep(100)\n"
    )
    leader = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]])\n"
        "time.sleep(100)\n"
    )
    argv = [sys.executable, "-c", leader, member, str(ready)]
    with process_group(argv, tmp_path / "log", child_environment()) as process:
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text()):
            assert process.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pid = int(ready.read_text())
    # ``process_group`` checked on the way out that nothing of the group is left
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
