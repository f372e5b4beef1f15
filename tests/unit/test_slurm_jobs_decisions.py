"""Decisions of the Slurm pool's pure parts that ``test_slurm_jobs.py`` checks only in part (found
by mutation testing): each test's docstring names the decision it pins."""

from __future__ import annotations

import attrs
import pytest

from trajcore.domain.errors import ConfigError, InvalidInput
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_flags import isolation_argv
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slurm_jobs import (
    JobPlan,
    SlurmJob,
    SlurmJobSettings,
    job_script,
    parse_node_address,
    parse_ready,
    parse_squeue,
    parse_time_left,
    plan_jobs,
    sbatch_argv,
    scancel_argv,
    squeue_argv,
)

UID_BASE = 1900004000

# ------------------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    ("settings", "field", "reason"),
    [
        (
            {"job_name": "a b"},
            "job_name",
            "must be 1-64 letters, digits, '_', '.' or '-', got 'a b'",
        ),
        ({"job_name": 5}, "job_name", "must be 1-64 letters, digits, '_', '.' or '-', got 5"),
        (
            {"partition": "cpu; rm"},
            "partition",
            "must be one Slurm word without spaces, got 'cpu; rm'",
        ),
        ({"qos": 5}, "qos", "must be one Slurm word without spaces, got 5"),
        ({"bind_host": "a b"}, "bind_host", "must be one Slurm word without spaces, got 'a b'"),
        (
            {"extra_options": ["--a=b", "x"]},
            "extra_options",
            "must be sbatch options (--name=value), got ('--a=b', 'x')",
        ),
        (
            {"extra_options": ["--a=b\n#SBATCH x"]},
            "extra_options",
            "must be sbatch options (--name=value), got ('--a=b\\n#SBATCH x',)",
        ),
        (
            {"extra_options": [5]},
            "extra_options",
            "must be sbatch options (--name=value), got (5,)",
        ),
        ({"command": ""}, "command", "must name the slot server program"),
    ],
)
def test_a_bad_job_setting_is_refused_with_its_field_and_reason(
    settings: dict[str, object], field: str, reason: str
) -> None:
    """Pins each job setting's check: the field it names and the reason, with the value."""
    with pytest.raises(ConfigError) as caught:
        SlurmJobSettings(**settings)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.reason) == (field, reason)


def test_the_settings_each_check_accepts() -> None:
    """Pins what the checks let through: absent optional words, a Slurm word with its
    punctuation, sbatch options."""
    gres = ("--gres=gpu:1",)
    settings = SlurmJobSettings(partition=None, constraint="a100&(ib|eth)", extra_options=gres)
    assert (settings.partition, settings.constraint) == (None, "a100&(ib|eth)")
    assert settings.extra_options == ("--gres=gpu:1",)


def test_a_servers_memory_is_the_setting_else_grows_with_its_slots() -> None:
    """Pins ``--mem``: the memory setting when given, else 512 MB plus 256 MB per slot."""
    assert SlurmJobSettings().memory(3) == 512 + 256 * 3
    assert SlurmJobSettings(memory_mb=100).memory(3) == 100


# ------------------------------------------------------------------------------ commands


def test_the_job_script_roots_the_server_in_tmpdir_unless_a_directory_is_set() -> None:
    """Pins where the job's directory is (``$TMPDIR``, else ``/tmp``, unless ``workspace_dir``,
    quoted) and the address the server listens on (``bind_host``, any port, quoted)."""
    plain = job_script(SlurmJobSettings())
    assert 'root="${TMPDIR:-/tmp}"/trajcore-slots-"$SLURM_JOB_ID"\n' in plain
    assert '"$@" --root "$root/slots" --listen 0.0.0.0:0 > "$ready.part" &\n' in plain
    set_ = job_script(SlurmJobSettings(workspace_dir="/scratch/my dir", bind_host="10.0.0.1"))
    assert "root='/scratch/my dir'/trajcore-slots-\"$SLURM_JOB_ID\"\n" in set_
    assert "--listen 10.0.0.1:0 >" in set_


