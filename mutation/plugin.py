"""The pytest plugin of mutation runs (``./dev mutate`` loads it with ``-p mutation.plugin``).

mutmut stops a mutant's run at the first failing test (``-x``), so time goes to the mutants the
tests kill late, to the ones they miss, and to the ones that hang. Three things keep that short
without changing what the tests check:

- The fastest tests run first, so a mutant that a quick example kills does not wait for a state
  machine. The durations are those mutmut measured in its clean run (``mutmut-stats.json`` in
  the folder the tests run in); tests of equal or unknown duration keep their order.
- Hypothesis does not shrink: a failing example kills the mutant as it is, and shrinking it (many
  replays of a state machine) would only make the report's reproduction shorter, which nobody
  reads here. Every other setting of the profile in force (``HYPOTHESIS_PROFILE``, ``ci`` under
  ``./dev mutate``) stays.
- A mutant's test that runs far past its own measured time is stopped: after
  ``STOP_FLOOR_S + STOP_FACTOR * d`` seconds of CPU time, ``d`` being the test's wall time in
  the clean run. The mutant then counts as a timeout (mutmut's exit status 36), as it would
  after mutmut's own limit, which is the time of *every* selected test that reaches the mutated
  function plus 10 s: for the parsers' shared helpers a hang in their first, 10 ms test waited
  out two minutes of properties over every family. CPU time, not wall time, so a busy machine
  does not stop a test that is merely waiting for a core. Each stop is written, with the test
  and the limit, to ``stopped.jsonl`` beside the tests, and ``./dev mutate`` lists it in the
  report, so that a stop can be judged. Only mutants' runs are limited, never the clean run.
"""

from __future__ import annotations

import functools
import json
import os
import signal
from collections.abc import Generator
from pathlib import Path
from types import FrameType

import pytest
from hypothesis import Phase, settings

STOP_FLOOR_S = 10.0
STOP_FACTOR = 3.0
STOPPED = Path("stopped.jsonl")
TIMEOUT_EXIT = 36  # mutmut's status for a timeout


@functools.cache
def _durations() -> dict[str, float]:
    stats = Path("mutmut-stats.json")
    if not stats.is_file():
        return {}
    durations: dict[str, float] = json.loads(stats.read_text()).get("duration_by_test", {})
    return durations


def _mutant_under_test() -> str:
    """The mutant this process tests (empty in the clean run and mutmut's other runs)."""
    name = os.environ.get("MUTANT_UNDER_TEST", "")
    return name if "__mutmut_" in name else ""


def pytest_configure(config: pytest.Config) -> None:
    phases = [phase for phase in settings().phases if phase not in (Phase.shrink, Phase.explain)]
    settings.register_profile("mutation", parent=settings(), phases=phases)
    settings.load_profile("mutation")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    durations = _durations()
    if durations:
        items.sort(key=lambda item: durations.get(item.nodeid, 0.0))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    mutant = _mutant_under_test()
    if not mutant:
        yield
        return
    limit = STOP_FLOOR_S + STOP_FACTOR * _durations().get(item.nodeid, 0.0)

    def stop(signum: int, frame: FrameType | None) -> None:
        record = {"mutant": mutant, "test": item.nodeid, "cpu_limit_s": round(limit, 1)}
        with STOPPED.open("a") as f:
            f.write(json.dumps(record) + "\n")
        os._exit(TIMEOUT_EXIT)

    previous = signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
