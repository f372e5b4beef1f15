"""The Slurm pool's pure parts: the job's words, Slurm's answers, the job plan, and the
reconciler's handling of runs that end soon (a job near its time limit)."""

from __future__ import annotations

import pytest

from trajcore.adapters.pools.slurm_pool import SlurmPoolConfig
from trajcore.domain.errors import ConfigError, InvalidInput
from trajcore.domain.nomad_reconcile import (
    Allocation,
    Drain,
    Join,
    Lose,
    MemberState,
    NomadReconciler,
    ReconcileConfig,
    Remove,
    Replace,
)
from trajcore.domain.scaling import ScaleSettings
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slurm_jobs import (
    SlurmJob,
    SlurmJobSettings,
    dead_runs,
    parse_node_address,
    parse_ready,
    parse_squeue,
    parse_time_left,
    plan_jobs,
    sbatch_argv,
    sbatch_refusal,
    watch_start,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("4:59", 299.0), ("1:00:00", 3600.0), ("2-01:00:05", 176405.0), ("UNLIMITED", None)],
)
def test_time_left_is_read_in_seconds(text: str, seconds: float | None) -> None:
    assert parse_time_left(text) == seconds


def test_a_time_left_that_is_not_slurms_is_refused_by_name() -> None:
    with pytest.raises(InvalidInput, match="time_left"):
        parse_time_left("soon")


def test_the_listing_names_each_jobs_run_and_index_and_strays_have_none() -> None:
    jobs = parse_squeue(
        "7|RUNNING|4:59|trajnode|trajcore:abc123:2\n8|PENDING|30:00|(null)|someone's note\n"
    )
    assert jobs[0] == SlurmJob(
        job_id="7", state="RUNNING", time_left_s=299.0, node="trajnode", run="abc123", index=2
    )
    assert (jobs[1].run, jobs[1].node, jobs[1].client_status) == (None, None, "pending")
    with pytest.raises(InvalidInput, match="squeue"):
        parse_squeue("7|RUNNING")


def test_node_failure_and_preemption_are_lost_and_a_timeout_failed() -> None:
    def status(state: str) -> str:
        return SlurmJob(job_id="1", state=state, time_left_s=None, node=None, run=None,
                        index=-1).client_status  # fmt: skip

    assert [status(s) for s in ("NODE_FAIL", "PREEMPTED", "TIMEOUT", "CANCELLED")] == [
        "lost", "lost", "failed", "complete"
    ]  # fmt: skip


def test_ready_lines_and_node_addresses() -> None:
    assert parse_ready('{"ready": true, "address": "http://0.0.0.0:4242"}\n') == 4242
    assert parse_ready('{"ready": true, "addr') is None  # not whole yet
    with pytest.raises(InvalidInput, match="ready"):
        parse_ready('{"ready": true, "address": null}\n')
    assert parse_node_address("NodeName=n1 Arch=x86_64 NodeAddr=10.0.0.7 x=y") == "10.0.0.7"


def _job(job_id: str, index: int, state: str = "RUNNING", left: float | None = 900.0,
         run: str | None = "r1") -> SlurmJob:  # fmt: skip
    return SlurmJob(job_id=job_id, state=state, time_left_s=left, node="n", run=run, index=index)


def test_the_plan_keeps_one_live_job_per_index_below_the_count() -> None:
    jobs = [
        _job("1", 0),
        _job("2", 1, state="NODE_FAIL"),  # ended: index 1 needs a new job
        _job("3", 2, left=10.0),  # ending: index 2 gets a replacement, it is not cancelled
        _job("4", 3),  # above the count: cancelled
        _job("5", 0, state="PENDING"),  # a second live job on index 0: cancelled
        _job("6", 0, run="old"),  # a stray of a crashed pool (its run is dead): cancelled
        _job("7", 0, run="other"),  # a job of another live pool of the name: left alone
        _job("8", 0, run=None),  # a job of the name that is not trajcore's: left alone
    ]
    plan = plan_jobs(
        jobs, run="r1", count=3, stopping=frozenset(), ending_s=60.0, dead_runs=frozenset({"old"})
    )
    assert plan.submit == (1, 2)
    assert sorted(plan.cancel) == ["4", "5", "6"]


