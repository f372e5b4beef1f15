"""A pytest plugin for mutation runs: the fastest tests first.

mutmut stops a mutant's run at the first failing test (``-x``), so a mutant that a quick example
test kills should not wait for a state machine first. The durations are the ones mutmut measured
in its first, clean run (``mutmut-stats.json`` in the folder the tests run in); the order of tests
of equal or unknown duration is kept. Without that file it does nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    stats = Path("mutmut-stats.json")
    if not stats.is_file():
        return
    durations: dict[str, float] = json.loads(stats.read_text()).get("duration_by_test", {})
    items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