def test_the_job_words_in_full() -> None:
    """Pins every word ``sbatch`` gets, in order: the fixed options, the optional ones that are
    set (in the order partition, account, qos, constraint), the extra ones, the script and its
    directory, then the server with its slots, token file and the isolation with the job's uid
    base."""
    settings = SlurmJobSettings(
        job_name="js", command="/v/python -m srv", cpus_per_task=2, memory_mb=1000,
        time_limit_min=30, account="rl", constraint="c",
        extra_options=("--gres=gpu:1",),
    )  # fmt: skip
    isolation = SlotIsolation()
    server = SlotServerSettings(slots_per_container=3, isolation=isolation)
    words = sbatch_argv(
        settings, server=server, script="/r/job.sh", run_dir="/r",
        run="abc1", index=4, uid_base=UID_BASE, token_file="/r/token",
    )  # fmt: skip
    assert words == [
        "sbatch", "--parsable", "--job-name=js", "--comment=trajcore:abc1:4", "--nodes=1",
        "--ntasks=1", "--cpus-per-task=2", "--mem=1000", "--time=30", "--no-requeue",
        "--export=NONE", "--output=/r/%j.log", "--chdir=/r", "--account=rl", "--constraint=c",
        "--gres=gpu:1", "/r/job.sh", "/r", "/v/python", "-m", "srv", "--slots", "3",
        "--token-file", "/r/token",
        *isolation_argv(attrs.evolve(isolation, slot_uid_base=UID_BASE)),
    ]  # fmt: skip
    assert isolation_argv(attrs.evolve(isolation, slot_uid_base=UID_BASE)) != isolation_argv(
        isolation
    )


@pytest.mark.parametrize("run", ["", "R1", "a-b", "x" * 33])
def test_a_run_that_is_not_lowercase_letters_and_digits_is_refused(run: str) -> None:
    """Pins the run's rule (1-32 lowercase letters or digits) and its reason."""
    with pytest.raises(InvalidInput) as caught:
        sbatch_argv(
            SlurmJobSettings(), server=SlotServerSettings(slots_per_container=1), script="/s",
            run_dir="/r", run=run, index=0, uid_base=UID_BASE, token_file="/t",
        )  # fmt: skip
    assert (caught.value.field, caught.value.reason) == (
        "run",
        f"must be 1-32 lowercase letters or digits, got {run!r}",
    )


def test_the_uid_base_is_checked_for_the_servers_slots() -> None:
    """Pins that ``sbatch_argv`` checks the job's uid range under the field ``uid_base``."""
    with pytest.raises(ConfigError) as caught:
        sbatch_argv(
            SlurmJobSettings(), server=SlotServerSettings(slots_per_container=1), script="/s",
            run_dir="/r", run="a", index=0, uid_base=5, token_file="/t",
        )  # fmt: skip
    assert caught.value.field == "uid_base"


def test_the_queue_and_cancel_words() -> None:
    """Pins the ``squeue`` words (the caller's jobs of the name, every state, no header, the
    format) and both forms of ``scancel``."""
    assert squeue_argv("js") == [
        "squeue", "--me", "--name=js", "--states=all", "--noheader", "--format=%i|%T|%L|%B|%k",
    ]  # fmt: skip
    assert scancel_argv(["1", "2"]) == ["scancel", "1", "2"]
    assert scancel_argv(job_name="js") == ["scancel", "--me", "--name=js"]
    assert scancel_argv(iter(["3"]), job_name="js") == ["scancel", "--me", "--name=js", "3"]


# ------------------------------------------------------------------------------ answers


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("", None),
        ("NOT_SET", None),
        ("INVALID", None),
        (" UNLIMITED\n", None),
        (" 0:07 ", 7.0),
        ("1-00:00", 86400.0),
        ("1-02:03:04", 93784.0),
    ],
)
def test_time_left_forms(text: str, seconds: float | None) -> None:
    """Pins the forms of ``%L`` read: the words for no limit, days without hours, whitespace
    around."""
    assert parse_time_left(text) == seconds


def test_a_time_left_that_is_not_slurms_is_refused_quoting_it() -> None:
    """Pins the reason for a time left that is no ``[days-][hours:]minutes:seconds``."""
    with pytest.raises(InvalidInput) as caught:
        parse_time_left(" 5 ")
    assert caught.value.reason == "not [days-][hours:]minutes:seconds: '5'"


def _one(line: str) -> SlurmJob:
    (job,) = parse_squeue(line)
    return job


def test_the_listing_reads_each_field_of_a_line() -> None:
    """Pins how a line is read: blank lines skipped, fields stripped, the comment whole after the
    fourth ``|``, the state's first word without Slurm's ``+``, an absent node as ``None``."""
    jobs = parse_squeue(
        "\n  \n 7 | CANCELLED+ by 12 | 0:05 | (null) | trajcore:abc:3 \n"
        "8|RUNNING|1:00|n/a|a|b\n9|PENDING||| \n"
    )
    assert jobs == [
        SlurmJob(job_id="7", state="CANCELLED", time_left_s=5.0, node=None, run="abc", index=3),
        SlurmJob(job_id="8", state="RUNNING", time_left_s=60.0, node=None, run=None, index=-1),
        SlurmJob(job_id="9", state="PENDING", time_left_s=None, node=None, run=None, index=-1),
    ]
    assert _one("1||||").state == ""


