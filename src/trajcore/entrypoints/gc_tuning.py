"""How often the env process's garbage collector looks at young objects during a run.

A rollout allocates many short-lived container objects (messages, tool calls, results, request
bodies) and almost no reference cycles: in ``bench/rollouts.py`` about 0.2 cyclic objects per
trajectory. With CPython's default young-generation threshold (700 allocations) the collector
ran about 170 times per 1,024 trajectories and took 0.19-0.23 ms of the env's ~1 ms of CPU per
trajectory, finding nearly nothing. A threshold of 10,000 cut that to 0.04-0.05 ms (the env's
CPU per trajectory 0.79-0.91 ms against 0.99-1.16 ms, load 13-56; docs/benchmarks.md). On a
many-core host the env's one process is what rollouts plateau on, so this is throughput there.

The env's ``serve``, ``process`` and ``evaluate`` runs apply ``gc_young_threshold`` (an
``AgentEnvConfig`` field, ``None`` leaves Python's) for the run's length and put the previous
thresholds back after it; the older generations' thresholds are left as they were. Cycles are
still collected, only later: memory held by uncollected cycles stays bounded by the threshold.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["DEFAULT_YOUNG_GC_THRESHOLD", "young_gc_threshold"]

DEFAULT_YOUNG_GC_THRESHOLD = 10_000
"""Allocations (less deallocations) of container objects between two young collections."""


@contextlib.contextmanager
def young_gc_threshold(threshold: int | None) -> Iterator[None]:
    """Within the block, collect the young generation every ``threshold`` allocations
    (``None``: leave the collector as it is); the previous thresholds come back after it."""
    if threshold is None:
        yield
        return
    previous = gc.get_threshold()
    gc.set_threshold(threshold, *previous[1:])
    try:
        yield
    finally:
        gc.set_threshold(*previous)
