"""A slot server whose disk budget is at or below its file-size limit says so at its start,
naming both fields and their values: the file-size rlimit then never stops a writer before the
budget is gone. It still starts (lowering the budget alone is a sound setting); a budget above
the file-size limit starts without a word.
"""

from __future__ import annotations

import signal

import pytest

from tests.integration.test_slot_server import searchable_dir, start_server, stop_server


def started_saying(*flags: str) -> str:
    """What a slot server started with ``flags`` wrote to its stderr until it stopped."""
    with searchable_dir("disk-settings") as folder:
        server = start_server(folder / "root", *flags)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(20) == 0
        assert server.process.stderr is not None
        said = server.process.stderr.read().decode()
        stop_server(server)
        return said


@pytest.mark.parametrize("budget", [1 << 20, 2 << 20])
def test_a_budget_at_or_below_the_file_size_limit_is_named_at_the_start(budget: int) -> None:
    said = started_saying("--disk-bytes", str(budget), "--max-file-bytes", str(2 << 20))
    assert f"disk_bytes ({budget}) is not above max_file_bytes ({2 << 20})" in said, said


def test_a_budget_above_the_file_size_limit_starts_without_a_word() -> None:
    said = started_saying("--disk-bytes", str(4 << 20), "--max-file-bytes", str(2 << 20))
    assert "disk_bytes" not in said, said