@pytest.mark.parametrize(
    "comment",
    [
        "trajcore:ABC:1",
        "trajcore:abc:x",
        "trajcore:abc:1:2",
        "slurm:abc:1",
        "trajcore::1",
        "trajcore:abc",
    ],
)
def test_only_a_comment_trajcore_run_index_names_a_run(comment: str) -> None:
    """Pins the comment a pool's job carries: exactly ``trajcore:<run>:<index>``, the run by the
    run rule, the index digits; any other comment is a stray's."""
    job = _one(f"1|RUNNING|1:00|n|{comment}")
    assert (job.run, job.index) == (None, -1)


@pytest.mark.parametrize("line", ["7|RUNNING|1:00|n", " |RUNNING|1:00|n|c"])
def test_a_line_that_is_not_the_format_is_refused_quoting_it(line: str) -> None:
    """Pins the refusal of a line with too few fields or no job ID, and its reason."""
    with pytest.raises(InvalidInput) as caught:
        parse_squeue(line)
    assert (caught.value.field, caught.value.reason) == (
        "squeue",
        f"expected '%i|%T|%L|%B|%k', got {line!r}",
    )


@pytest.mark.parametrize(
    ("address", "port"),
    [("http://h:1", 1), ("http://h:65535/", 65535), ("h:80", 80)],
)
def test_the_ready_port_is_the_last_part_of_the_address(address: str, port: int) -> None:
    """Pins where the port is read (after the last ``:``, a trailing ``/`` dropped) and its
    range's ends."""
    assert parse_ready(f'{{"ready": true, "address": "{address}"}}\nmore') == port


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json", "not a JSON line: 'not json'"),
        ("[1]", "not a TCP ready line: '[1]'"),
        (
            '{"ready": false, "address": "h:1"}',
            """not a TCP ready line: '{"ready": false, "address": "h:1"}'""",
        ),
        (
            '{"ready": 1, "address": "h:1"}',
            """not a TCP ready line: '{"ready": 1, "address": "h:1"}'""",
        ),
        (
            '{"ready": true, "address": 1}',
            """not a TCP ready line: '{"ready": true, "address": 1}'""",
        ),
        ('{"ready": true, "address": "h:0"}', "no port in 'h:0'"),
        ('{"ready": true, "address": "h:65536"}', "no port in 'h:65536'"),
        ('{"ready": true, "address": "unix:/s"}', "no port in 'unix:/s'"),
        ("x" * 300, f"not a JSON line: {'x' * 200!r}"),
    ],
)
def test_a_line_that_is_no_tcp_ready_line_is_refused_saying_why(line: str, reason: str) -> None:
    """Pins each refusal of a ready line (not JSON, not an object saying ``ready: true`` with a
    text address, no port in range), quoting up to 200 characters."""
    with pytest.raises(InvalidInput) as caught:
        parse_ready(line + "\n")
    assert (caught.value.field, caught.value.reason) == ("ready", reason)


def test_the_node_address_is_the_first_non_empty_node_addr() -> None:
    """Pins ``parse_node_address``: an empty ``NodeAddr=`` is passed over, and no address is
    refused quoting up to 200 characters."""
    assert parse_node_address("NodeAddr= NodeAddr=10.0.0.2 NodeAddr=x") == "10.0.0.2"
    with pytest.raises(InvalidInput) as caught:
        parse_node_address("NodeName=n1 " + "y" * 300)
    assert (caught.value.field, caught.value.reason) == (
        "scontrol",
        f"no NodeAddr in {('NodeName=n1 ' + 'y' * 300)[:200]!r}",
    )


# ------------------------------------------------------------------------------ planning


def _job(job_id: str, index: int, state: str = "RUNNING", left: float | None = 900.0,
         run: str | None = "r1") -> SlurmJob:  # fmt: skip
    return SlurmJob(job_id=job_id, state=state, time_left_s=left, node="n", run=run, index=index)


