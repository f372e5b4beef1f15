"""``trajcore run``: an env end to end on a real pool with the author's model stand-in (a
script, a replay of recorded tool calls), writing the scored groups, the report and the table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.entrypoints.run import main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHELL_TASKS = f"{ROOT / 'examples' / 'shell_tasks.py'}:ShellTasksEnv"
CODE_FIX = f"{ROOT / 'examples' / 'code_fix.py'}:CodeFixEnv"


def _records(out: Path) -> list[dict[str, object]]:
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _calls(record: dict[str, object]) -> list[tuple[str, str]]:
    messages = record["messages"]
    assert isinstance(messages, list)
    return [
        (call["function"]["name"], json.dumps(call["function"]["arguments"], sort_keys=True))
        for m in messages
        for call in m.get("tool_calls", [])
    ]


def test_trajcore_run_runs_an_env_on_the_local_pool_with_its_script(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    environment.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled")
    out = tmp_path / "run"
    argv = [
        sys.executable, "-m", "trajcore.entrypoints.cli", "run", SHELL_TASKS,
        "--policy", "solve", "--groups", "3", "--group-size", "2", "--out", str(out), "--plain",
    ]  # fmt: skip
    done = subprocess.run(
        argv,
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = _records(out)
    assert len(records) == 6
    assert all(r["status"] == "finished" and r["score"] == 1.0 for r in records)
    assert all(r["tool_calls"] and r["tool_results"] for r in records)
    assert "mean score 1.000 over 6 scored" in done.stdout
    assert (out / "scored_groups.jsonl").exists()
    page = (out / "report.html").read_text()
    assert "<h1>trajcore run: ShellTasksEnv</h1>" in page  # a complete run: nothing more said
    assert "stopped" not in done.stdout
    assert "sort -u names.txt &gt; unique.txt" in page
    assert "echo &#39;hello world&#39; &gt; hello.txt" in page  # the call's arguments, escaped


def test_the_readme_env_runs_with_its_script_as_the_readme_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's env and the command beside it, a local tokenizer set as the README says:
    every member writes hello.txt and scores 1.0."""
    tokenizer = qwen3_tokenizer_path()
    out = tmp_path / "run"
    hello = f"{ROOT / 'examples' / 'hello.py'}:HelloEnv"
    argv = [hello, "--policy", "solve", "--set", f"tokenizer_name={tokenizer}"]
    assert main([*argv, "--groups", "1", "--out", str(out), "--plain"]) == 0
    records = _records(out)
    assert [(r["status"], r["score"]) for r in records] == [("finished", 1.0)] * len(records)
    assert "mean score 1.000" in capsys.readouterr().out