def test_another_run_is_dead_only_once_its_known_heartbeat_is_stale() -> None:
    """Two pools of one job name must not cancel each other's jobs: another run is a stray
    only when its pool's heartbeat is known and older than the bound."""
    jobs = [
        _job("1", 0),
        _job("2", 0, run="crashed"),
        _job("3", 0, run="alive"),
        _job("4", 0, run="elsewhere"),  # its run directory is not beside ours: unknown
        _job("5", 0, run="ended", state="CANCELLED"),  # nothing live to cancel
        _job("6", 0, run=None),
    ]
    ages = {"r1": 999.0, "crashed": 601.0, "alive": 2.0, "ended": 999.0}
    assert dead_runs(jobs, run="r1", heartbeat_ages=ages, stale_after_s=600.0, watched_s=600.0) == {
        "crashed"
    }
    assert (
        dead_runs(
            jobs, run="r1", heartbeat_ages={"crashed": 600.0}, stale_after_s=600.0, watched_s=900.0
        )
        == frozenset()
    )
    plan = plan_jobs(jobs, run="r1", count=1, stopping=frozenset(), ending_s=60.0)
    assert plan.cancel == ()


def test_no_run_is_dead_before_this_pool_has_polled_well_for_the_bound() -> None:
    """After an outage every heartbeat is old because no pool could poll: a stale heartbeat
    proves a crash only once this pool has polled well for ``stale_after_s`` itself."""
    jobs = [_job("2", 0, run="crashed")]
    ages = {"crashed": 5000.0}
    for watched_s, dead in ((0.0, set()), (599.9, set()), (600.0, {"crashed"})):
        assert (
            dead_runs(jobs, run="r1", heartbeat_ages=ages, stale_after_s=600.0, watched_s=watched_s)
            == dead
        )


@pytest.mark.parametrize(
    ("since", "last_poll", "now", "start"),
    [
        (None, None, 50.0, 50.0),  # the first good poll
        (None, 40.0, 50.0, 50.0),  # the first good poll after a failed one
        (10.0, None, 50.0, 50.0),
        (10.0, 40.0, 50.0, 10.0),  # polls close enough: the stretch goes on
        (10.0, 20.0, 50.0, 10.0),  # a gap of exactly max_gap_s still does
        (10.0, 19.9, 50.0, 50.0),  # a longer one (the pool stood still) begins a new stretch
    ],
)
def test_the_stretch_of_good_polls_breaks_on_a_failure_or_a_gap(
    since: float | None, last_poll: float | None, now: float, start: float
) -> None:
    assert watch_start(since, last_poll, now, max_gap_s=30.0) == start


def test_the_job_words_carry_the_resources_and_no_token() -> None:
    settings = SlurmJobSettings(
        command="/venv/bin/python -m trajcore.entrypoints.slot_server", partition="cpu",
        account="rl", qos="high", constraint="bwrap", cpus_per_task=4, time_limit_min=90,
    )  # fmt: skip
    words = sbatch_argv(settings, server=SlotServerSettings(slots_per_container=2),
                        script="/s/job.sh", run_dir="/s", run="r1", index=3,
                        uid_base=1900000000, token_file="/s/token")  # fmt: skip
    for word in ("--partition=cpu", "--account=rl", "--qos=high", "--constraint=bwrap",
                 "--cpus-per-task=4", "--time=90", "--no-requeue", "--export=NONE",
                 "--comment=trajcore:r1:3", "--job-name=trajcore-slots",
                 f"--mem={512 + 256 * 2}"):  # fmt: skip
        assert word in words
    assert words[words.index("--slots") + 1] == "2"
    assert words[words.index("--token-file") + 1] == "/s/token"


def test_bad_settings_are_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="partition"):
        SlurmJobSettings(partition="cpu; rm -rf /")
    with pytest.raises(ConfigError, match="drain_before_s"):
        SlurmPoolConfig(job=SlurmJobSettings(time_limit_min=5), drain_before_s=300.0)


def _machine() -> NomadReconciler:
    machine = NomadReconciler(
        ReconcileConfig(
            scale=ScaleSettings(min_containers=1, max_containers=2, cooldown_s=0.0),
            slots_per_container=1,
        )
    )
    machine.registered(1)
    return machine


