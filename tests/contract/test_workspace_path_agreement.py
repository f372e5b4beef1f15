"""The fakes answer a file tool's path word for word as the slot server does.

The contract (``trajcore.testing.workspace_paths``) holds every pool to the outcome of each
path; here the fake and the unisolated pool are held to the local pool's exact answers (outcome,
error text, content) over the same workspace, path by path, so that an env whose hook or test
matches a message on the fakes meets the same message on a real pool.
"""

from __future__ import annotations

import shutil

import pytest

from trajcore.adapters.fakes.sandbox import FakeSandboxPool, InProcessSlotPool
from trajcore.adapters.fakes.unisolated import UnisolatedSandboxPool
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import Lease
from trajcore.domain.tools import ToolOutcome
from trajcore.testing.portal_pools import slot_call
from trajcore.testing.workspace_paths import (
    NO_FILE_READS,
    NO_FILE_WRITES,
    REFUSED_CONTENTS,
    REFUSED_PATHS,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

# Over a workspace of ``file`` and ``dir/inner``: each refused path, each path naming no file,
# and spellings that read or write a file.
PATHS = (
    *REFUSED_PATHS, *NO_FILE_WRITES,
    "file", "./file", "~/dir/inner", "~//file", "~///dir//inner", "a//b/./c", "\udcff",
)  # fmt: skip
Answer = tuple[ToolOutcome, str | None, str]


# Over the same workspace: writes whose text no UTF-8 carries (and plain text), to a path inside,
# to one naming no file, to a refused one.
WRITES = tuple(
    (path, content)
    for content in (*REFUSED_CONTENTS, "w")
    for path in ("file", "new.txt", "~//new.txt", "dir", "../x", "\ud800x")
)


async def _prepare(pool: LocalSandboxPool | InProcessSlotPool, lease: Lease) -> None:
    """Put a fresh ``file`` and ``dir/inner`` in the workspace (a write may have changed them)."""
    prepare = [
        slot_call(lease, "write_file", path=name, content=name) for name in ("file", "dir/inner")
    ]
    await pool.execute(lease.slot.container, prepare)


async def _answers(pool: LocalSandboxPool | InProcessSlotPool) -> dict[tuple[str, str], Answer]:
    answers: dict[tuple[str, str], Answer] = {}
    async with pool, pool.lease("t") as lease:
        await _prepare(pool, lease)
        for path, content in WRITES:
            call = slot_call(lease, "write_file", path=path, content=content)
            (result,) = await pool.execute(lease.slot.container, [call])
            answers[f"write {content!r}", path] = (result.outcome, result.error, result.content)
        for path in dict.fromkeys(PATHS + NO_FILE_READS):
            for tool in ("read_file", "write_file"):
                await _prepare(pool, lease)  # each call over a fresh workspace
                call = (
                    slot_call(lease, tool, path=path, content="w")
                    if tool == "write_file"
                    else slot_call(lease, tool, path=path)
                )
                (result,) = await pool.execute(lease.slot.container, [call])
                answers[tool, path] = (result.outcome, result.error, result.content)
    return answers


def _local_pool() -> LocalSandboxPool:
    isolation = SlotIsolation(
        require_sandbox=True, min_timeout_s=0.2, max_processes=64, memory_bytes=512 << 20
    )
    server = SlotServerSettings(slots_per_container=1, isolation=isolation, reset_timeout_s=10.0)
    return LocalSandboxPool(LocalPoolConfig(containers=1, server=server))


@pytest.mark.parametrize("fake", [FakeSandboxPool, UnisolatedSandboxPool])
async def test_a_fake_answers_each_path_as_the_slot_server_does(
    fake: type[FakeSandboxPool | UnisolatedSandboxPool],
) -> None:
    real = await _answers(_local_pool())
    faked = await _answers(fake(slots_per_container=1))
    differences = {key: (real[key], faked[key]) for key in real if real[key] != faked[key]}
    assert differences == {}
