"""``serve_workers.worker_count``: Atropos's default worker count against the pool's slots.

- Atropos's default (``max_num_workers=-1``) is capped, for a pool of fixed size, at the groups
  whose members all fit in the slots (at least one group), and logged; a default that fits is
  kept as ``-1``.
- A ``max_num_workers`` set by hand is kept; one the slots cannot hold is warned about, naming
  the setting, the trajectories and the slots.
- A pool that grows with waiting leases (any other ``sandbox``) keeps Atropos's count.
"""

from __future__ import annotations

import logging

import pytest

from trajcore.entrypoints.atropos.serve_workers import worker_count


def test_atropos_default_is_capped_to_the_groups_a_fixed_pool_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="trajcore.env"):
        got = worker_count(
            max_num_workers=-1, atropos_default=8, group_size=4, slots=16, sandbox="local"
        )
    assert got == 4
    assert "serve runs at most 4 groups at once: 16 slots hold 4 groups" in caplog.text
    assert (
        worker_count(
            max_num_workers=-1, atropos_default=8, group_size=16, slots=8, sandbox="container"
        )
        == 1
    )  # at least one group, whose members wait their turn
    assert (
        worker_count(max_num_workers=-1, atropos_default=2, group_size=4, slots=16, sandbox="ssh")
        == -1
    )  # Atropos's own count fits


def test_a_hand_set_count_is_kept_and_warned_about_when_the_slots_cannot_hold_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="trajcore.env"):
        got = worker_count(
            max_num_workers=6, atropos_default=8, group_size=4, slots=16, sandbox="local"
        )
    assert got == 6
    assert "max_num_workers=6 groups of group_size=4 are 24 trajectories for the pool's 16 " in (
        caplog.text
    )


def test_a_growing_pool_keeps_atroposs_count() -> None:
    for sandbox in ("nomad", "slurm", "modal", "my_pool"):
        assert (
            worker_count(
                max_num_workers=-1, atropos_default=8, group_size=4, slots=4, sandbox=sandbox
            )
            == -1
        )
