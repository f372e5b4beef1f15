"""How much of the loaded hypothesis profile a shipped suite spends.

The suites in ``trajcore.testing`` scale from the profile the test run loaded (``ci``, ``dev``,
``deep``; see docs/testing.md), so one knob -- the profile -- sets how long every suite explores:

- ``machine_settings(scale, step_scale)``: a state machine runs ``scale`` times the profile's
  ``max_examples`` sequences (at least 2) of ``step_scale`` times its ``stateful_step_count``
  steps (at least 5), with no per-step deadline and the first failure reported.
- ``property_settings(fraction, minimum)``: a property over a fixture the suite reuses (a
  tokenizer, a server factory) runs ``fraction`` of the profile's ``max_examples`` (at least
  ``minimum``), with the health checks that such reuse trips switched off.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, settings

__all__ = ["loaded_profile", "machine_settings", "property_settings"]


def loaded_profile() -> settings:
    """The hypothesis settings profile the run loaded."""
    base = settings.default
    assert base is not None, "hypothesis has no settings profile loaded"
    return base


def machine_settings(scale: float, step_scale: float) -> settings:
    """Settings for a state machine: ``scale`` x the profile's examples, ``step_scale`` x its
    steps (see the module doc)."""
    base = loaded_profile()
    return settings(
        base,
        max_examples=max(2, math.ceil(base.max_examples * scale)),
        stateful_step_count=max(5, math.ceil(base.stateful_step_count * step_scale)),
        deadline=None,
        report_multiple_bugs=False,
    )


def property_settings(fraction: float, minimum: int) -> settings:
    """Settings for a property whose test reuses a function-scoped fixture across examples."""
    base = loaded_profile()
    return settings(
        max_examples=max(minimum, math.floor(base.max_examples * fraction)),
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
            HealthCheck.too_slow,
        ],
    )
