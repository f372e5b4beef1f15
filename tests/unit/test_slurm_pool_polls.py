"""The Slurm pool's poll through outages, with the Slurm commands played by small scripts on
``PATH`` (real processes): the heartbeat, the stray rule, and ``sbatch``'s refusals."""

from __future__ import annotations

import gc
import os
import time
import warnings
from pathlib import Path

import anyio
import pytest

from trajcore.adapters.pools.slurm_pool import (
    SlurmPoolConfig,
    SlurmRefused,
    SlurmSandboxPool,
    _SlurmJobs,
    run_slurm,
)
from trajcore.domain.errors import ConfigError

pytestmark = pytest.mark.anyio

_OTHER = "7|RUNNING|10:00|node1|trajcore:other0:0\n"


class FakeSlurm:
    """``squeue``, ``scancel`` and ``sbatch`` as scripts: ``squeue`` fails while ``down`` exists
    and prints ``listing`` otherwise, ``scancel`` records its words, ``sbatch`` fails printing
    ``refusal``."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        self.down = root / "down"
        self.listing = root / "listing"
        self.listing.write_text("", encoding="utf-8")
        self.cancelled = root / "cancelled"
        self.refusal = root / "refusal"
        self.refusal.write_text("", encoding="utf-8")
        scripts = {
            "squeue": f'[ -e "{self.down}" ] && {{ echo "Socket timed out" >&2; exit 1; }}\n'
            f'cat "{self.listing}"\n',
            "scancel": f'echo "$@" >> "{self.cancelled}"\n',
            "sbatch": f'cat "{self.refusal}" >&2; exit 1\n',
        }
        for name, body in scripts.items():
            path = self.bin / name
            path.write_text(f"#!/bin/sh\n{body}", encoding="utf-8")
            path.chmod(0o755)
        monkeypatch.setenv("PATH", f"{self.bin}{os.pathsep}{os.environ['PATH']}")

    def cancels(self) -> str:
        return self.cancelled.read_text(encoding="utf-8") if self.cancelled.exists() else ""


def _jobs(root: Path, **settings: object) -> tuple[SlurmSandboxPool, _SlurmJobs]:
    """A pool's job source polling a run directory under ``root/shared`` (not started)."""
    shared = root / "shared"
    shared.mkdir()
    config = SlurmPoolConfig(shared_dir=shared, **settings)  # type: ignore[arg-type]
    pool = SlurmSandboxPool(config)
    jobs = pool._jobs
    jobs._pool = pool
    jobs.run_dir = shared / f"{pool.config.job.job_name}-{jobs.run}-x"
    jobs.run_dir.mkdir()
    return pool, jobs


def _other_run(root: Path, age_s: float) -> None:
    beat = root / "shared" / "trajcore-slots-other0-x" / "heartbeat"
    beat.parent.mkdir()
    beat.touch()
    os.utime(beat, (time.time() - age_s,) * 2)


async def test_the_heartbeat_is_touched_while_slurm_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm = FakeSlurm(tmp_path, monkeypatch)
    _, jobs = _jobs(tmp_path)
    assert jobs.run_dir is not None
    beat = jobs.run_dir / "heartbeat"
    beat.touch()
    os.utime(beat, (time.time() - 3600.0,) * 2)
    slurm.down.touch()
    with pytest.raises(SlurmRefused):
        await jobs._tick()
    assert time.time() - beat.stat().st_mtime < 60.0


async def test_a_stale_heartbeat_is_no_proof_until_this_pool_has_polled_for_stray_after_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after the controller comes back, another run's old heartbeat shows only that no
    pool could poll: its jobs are kept until this pool has polled well for stray_after_s."""
    slurm = FakeSlurm(tmp_path, monkeypatch)
    slurm.listing.write_text(_OTHER, encoding="utf-8")
    _, jobs = _jobs(tmp_path, stray_after_s=0.4, poll_interval_s=0.05)
    _other_run(tmp_path, 3600.0)
    await jobs._tick()
    assert slurm.cancels() == ""
    slurm.down.touch()  # an outage breaks the stretch of good polls
    with pytest.raises(SlurmRefused):
        await jobs._tick()
    slurm.down.unlink()
    started = anyio.current_time()
    with anyio.fail_after(10):
        while not slurm.cancels():
            await jobs._tick()
            await anyio.sleep(0.02)
    assert anyio.current_time() - started >= 0.4
    assert slurm.cancels().split() == ["7"]
    assert any("run other0 are cancelled" in p for p in jobs.pool.problems)


async def test_a_heartbeat_that_cannot_be_touched_is_noted_once_and_the_polls_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm = FakeSlurm(tmp_path, monkeypatch)
    slurm.listing.write_text(_OTHER, encoding="utf-8")
    pool, jobs = _jobs(tmp_path, stray_after_s=0.1, poll_interval_s=0.02)
    _other_run(tmp_path, 3600.0)
    assert jobs.run_dir is not None
    jobs.run_dir.rmdir()
    with anyio.move_on_after(0.5):
        await jobs._watch()  # (raised OSError before)
    notes = [p for p in pool.problems if "could not touch the run's heartbeat" in p]
    assert len(notes) == 1, pool.problems
    assert slurm.cancels() == ""  # this pool's own polls are not good: nothing is judged


@pytest.mark.parametrize(
    ("said", "fatal"),
    [
        ("sbatch: error: Batch job submission failed: Invalid qos specification", "slurm_qos"),
        ("sbatch: error: Batch job submission failed: Resource temporarily unavailable", None),
    ],
)
async def test_only_a_known_refusal_of_the_first_job_fails_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, said: str, fatal: str | None
) -> None:
    slurm = FakeSlurm(tmp_path, monkeypatch)
    slurm.refusal.write_text(said, encoding="utf-8")
    _, jobs = _jobs(tmp_path)
    now = anyio.current_time()
    with pytest.raises(SlurmRefused):
        await jobs._submit(0, now)
    if fatal is None:
        assert jobs._fatal is None
    else:
        assert isinstance(jobs._fatal, ConfigError)
        assert jobs._fatal.field == fatal
    assert not jobs._backoff.due(0, now + 0.1)  # retried only after the delay
    assert jobs._backoff.due(0, now + 1.0)


def test_a_slurm_command_cancelled_as_it_starts_leaves_no_process_or_pipe_to_the_closed_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll cancelled while its ``squeue`` starts (the pool's close, a deadline) kills and reaps
    it before the cancellation goes on: nothing is left for the garbage collector to find once
    the loop has closed (it used to leave the child and its pipe transports, whose
    ``ResourceWarning`` then failed whichever test ran when they were collected)."""
    slurm = FakeSlurm(tmp_path, monkeypatch)
    slurm.listing.write_text(_OTHER, encoding="utf-8")
    squeue = str(slurm.bin / "squeue")

    async def cancelled_after(turns: int) -> None:
        async def poll(scope: anyio.CancelScope) -> None:
            with scope:
                await run_slurm([squeue], timeout_s=10.0)

        scope = anyio.CancelScope()
        async with anyio.create_task_group() as group:
            group.start_soon(poll, scope)
            for _ in range(turns):
                await anyio.lowlevel.checkpoint()
            scope.cancel()

    for turns in range(12):  # each point of the start, the command's run and its end
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            anyio.run(cancelled_after, turns)
            gc.collect()
        leaks = [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
        assert leaks == [], f"cancelled after {turns} turns: {leaks}"
