"""The pytest plugin of mutation runs (``./dev mutate`` loads it with ``-p mutation.plugin``).

mutmut stops a mutant's run at the first failing test (``-x``), so time goes to the mutants the
tests kill late and to the ones they miss. Two things keep that short without changing what the
tests check:

- The fastest tests run first, so a mutant that a quick example kills does not wait for a state
  machine. The durations are those mutmut measured in its clean run (``mutmut-stats.json`` in
  the folder the tests run in); tests of equal or unknown duration keep their order.
- Hypothesis does not shrink: a failing example kills the mutant as it is, and shrinking it (many
  replays of a state machine) would only make the report's reproduction shorter, which nobody
  reads here. Every other setting of the profile in force (``HYPOTHESIS_PROFILE``, ``ci`` under
  ``./dev mutate``) stays.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import Phase, settings


def pytest_configure(config: pytest.Config) -> None:
    phases = [phase for phase in settings().phases if phase not in (Phase.shrink, Phase.explain)]
    settings.register_profile("mutation", parent=settings(), phases=phases)
    settings.load_profile("mutation")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    stats = Path("mutmut-stats.json")
    if not stats.is_file():
        return
    durations: dict[str, float] = json.loads(stats.read_text()).get("duration_by_test", {})
    items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
