"""The compiled reference's (a') and its breakdown (bench/reference.c, bench/reference.py): every
control runs and reports its figures, bad controls are refused by name, and the breakdown's
ratios are the ones its runs give."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from bench.call_path import ratios, reference_spawns
from bench.reference import (
    FULL_ISOLATION,
    ISOLATION_STEPS,
    UID_BASE,
    Measured,
    Reference,
    ReferenceUnavailable,
    Step,
    agent_controls,
    describe_breakdown,
    isolated_limit,
)

from trajcore.adapters.slot_server.seccomp import SeccompUnavailable


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    try:
        return Reference.prepare(tmp_path_factory.mktemp("reference"))
    except ReferenceUnavailable as error:
        pytest.skip(f"the compiled reference cannot be built here: {error}")
    except SeccompUnavailable as error:
        pytest.skip(f"no seccomp filter can be built here: {error}")


def run(reference: Reference, controls: str) -> subprocess.CompletedProcess[str]:
    argv = [str(reference.binary), "isolated", "1", "0.05", str(reference.filter_file)]
    return subprocess.run(
        [*argv, str(UID_BASE), controls], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("controls", ["none", *(c for _, c in ISOLATION_STEPS)])
def test_each_control_spawns_and_reports_its_cpu(reference: Reference, controls: str) -> None:
    done = run(reference, controls)
    assert done.returncode == 0, done.stderr
    measured = Measured(**json.loads(done.stdout))
    assert measured.count > 0
    assert 0 < measured.p50_s <= measured.p99_s
    # every spawn's sh ran and was reaped into the run's CPU
    assert measured.cpu_s > 0
    assert measured.cpu_per_one_s == measured.cpu_s / measured.count


def test_full_isolation_is_the_last_step() -> None:
    assert ISOLATION_STEPS[-1][1] == FULL_ISOLATION


def test_a_prime_makes_a_session_per_command_only_where_the_agent_does(tmp_path: Path) -> None:
    source = tmp_path / "slot_helper.c"
    source.write_text("flags = POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF;\n")
    assert agent_controls(source) == FULL_ISOLATION
    source.write_text("flags = POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF;\n")
    assert agent_controls(source) == "agent,nice,filter,namespaces,nested"
    with pytest.raises(ReferenceUnavailable, match="lease agent's source"):
        agent_controls(tmp_path / "missing.c")


@pytest.mark.parametrize(
    ("controls", "named"),
    [("agent,bogus", "agent,bogus"), ("nested", "nested"), ("", ""), ("agent,", "agent,")],
)
def test_bad_controls_are_refused_by_name(reference: Reference, controls: str, named: str) -> None:
    done = run(reference, controls)
    assert done.returncode == 2
    assert done.stdout == ""
    assert f"not {named}\n" in done.stderr


def measured(rate: float, cpu_per_one_s: float) -> Measured:
    return Measured(count=int(rate), seconds=1.0, p50_s=0.001, p99_s=0.002,
                    cpu_s=cpu_per_one_s * int(rate))  # fmt: skip


def test_the_breakdown_reads_its_ratios_from_its_pairs() -> None:
    step = Step(
        label="+ something",
        controls="filter",
        pairs=(
            (measured(500, 0.0006), measured(1000, 0.0005)),
            (measured(900, 0.0006), measured(1000, 0.0004)),
            (measured(600, 0.0006), measured(1000, 0.0006)),
        ),
    )
    assert step.rate_ratios == [0.5, 0.6, 0.9]
    assert step.cpu_ratios == pytest.approx([1.0, 1.2, 1.5])
    lines = describe_breakdown([step])
    (row,) = [line for line in lines if "+ something" in line]
    assert "0.60 (0.50-0.90)" in row
    assert "600 us   1.20 (1.00-1.50)" in row
    plain = lines[-1]
    assert "(a) plain" in plain
    assert "1,000" in plain
    assert "500 us" in plain


def test_a_missing_filter_file_is_an_error(tmp_path: Path, reference: Reference) -> None:
    argv = [str(reference.binary), "isolated", "1", "0.05", str(tmp_path / "none.bpf")]
    done = subprocess.run(
        [*argv, str(UID_BASE), "filter"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert "cannot read a BPF program" in done.stderr


def test_call_path_runs_a_and_a_prime_beside_its_rounds(
    reference: Reference, capsys: pytest.CaptureFixture[str]
) -> None:
    plain, isolated = reference_spawns(reference, 0.05)
    assert plain.count > 0
    assert isolated.count > 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["path"] for line in lines] == ["reference (a)", "reference (a')"]
    assert lines[1]["controls"] == reference.controls
    rounds = [{"calls_per_s": plain.rate / 2, "sandbox_cpu_per_call_s": 0.0,
               "machine_cpu_per_call_s": 2 * isolated.cpu_per_one_s}]  # fmt: skip
    ratios(rounds, [(plain, isolated)])
    (summary,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert summary["calls_over_a"] == [0.5]
    assert summary["calls_over_a_prime"] == [round(plain.rate / 2 / isolated.rate, 3)]
    assert summary["machine_cpu_over_a_prime"] == [2.0]


def test_a_prime_is_read_from_its_best_pair_so_load_only_lowers_ratios() -> None:
    quiet, loaded = (measured(1600, 0.0006), measured(1500, 0.0006)), (
        measured(3200, 0.0006), measured(1600, 0.0006),
    )  # fmt: skip
    # (a')'s runs were both slowed; the quiet pair says it does 15/16 of (a)
    assert isolated_limit([quiet, loaded]) == pytest.approx(3000)
    # never above its own best run's reading, and the controls never make spawns faster
    assert isolated_limit([(measured(1000, 0.0006), measured(1200, 0.0006))]) == 1200
    assert isolated_limit([loaded]) == pytest.approx(1600)
