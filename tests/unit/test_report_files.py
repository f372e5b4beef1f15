"""The report of any env's output file: trajcore's trajectory records and Atropos's scored
groups read back, shown with every turn's tool calls, results, scores and metadata."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from tests.unit.test_report import CALL, GROUPS, RESULT, group, member, parse
from trajcore.domain.errors import InvalidInput
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tools import ExecReport
from trajcore.entrypoints.report import render_html, summary_table, write_jsonl
from trajcore.entrypoints.report_files import main, read_report_groups, report_groups_of_lines
from trajcore.rollout.trajectory import ToolExchange

SCORED = attrs.evolve(member("meta/0"), score_metadata={"passed": 3, "failing": ["t::a"]})


def _atropos_line(story: bool = True) -> JSONObject:
    """One group as Atropos's process mode writes it (chat dicts, arguments as JSON text)."""
    messages: list[JSON] = [
        {"role": "user", "content": "Make out.txt"},
        {
            "role": "assistant",
            "content": "Step 1.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "echo hi > out.txt"}'},
                }
            ],
        },
        {"role": "tool", "content": "exit 0", "tool_call_id": "c1", "name": "bash"},
        {"role": "assistant", "content": "Done."},
    ]
    overrides: list[JSON] = [
        {
            "token_exact": False,
            "trajcore": {
                "trajectory_id": "env-1/0",
                "status": "finished",
                "stop_reason": "natural",
                "turns": 2,
                "tool_calls": 1,
                "tool_errors": 0,
                "duration_s": 0.5,
                "slot": "local-0/0",
                "prepare_metadata": None,
                "score_metadata": {"checked": "out.txt"},
            },
        }
    ]
    line: JSONObject = {
        "tokens": [[1, 2, 3]],
        "masks": [[-100, 2, 3]],
        "scores": [1.0],
        "messages": [messages],
        "group_overrides": {"token_exact": False, "trajcore_group": "env-1"},
    }
    if story:
        line["overrides"] = overrides
    return line


def test_an_atropos_groups_file_shows_tool_calls_results_scores_and_metadata(
    tmp_path: Path,
) -> None:
    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps(_atropos_line()) + "\n" + json.dumps(_atropos_line(False)) + "\n")
    groups = read_report_groups(path)
    assert [g.group_id for g in groups] == ["env-1"]  # both lines name the same group
    assert len(groups[0].members) == 2
    page = render_html(groups, title="atropos file")
    parsed = parse(page)
    text = "".join(parsed.text)
    assert '"command": "echo hi > out.txt"' in text  # the call, not just "Step 1."
    assert "bash" in text
    assert "exit 0" in "".join(parsed.pre)
    assert '"checked": "out.txt"' in text  # the score's metadata
    assert "local-0/0" in text
    table = summary_table(groups, plain=True)
    assert "finished" in table
    assert "mean score 1.000 over 2 scored" in table


def test_a_trajectories_file_reads_back_to_the_same_table(tmp_path: Path) -> None:
    groups = [*GROUPS, group("meta", SCORED)]
    path = tmp_path / "trajectories.jsonl"
    write_jsonl(groups, path)
    read = read_report_groups(path)
    assert summary_table(read, plain=True) == summary_table(groups, plain=True)
    page = render_html(read, title="t")
    text = "".join(parse(page).text)
    assert '"failing": [' in text
    assert page.count("<details") == 5


def test_each_tool_result_shows_its_outcome() -> None:
    report = ExecReport(exit_code=3, stdout="x", duration_s=0.5, sandboxed=False)
    result = attrs.evolve(RESULT, exec=report)
    exited = attrs.evolve(SCORED, exchanges=(ToolExchange(turn=1, call=CALL, result=result),))
    page = render_html([group("g", exited)], title="t")
    text = "".join(parse(page).text)
    assert "score metadata" in text
    assert "ok · exit code 3 · not sandboxed · 0.50s" in text


@pytest.mark.parametrize(
    ("line", "field"),
    [("{not json", "line 2"), ("[1, 2]", "line 2"), ('{"x": 1}', "line 2")],
)
def test_a_line_that_is_neither_shape_is_refused_naming_it(line: str, field: str) -> None:
    lines = [json.dumps(_atropos_line()), line]
    with pytest.raises(InvalidInput) as caught:
        report_groups_of_lines(lines)
    assert caught.value.field == field


def test_the_report_command_writes_the_page_and_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps(_atropos_line()) + "\n")
    assert main([str(path), "--plain"]) == 0
    printed = capsys.readouterr().out
    assert "env-1" in printed
    assert (tmp_path / "groups.report.html").is_file()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main([str(empty), "--plain"]) == 0
    assert "0 trajectories in 0 groups" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    assert main([str(bad)]) == 2
    assert "line 1" in capsys.readouterr().err


_WITHOUT_JINJA2 = """
import sys


class _NoJinja2:
    def find_spec(self, name, path=None, target=None):
        if name == "jinja2" or name.startswith("jinja2."):
            raise ModuleNotFoundError("No module named 'jinja2'", name="jinja2")


sys.meta_path.insert(0, _NoJinja2())
from trajcore.entrypoints.cli import main

sys.exit(main(["report", "groups.jsonl"]))
"""


def test_the_report_command_without_its_extra_names_the_report_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_JINJA2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "install trajcore[report]" in done.stderr