def test_an_ending_run_is_drained_replaced_on_its_index_then_removed_and_stopped() -> None:
    machine = _machine()
    assert machine.observe([Allocation(id="a", index=0, client_status="running")], 1, 0.0) == [
        Join(alloc_id="a", index=0, restarts=0)
    ]
    machine.joined("a", 1.0)
    ending = Allocation(id="a", index=0, client_status="running", held=1, ending=True)
    fresh = Allocation(id="b", index=0, client_status="running")
    actions = machine.observe([ending, fresh], 1, 2.0)
    assert Drain(alloc_id="a", reason="its run ends soon") in actions
    assert Join(alloc_id="b", index=0, restarts=0) in actions
    machine.joined("b", 3.0)
    assert machine.members() == {"a": MemberState.DRAINING, "b": MemberState.JOINED}
    machine.check_valid()
    idle = Allocation(id="a", index=0, client_status="running", ending=True)
    actions = machine.observe([idle, fresh], 1, 4.0)
    assert [type(a) for a in actions] == [Remove, Replace]
    assert machine.members() == {"b": MemberState.JOINED}


def test_an_ending_run_is_never_joined() -> None:
    machine = _machine()
    listing = [Allocation(id="a", index=0, client_status="running", ending=True)]
    assert machine.observe(listing, 0, 0.0) == []


def test_a_suspended_job_is_cancelled_at_once_and_never_joined_when_resumed() -> None:
    """Gang or suspend preemption: a SUSPENDED job is lost to the pool (its leases turn stale)
    and cancelled then, so its server never serves the old leases' workspaces again; a
    replacement is planned on its index whether or not Slurm resumes it."""
    machine = _machine()
    stopping: set[str] = set()

    def tick(jobs: list[SlurmJob], now: float) -> tuple[list[type], tuple[int, ...]]:
        allocations = [
            Allocation(
                id=j.job_id,
                index=j.index,
                client_status=j.client_status,
                desired_status="stop" if j.job_id in stopping else "run",
            )
            for j in jobs
        ]
        actions = machine.observe(allocations, 0, now)
        stopping.update(a.alloc_id for a in actions if isinstance(a, Replace))
        plan = plan_jobs(jobs, run="r1", count=1, stopping=frozenset(stopping), ending_s=60.0)
        return [type(a) for a in actions], plan.submit

    assert tick([_job("1", 0)], 0.0) == ([Join], ())
    machine.joined("1", 0.5)
    assert tick([_job("1", 0, state="SUSPENDED")], 1.0) == ([Lose, Replace], (0,))
    assert stopping == {"1"}
    assert tick([_job("1", 0), _job("2", 0)], 2.0) == ([Join], ())
    assert list(machine.members()) == ["2"]


@pytest.mark.parametrize(
    ("said", "field"),
    [
        ("sbatch: error: invalid partition specified: nope", "slurm_partition"),
        (
            "sbatch: error: Batch job submission failed: Invalid partition name specified",
            "slurm_partition",
        ),
        (
            "sbatch: error: Batch job submission failed: Invalid account or account/partition "
            "combination specified",
            "slurm_account",
        ),
        ("sbatch: error: Batch job submission failed: Invalid qos specification", "slurm_qos"),
        ("sbatch: error: Invalid feature specification", "slurm_constraint"),
        (
            "sbatch: error: Memory specification can not be satisfied\nsbatch: error: Batch job "
            "submission failed: Requested node configuration is not available",
            "slurm_memory_mb",
        ),
        (
            "Batch job submission failed: Memory required by task is not available",
            "slurm_memory_mb",
        ),
        (
            "sbatch: error: Requested time limit is invalid (missing or exceeds some limit)",
            "slurm_time_limit_min",
        ),
        (
            "Batch job submission failed: Requested time limit exceeds partition limit",
            "slurm_time_limit_min",
        ),
        ("Batch job submission failed: Requested node configuration is not available", "slurm_job"),
        ("sbatch: error: Batch job submission failed: Access/permission denied", "slurm_job"),
    ],
)
def test_a_refused_first_job_names_the_setting_sbatch_names(said: str, field: str) -> None:
    error = sbatch_refusal(said)
    assert isinstance(error, ConfigError)
    assert error.field == field
    assert " ".join(said.split()) in error.reason


@pytest.mark.parametrize(
    "said",
    [
        "sbatch: error: Batch job submission failed: Resource temporarily unavailable",
        "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
        "sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: "
        "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
        "sbatch: error: Batch job submission failed: Access denied",
        "",
    ],
)
def test_any_other_refusal_may_pass_and_is_no_configuration_error(said: str) -> None:
    """A timeout, a busy controller or a limit on submitted jobs is retried: ``None``."""
    assert sbatch_refusal(said) is None
