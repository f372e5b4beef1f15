"""What the Nomad pool's tests share: the fake's schema, a fast pool config, polling waits, and
the pool-to-fake registry their crash hooks kill allocations through."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from tests.flat_settings import split_off
from trajcore.adapters.pools.nomad_pool import NomadPoolConfig, NomadSandboxPool
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.json_values import JSONObject
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.fake_nomad.agent import FakeNomadAPI
from trajcore.testing.fake_nomad.openapi import OPENAPI_ENV, NomadOpenAPI

# Nomad's OpenAPI description lives beside the repository (never copied into it); CI and ./dev
# set the variable, and a plain pytest run gets the same default here.
os.environ.setdefault(
    OPENAPI_ENV,
    str(
        Path(__file__).resolve().parents[1].parent
        / "shared"
        / "reference"
        / "nomad-openapi-v1.yaml"
    ),
)


def _openapi() -> tuple[NomadOpenAPI | None, str]:
    try:
        return NomadOpenAPI.from_env(), ""
    except ConfigError as error:
        return None, str(error)


SLOT_SERVER = (sys.executable, "-m", "trajcore.entrypoints.slot_server")
"""The real slot server, as a raw_exec task runs it."""

OPENAPI, OPENAPI_PROBLEM = _openapi()


def group_and_task(job: JSONObject) -> tuple[JSONObject, JSONObject]:
    """The one task group of ``job`` (a job's JSON as ``job_json`` writes it) and its one task."""
    groups = job["TaskGroups"]
    assert isinstance(groups, list)
    assert len(groups) == 1
    group = groups[0]
    assert isinstance(group, dict)
    tasks = group["Tasks"]
    assert isinstance(tasks, list)
    assert len(tasks) == 1
    task = tasks[0]
    assert isinstance(task, dict)
    return group, task


"""Nomad's OpenAPI description (``None`` when ``$TRAJCORE_NOMAD_OPENAPI`` names no file), and
why it is missing."""

needs_openapi = pytest.mark.skipif(
    OPENAPI is None,
    reason=f"Nomad's OpenAPI description is needed: {OPENAPI_PROBLEM} (set {OPENAPI_ENV} to the "
    "path of nomad-openapi-v1.yaml)",
)


def nomad_pool_config(
    address: str,
    *,
    containers: int = 1,
    slots_per_container: int = 1,
    acquire_timeout_s: float | None = 30.0,
    **overrides: object,
) -> NomadPoolConfig:
    """A raw_exec pool of the real slot server, tuned for fast tests (``overrides`` win)."""
    settings: dict[str, object] = {
        "address": address,
        "job_id": "test-slots",
        "driver": "raw_exec",
        "command": SLOT_SERVER,
        "slots_per_container": slots_per_container,
        "min_containers": containers,
        "max_containers": containers,
        "acquire_timeout_s": acquire_timeout_s,
        "isolation": SlotIsolation(
            require_sandbox=shutil.which("bwrap") is not None,
            min_timeout_s=0.2,
            max_processes=64,
            memory_bytes=512 << 20,
        ),
        "memory_mb": 512,
        "start_timeout_s": 20.0,
        "reset_timeout_s": 10.0,
        "poll_interval_s": 0.05,
        "request_timeout_s": 5.0,
        "stop_timeout_s": 5.0,
        "cooldown_s": 0.0,
    }
    settings.update(overrides)
    return pool_config(**settings)


def pool_config(**settings: object) -> NomadPoolConfig:
    """A ``NomadPoolConfig`` from flat settings: the job's (``NomadJobSettings``) go to ``job``,
    the slot servers' (``SlotServerSettings``) to ``server``, the scaling ones
    (``ScaleSettings``) to ``scaling``."""
    pool, defaults = dict(settings), NomadPoolConfig()
    job, server = split_off(defaults.job, pool), split_off(defaults.server, pool)
    scaling = split_off(defaults.scaling, pool)
    return NomadPoolConfig(job=job, server=server, scaling=scaling, **pool)  # type: ignore[arg-type]


async def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll ``check`` until it holds; fail the test naming ``what`` after ``timeout_s``."""
    with anyio.move_on_after(timeout_s):
        while not check():  # noqa: ASYNC110 - the pool has no event for this
            await anyio.sleep(0.02)
        return
    pytest.fail(f"never happened within {timeout_s} s: {what}")


_FAKES: dict[int, FakeNomadAPI] = {}


@asynccontextmanager
async def pool_on(fake: FakeNomadAPI, config: NomadPoolConfig) -> AsyncIterator[SandboxPool]:
    """A started Nomad pool on ``fake``, known to ``crash_allocation`` while it is open; the fake
    must have seen no request that breaks Nomad's API when it closes."""
    async with NomadSandboxPool(config) as pool:
        _FAKES[id(pool)] = fake
        try:
            yield pool
        finally:
            del _FAKES[id(pool)]
    assert fake.violations == []


def crash_allocation(pool: SandboxPool, container: str) -> None:
    """Kill the allocation behind the pool's ``container`` (the contract suites' crash hook)."""
    assert isinstance(pool, NomadSandboxPool)
    _FAKES[id(pool)].kill_allocation(pool.allocation_id(container))