def test_a_negative_count_is_refused() -> None:
    """Pins the refusal of a count below zero, and its reason."""
    with pytest.raises(InvalidInput) as caught:
        plan_jobs([], run="r1", count=-1, stopping=frozenset(), ending_s=0.0)
    assert (caught.value.field, caught.value.reason) == ("count", "must be >= 0, got -1")
    assert plan_jobs([], run="r1", count=0, stopping=frozenset(), ending_s=0.0) == JobPlan()


def test_jobs_being_stopped_or_ended_are_neither_serving_nor_cancelled() -> None:
    """Pins that a job already being stopped, and one that is no longer live, is left alone:
    its index gets a new job and it is not cancelled again."""
    jobs = [_job("1", 0), _job("2", 1, state="COMPLETED"), _job("3", 2, run="old")]
    plan = plan_jobs(jobs, run="r1", count=3, stopping=frozenset({"1", "3"}), ending_s=0.0)
    assert plan == JobPlan(submit=(0, 1, 2), cancel=())


def test_a_job_ends_soon_at_exactly_its_margin() -> None:
    """Pins the margin's end: a job with exactly ``ending_s`` left is ending (replaced), one with
    more is serving; a job with no time limit always serves."""
    jobs = [_job("1", 0, left=60.0), _job("2", 1, left=60.5), _job("3", 2, left=None)]
    plan = plan_jobs(jobs, run="r1", count=3, stopping=frozenset(), ending_s=60.0)
    assert plan == JobPlan(submit=(0,), cancel=())


def test_a_job_at_the_last_index_below_the_count_serves() -> None:
    """Pins the count's end: indices below it are kept, the index equal to it is cancelled."""
    jobs = [_job("1", 0), _job("2", 1)]
    assert plan_jobs(jobs, run="r1", count=2, stopping=frozenset(), ending_s=0.0) == JobPlan()
    plan = plan_jobs(jobs, run="r1", count=1, stopping=frozenset(), ending_s=0.0)
    assert plan == JobPlan(submit=(), cancel=("2",))


def test_on_one_index_a_running_job_is_kept_before_any_pending_one_and_the_earliest_id() -> None:
    """Pins which of several live jobs on one index stays: a running one before pending ones,
    among equals the lowest ID read as a number (an array job by its head); only pending extras
    are cancelled, the later IDs, in that order."""
    jobs = [_job("10", 0, "PENDING"), _job("9", 0, "PENDING"), _job("11", 0), _job("12", 0)]
    plan = plan_jobs(jobs, run="r1", count=1, stopping=frozenset(), ending_s=0.0)
    assert plan == JobPlan(submit=(), cancel=("9", "10"))
    pending = [_job("100", 0, "PENDING"), _job("20_3", 0, "PENDING"), _job("x", 0, "PENDING")]
    plan = plan_jobs(pending, run="r1", count=1, stopping=frozenset(), ending_s=0.0)
    assert plan == JobPlan(submit=(), cancel=("20_3", "100"))


def test_a_time_left_that_is_not_slurms_names_the_field_time_left() -> None:
    """Pins the field a bad time left is refused under."""
    with pytest.raises(InvalidInput) as caught:
        parse_time_left("soon")
    assert caught.value.field == "time_left"


def test_the_ready_line_is_the_first_line_and_only_a_trailing_slash_is_dropped() -> None:
    """Pins that the ready line is the text's first line (what the server prints after it is
    not read) and that only ``/`` is dropped from the address's end before its port."""
    assert parse_ready('{"ready": true, "address": "h:81"}\n{"later": 1}\n') == 81
    with pytest.raises(InvalidInput) as caught:
        parse_ready('{"ready": true, "address": "h:80X"}\n')
    assert caught.value.reason == "no port in 'h:80X'"


def test_a_long_line_that_is_no_ready_line_is_quoted_up_to_200_characters() -> None:
    """Pins how much of a JSON line that is no ready line the reason quotes."""
    line = "[" + "1," * 150 + "1]"
    with pytest.raises(InvalidInput) as caught:
        parse_ready(line + "\n")
    assert caught.value.reason == f"not a TCP ready line: {line[:200]!r}"


def test_a_job_id_that_is_no_number_sorts_before_every_numbered_one() -> None:
    """Pins that among pending jobs on one index a job whose ID has no number is kept before
    the numbered ones (its number counts as 0)."""
    jobs = [_job("1", 0, "PENDING"), _job("x", 0, "PENDING")]
    plan = plan_jobs(jobs, run="r1", count=1, stopping=frozenset(), ending_s=0.0)
    assert plan == JobPlan(submit=(), cancel=("1",))