def test_a_run_replays_recorded_tool_calls_on_the_unisolated_pool(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    assert main([SHELL_TASKS, "--policy", "solve", "--groups", "2", "--group-size", "1",
                 "--out", str(first), "--pool", "unisolated", "--plain"]) == 0  # fmt: skip
    assert main([SHELL_TASKS, "--replay", str(first / "trajectories.jsonl"), "--groups", "2",
                 "--group-size", "1", "--out", str(second), "--pool", "unisolated",
                 "--plain"]) == 0  # fmt: skip
    recorded, replayed = _records(first), _records(second)
    assert [_calls(r) for r in replayed] == [_calls(r) for r in recorded]
    assert all(r["score"] == 1.0 for r in replayed)
    # A task with no recording is the model failing, with the reason, never a silent 0.
    third = tmp_path / "third"
    assert main([SHELL_TASKS, "--replay", str(first / "trajectories.jsonl"), "--groups", "3",
                 "--group-size", "1", "--out", str(third), "--pool", "unisolated",
                 "--plain"]) == 0  # fmt: skip
    last = _records(third)[-1]
    assert last["status"] == "model_error"
    assert "no recorded trajectory" in str(last["detail"])


def test_a_managed_mode_run_samples_the_script_as_exact_tokens(tmp_path: Path) -> None:
    out = tmp_path / "managed"
    assert main([SHELL_TASKS, "--policy", "solve", "--groups", "2", "--group-size", "2",
                 "--set", "tool_call_parser=hermes", "--set", "mode=managed", "--out", str(out),
                 "--pool", "unisolated", "--plain"]) == 0  # fmt: skip
    records = _records(out)
    assert all(r["score"] == 1.0 and r["token_exact"] is True for r in records)
    assert all(r["tool_calls"] for r in records)


def test_code_fix_runs_with_pytest_scores_and_metadata(tmp_path: Path) -> None:
    out = tmp_path / "code"
    assert main([CODE_FIX, "--policy", "solve", "--groups", "2", "--group-size", "1",
                 "--out", str(out), "--pool", "unisolated", "--plain"]) == 0  # fmt: skip
    records = _records(out)
    assert [r["score"] for r in records] == [1.0, 1.0]
    metadata = [r["score_metadata"] for r in records]
    assert all(isinstance(m, dict) and m["pytest"] == "passed" for m in metadata)
    assert "score metadata" in (out / "report.html").read_text()


def test_usage_errors_name_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([f"{ROOT / 'examples' / 'nope.py'}:Env", "--policy", "solve"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main([SHELL_TASKS, "--policy", "no_such_function"]) == 2
    said = capsys.readouterr().err
    # the file the user named, and what --policy wants, not an internal module name
    assert f"{ROOT / 'examples' / 'shell_tasks.py'} has no 'no_such_function'" in said, said
    assert "a function of the conversation" in said, said
    assert "--base-url" in said, said
    assert main([SHELL_TASKS, "--policy", "solve", "--set", "max_turns=-3"]) == 2
    assert "max_turns" in capsys.readouterr().err
    hello = f"{ROOT / 'examples' / 'hello.py'}:HelloEnv"
    solve = f"{ROOT / 'examples' / 'shell_tasks.py'}:solve"
    assert main([hello, "--policy", solve, "--set", "tokenizer_name=no/such-model"]) == 2
    assert "--set tokenizer_name=PATH" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([SHELL_TASKS])  # no model given: argparse says which to give
    assert "--policy" in capsys.readouterr().err


RUN_ENVS = Path(__file__).with_name("run_envs.py")


def test_a_run_that_fails_before_its_first_group_reports_zero_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "none"
    argv = [f"{RUN_ENVS}:SetupFailsEnv", "--policy", f"{SHELL_TASKS.rpartition(':')[0]}:solve",
            "--out", str(out), "--pool", "unisolated"]  # fmt: skip
    assert main([*argv, "--plain"]) == 1
    printed = capsys.readouterr()
    assert "ConfigError: the env's data cannot be read @ dataset" in printed.err
    assert "0 trajectories in 0 groups" in printed.out
    assert "\nstopped by ConfigError after 0 of 1 groups\n" in printed.out
    page = (out / "report.html").read_text()
    assert "<h1>trajcore run: SetupFailsEnv: stopped by ConfigError after 0 of 1 groups</h1>" in (
        page
    )
    assert "error: ConfigError: the env&#39;s data cannot be read @ dataset" in page
    assert (out / "trajectories.jsonl").read_text() == ""
    assert main(argv) == 1  # the table drawn by rich, too
    assert "0 trajectories in 0 groups" in capsys.readouterr().out


def test_a_replay_of_the_default_output_keeps_the_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([SHELL_TASKS, "--policy", "solve", "--groups", "3", "--group-size", "1",
                 "--pool", "unisolated", "--plain"]) == 0  # fmt: skip
    recording = Path("out/run/shell_tasks/trajectories.jsonl")
    before = recording.read_text()
    assert len(before.splitlines()) == 3
    assert main([SHELL_TASKS, "--replay", str(recording), "--group-size", "1",
                 "--pool", "unisolated", "--plain"]) == 0  # fmt: skip
    assert recording.read_text() == before
    replayed = _records(Path("out/run/shell_tasks-replay"))
    assert len(replayed) == 3  # as many groups as were recorded
    assert all(r["score"] == 1.0 for r in replayed)
    capsys.readouterr()
    # An --out that would write over the recording is refused, naming both.
    assert main([SHELL_TASKS, "--replay", str(recording), "--out", "out/run/shell_tasks",
                 "--pool", "unisolated"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--replay" in err
    assert "--out" in err
    assert recording.read_text() == before
    # A second run into the same folder says it replaces the first one's output.
    assert main([SHELL_TASKS, "--policy", "solve", "--groups", "1", "--group-size", "1",
                 "--pool", "unisolated", "--plain"]) == 0  # fmt: skip
    said = capsys.readouterr().err
    assert "replacing the earlier run's output in out/run/shell_tasks" in said, said


def test_settings_the_command_line_cannot_honour_are_refused_naming_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    managed = [SHELL_TASKS, "--base-url", "http://127.0.0.1:1/v1",
               "--set", "mode=managed", "--set", "tool_call_parser=hermes"]  # fmt: skip
    assert main(managed) == 2  # --base-url is OpenAI mode: never a silent switch
    assert "@ mode" in capsys.readouterr().err
    unsandboxed = [SHELL_TASKS, "--policy", "solve", "--pool", "unisolated"]
    assert main([*unsandboxed, "--set", "require_sandbox=true"]) == 2
    assert "@ require_sandbox" in capsys.readouterr().err
    assert main([*unsandboxed, "--set", "require_stateful_sandbox=true"]) == 2
    assert "@ require_stateful_sandbox" in capsys.readouterr().err


def test_an_endpoint_that_does_not_answer_stops_the_run_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "http://127.0.0.1:1/v1"  # nothing listens on port 1
    argv = [SHELL_TASKS, "--base-url", url, "--set", "model_wait_s=1",
            "--out", str(tmp_path / "none"), "--pool", "unisolated", "--plain"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "ModelEndpointUnavailable" in err
    assert url in err
    assert _records(tmp_path / "none") == []


def test_a_run_where_every_trajectory_failed_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = {"messages": [{"role": "user", "content": "another task"},
                          {"role": "assistant", "content": "done"}]}  # fmt: skip
    recording = tmp_path / "other.jsonl"
    recording.write_text(json.dumps(other) + "\n")
    out = tmp_path / "failed"
    assert main([SHELL_TASKS, "--replay", str(recording), "--groups", "2", "--group-size", "1",
                 "--out", str(out), "--pool", "unisolated", "--plain"]) == 1  # fmt: skip
    assert "no trajectory of the 2 groups was scored" in capsys.readouterr().err
    assert [r["status"] for r in _records(out)] == ["model_error", "model_error"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_before_the_first_group_ends_the_run_with_its_status(
    tmp_path: Path, signum: int
) -> None:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    argv = [
        sys.executable, "-m", "trajcore.entrypoints.cli", "run", f"{RUN_ENVS}:SlowSetupEnv",
        "--policy", f"{SHELL_TASKS.rpartition(':')[0]}:solve", "--pool", "unisolated",
        "--out", str(tmp_path / "out"), "--plain",
    ]  # fmt: skip
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "setting up\n"
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signum, err[-2000:]
    assert "Traceback" not in err
    assert "0 trajectories in 0 groups" in out
    said = f"stopped by {signal.Signals(signum).name} after 0 of 1 groups"
    assert f"\n{said}\n" in out
    page = (tmp_path / "out" / "report.html").read_text()
    assert f"<h1>trajcore run: SlowSetupEnv: {said}</h1>" in page


def test_a_run_whose_env_has_no_more_items_says_how_many_groups_it_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "one"
    argv = [f"{RUN_ENVS}:OneItemEnv", "--policy", f"{RUN_ENVS}:answer", "--groups", "3",
            "--out", str(out), "--pool", "unisolated", "--plain"]  # fmt: skip
    assert main(argv) == 0
    said = "ended after 1 of 3 groups: the env had no more items (get_next_item gave None)"
    assert f"\n{said}\n" in capsys.readouterr().out
    assert f"<h1>trajcore run: OneItemEnv: {said}</h1>" in (out / "report.html").read_text()
    assert [r["score"] for r in _records(out)] == [1.0]


def test_a_group_whose_task_text_cannot_be_had_is_still_written(tmp_path: Path) -> None:
    """``build_task`` raises: the members end as ``env_error``, and the run still writes the
    group (its report names the error where the task's text would be); before, the report's
    call for the task text raised after the group ran, and the group was lost."""
    env_file = tmp_path / "broken_env.py"
    env_file.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'examples')!r})\n"
        "from shell_tasks import ShellTasksEnv, solve  # noqa: F401\n\n\n"
        "class BrokenEnv(ShellTasksEnv):\n"
        "    def build_task(self, item):\n"
        "        raise RuntimeError('no task for this item')\n"
    )
    out = tmp_path / "run"
    main([f"{env_file}:BrokenEnv", "--policy", "solve", "--groups", "1", "--group-size", "1",
          "--pool", "unisolated", "--out", str(out), "--plain"])  # fmt: skip
    records = _records(out)
    assert [r["status"] for r in records] == ["env_error"]
    assert (
        "task_messages raised RuntimeError: no task for this item"
        in (out / "report.html").read_text()
    )
