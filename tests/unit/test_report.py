"""The report writers (JSONL, HTML, terminal table, progress bar) on synthetic groups.

The table and the progress bar are checked both ways: drawn by rich (installed with the ``report``
extra, and so in the development environment) and as plain text, asked for with ``plain=True``
and taken on its own when rich cannot be imported.
"""

from __future__ import annotations

import io
import json
import sys
from html.parser import HTMLParser
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.domain.agent_loop import (
    LoopState,
    StopReason,
    ToolErrorCounts,
    TrajectoryStats,
)
from trajcore.domain.groups import GroupRules
from trajcore.domain.messages import Message
from trajcore.domain.token_ledger.ledger import TrainingTokens
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult
from trajcore.entrypoints.report import (
    JsonLines,
    ProgressBar,
    render_html,
    summary_table,
    trajectory_record,
    write_html,
    write_jsonl,
)
from trajcore.rollout.group import GroupResult
from trajcore.rollout.trajectory import ToolExchange, TrajectoryResult

CALL = ToolCall(id="c1", name="bash", arguments={"command": "echo '<b>hi</b>' > out.txt"})
RESULT = ToolResult(call_id="c1", name="bash", outcome=ToolOutcome.OK, content="exit 0\n<i>x</i>")
MESSAGES = (
    Message.system("You fix things."),
    Message.user("Make <out.txt> & say hi"),
    Message.assistant("on it", tool_calls=[CALL]),
    Message.tool(RESULT),
    Message.assistant("done"),
)


def member(
    tid: str,
    *,
    score: float | None = 1.0,
    stop: StopReason = StopReason.NATURAL,
    messages: tuple[Message, ...] = MESSAGES,
    tokens: TrainingTokens | None = None,
    errors: ToolErrorCounts | None = None,
) -> TrajectoryResult:
    stats = TrajectoryStats(
        state=LoopState.FINISHED,
        stop_reason=stop,
        detail=None if stop.status.healthy else "ModelServerError: HTTP 503",
        turns=2,
        tool_calls=1,
        tool_errors=errors or ToolErrorCounts(),
        parse_errors=0,
        completion_tokens=0,
        context_tokens=0,
        elapsed_s=1.0,
        produced_output=True,
    )
    return TrajectoryResult(
        trajectory_id=tid,
        messages=messages,
        stats=stats,
        outcome=stats.outcome(score=score),
        tokens=tokens,
        drift=None,
        exchanges=(ToolExchange(turn=1, call=CALL, result=RESULT),),
        duration_s=1.25,
        slot="local-0/1",
    )


def group(group_id: str, *members: TrajectoryResult) -> GroupResult:
    rules = GroupRules(group_size=len(members), min_healthy=1, drop_equal_scores=False)
    return GroupResult(
        group_id=group_id,
        members=members,
        verdict=rules.assess([m.outcome for m in members]),
        duration_s=2.0,
    )


TOKENS = TrainingTokens(
    tokens=(1, 2, 3),
    masks=(-100, 2, 3),
    inference_logprobs=(1.0, -0.5, -0.25),
    prompt_tokens=1,
    completion_tokens=2,
    environment_tokens=0,
    token_exact=True,
)

GROUPS = [
    group("make-file", member("make-file/0"), member("make-file/1", score=0.0)),
    group(
        "fix-<script>",
        member("fix/0", score=None, stop=StopReason.MODEL_ERROR),
        member("fix/1", tokens=TOKENS, errors=ToolErrorCounts(timeout=1, rejected=2)),
    ),
]


def test_json_lines_are_on_disk_group_by_group_before_the_file_is_closed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "trajectories.jsonl"
    path.write_text("an earlier run's line\n")
    lines = JsonLines.create(path)
    assert path.read_text() == ""  # a new run starts the file afresh
    assert lines.append_group(GROUPS[0]) == 2
    # not closed, not flushed by anyone: a process ended now (SIGKILL) leaves these lines
    assert [json.loads(line)["member"] for line in path.read_text().splitlines()] == [0, 1]
    assert lines.append([{"note": "line\nbreak"}]) == 1
    lines.close()
    lines.close()
    assert lines.lines == 3
    assert json.loads(path.read_text().splitlines()[2]) == {"note": "line\nbreak"}
    with pytest.raises(ValueError, match="closed"):
        lines.append([{}])


def test_the_writers_replace_a_file_whole_and_leave_no_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    path.write_text("the old page")
    write_html(GROUPS, path, title="report")
    write_jsonl(GROUPS, tmp_path / "groups.jsonl")
    assert path.read_text().rstrip().endswith("</html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["groups.jsonl", "report.html"]


def test_jsonl_has_one_scored_line_per_trajectory(tmp_path: Path) -> None:
    path = tmp_path / "groups.jsonl"
    assert write_jsonl(GROUPS, path) == 4
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["group"], r["member"]) for r in lines] == [
        ("make-file", 0),
        ("make-file", 1),
        ("fix-<script>", 0),
        ("fix-<script>", 1),
    ]
    assert [r["score"] for r in lines] == [1.0, 0.0, None, 1.0]
    assert [r["status"] for r in lines] == ["finished", "finished", "model_error", "finished"]
    assert lines[2]["kept"] is False
    assert lines[2]["detail"] == "ModelServerError: HTTP 503"
    first = lines[0]
    assert (first["turns"], first["tool_calls"], first["tool_errors"]) == (2, 1, 0)
    assert first["duration_s"] == 1.25
    assert first["messages"][2]["tool_calls"][0]["function"]["name"] == "bash"
    assert first["messages"][3] == {
        "role": "tool",
        "content": "exit 0\n<i>x</i>",
        "tool_call_id": "c1",
        "name": "bash",
    }
    assert "tokens" not in first
    last = lines[3]
    assert last["tool_errors"] == 3
    assert last["tool_errors_by_kind"] == {
        "tool_error": 0,
        "timeout": 1,
        "rejected": 2,
        "infra_error": 0,
    }
    assert last["tokens"] == [1, 2, 3]
    assert last["masks"] == [-100, 2, 3]
    assert last["inference_logprobs"] == [1.0, -0.5, -0.25]
    assert last["token_exact"] is True


def test_a_record_and_the_page_name_the_task_environment_a_member_ran_over() -> None:
    over = attrs.evolve(GROUPS[0], environment="oci:/images/task-<1>")
    assert trajectory_record(over, 0)["environment"] == "oci:/images/task-<1>"
    assert "environment" not in trajectory_record(GROUPS[0], 0)
    text = "".join(parse(render_html([over], title="t")).text)
    assert "over oci:/images/task-<1>" in text
    assert "over oci:" not in "".join(parse(render_html(GROUPS[:1], title="t")).text)


def test_record_matches_the_jsonl_line(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl"
    write_jsonl(GROUPS[:1], path)
    assert json.loads(path.read_text().splitlines()[1]) == trajectory_record(GROUPS[0], 1)


class _Page(HTMLParser):
    """Collects start tags and the text inside <pre> elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.pre: list[str] = []
        self.text: list[str] = []
        self._in_pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs.extend(attrs)
        if tag == "pre":
            self._in_pre += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre":
            self._in_pre -= 1

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_pre:
            self.pre.append(data)


def parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    parser.close()
    return parser


def test_html_escapes_what_the_model_and_tools_wrote() -> None:
    page = render_html(GROUPS, title="Demo <run>", tasks={"make-file": "Create <out.txt>"})
    parsed = parse(page)
    assert "script" not in parsed.tags
    assert "i" not in parsed.tags
    assert "<b>hi</b>" not in page
    assert "<i>x</i>" not in page
    text = "".join(parsed.text)
    assert "exit 0\n<i>x</i>" in "".join(parsed.pre)
    assert "Make <out.txt> & say hi" in text
    assert "fix-<script>" in text
    assert "Create <out.txt>" in text
    assert "Demo <run>" in text
    assert "echo '<b>hi</b>' > out.txt" in text  # tool-call arguments, readable


def test_html_is_self_contained_with_a_row_and_a_section_per_trajectory() -> None:
    page = render_html(GROUPS, title="t", notes=["model: scripted"])
    parsed = parse(page)
    assert "link" not in parsed.tags
    assert "img" not in parsed.tags
    assert not any(
        value and value.startswith(("http:", "https:", "//")) for _, value in parsed.attrs
    )
    assert parsed.tags.count("details") == 4
    assert parsed.tags.count("tr") == 5  # header + one per trajectory
    hrefs = {value for name, value in parsed.attrs if name == "href"}
    ids = {value for name, value in parsed.attrs if name == "id"}
    assert hrefs == {f"#{i}" for i in ids}  # every row links to its conversation
    assert "model: scripted" in "".join(parsed.text)


def test_write_html_writes_the_page(tmp_path: Path) -> None:
    path = tmp_path / "r.html"
    write_html(GROUPS, path, title="report")
    assert path.read_text(encoding="utf-8") == render_html(GROUPS, title="report")


def _drawn(text: str) -> str:
    """``text`` as the page shows it: C0 controls as the Unicode symbols for them (U+2400 +
    code, DEL as U+2421), tab and line ends kept; C1 controls and lone surrogates escaped."""

    def one(c: str) -> str:
        code = ord(c)
        if code < 0x20 and c not in "\t\n\r":
            return chr(0x2400 + code)
        if code == 0x7F:
            return "\u2421"
        if 0x80 <= code < 0xA0:
            return f"\\x{code:02x}"
        if 0xD800 <= code < 0xE000:
            return f"\\u{code:04x}"
        return c

    return "".join(one(c) for c in text)


@given(st.text())
def test_any_message_text_reads_back_as_it_is_drawn(content: str) -> None:
    messages = (Message.user("task"), Message.assistant(content))
    page = render_html([group("g", member("g/0", messages=messages))], title="t")
    parsed = parse(page)
    assert parsed.tags.count("script") == 0
    if content:
        shown = _drawn(content).replace("\r\n", "\n").replace("\r", "\n")
        assert shown in "".join(parsed.pre).replace("\r\n", "\n").replace("\r", "\n")


def test_control_characters_a_tool_wrote_show_as_symbols() -> None:
    """Raw tool output (a NUL, a terminal's escape sequences, a bell) reaches the page as the
    symbols for those characters, never as the bytes a browser drops, acts on or chokes on."""
    call = ToolCall(id="c", name="bash", arguments={"command": "x"})
    raw = "a\x00b \x1b[31mred\x1b[0m \x07 \x7f\x85\tend\n"
    result = ToolResult(call_id="c", name="bash", outcome=ToolOutcome.OK, content=raw)
    messages = (
        Message.user("task"),
        Message.assistant("", tool_calls=[call]),
        Message.tool(result),
    )
    page = render_html([group("g", member("g/0", messages=messages))], title="t")
    assert not any(c in page for c in "\x00\x1b\x07\x7f\x85")
    assert "a\u2400b \u241b[31mred\u241b[0m \u2407 \u2421\\x85\tend" in "".join(parse(page).pre)


def test_a_lone_surrogate_in_a_tools_text_is_written_as_its_escape(tmp_path: Path) -> None:
    """A tool's text may hold a lone surrogate (a JSON ``\\ud800`` decoded): UTF-8 cannot
    write it, so the page shows its escape instead of the writer failing."""
    call = ToolCall(id="c", name="bash", arguments={"command": "x"})
    result = ToolResult(call_id="c", name="bash", outcome=ToolOutcome.OK, content="a\ud800b")
    messages = (Message.user("t"), Message.assistant("", tool_calls=[call]), Message.tool(result))
    path = tmp_path / "r.html"
    write_html([group("g", member("g/0", messages=messages))], path, title="t")
    assert "a\\ud800b" in path.read_text(encoding="utf-8")


HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
"""Markup that runs if it is not escaped, in element text and in an attribute alike."""


def _hostile_groups() -> list[GroupResult]:
    call = ToolCall(
        id=f"call-{HOSTILE}", name=f"tool-{HOSTILE}", arguments={HOSTILE: f"value {HOSTILE}"}
    )
    result = ToolResult(
        call_id=call.id, name=call.name, outcome=ToolOutcome.TOOL_ERROR, content=HOSTILE
    )
    messages = (
        Message.system(f"system {HOSTILE}"),
        Message.user(f"user {HOSTILE}"),
        Message.assistant(f"assistant {HOSTILE}", tool_calls=[call], reasoning=HOSTILE),
        Message.tool(result),
    )
    failed = member("t/0", score=None, stop=StopReason.MODEL_ERROR, messages=messages)
    failed = attrs.evolve(failed, outcome=attrs.evolve(failed.outcome, detail=HOSTILE))
    judged = group(f"g{HOSTILE}", failed, member("t/1", messages=messages))
    verdict = attrs.evolve(judged.verdict, detail=f"verdict {HOSTILE}")
    return [attrs.evolve(judged, verdict=verdict)]


def test_html_escapes_hostile_content_in_every_field() -> None:
    groups = _hostile_groups()
    page = render_html(
        groups,
        title=f"title {HOSTILE}",
        notes=[f"note {HOSTILE}"],
        tasks={groups[0].group_id: f"task {HOSTILE}"},
    )
    parsed = parse(page)
    assert "script" not in parsed.tags
    assert "img" not in parsed.tags
    assert {name for name, _ in parsed.attrs} <= {"lang", "charset", "class", "href", "id"}
    assert "<script>" not in page
    assert "<img" not in page
    text = "".join(parsed.text)
    # every field shows the hostile text as text, readable
    shown = [
        f"title {HOSTILE}",  # the title (in <title> and <h1>)
        f"note {HOSTILE}",
        f"task {HOSTILE}",
        f"g{HOSTILE}",  # the group id, in the table and the section heading
        f"verdict {HOSTILE}",
        f"system {HOSTILE}",
        f"user {HOSTILE}",
        f"assistant {HOSTILE}",
        f"tool-{HOSTILE}",  # the tool's name: the call's and the result's
        f"call-{HOSTILE}",  # the call id, on the call and on its result
        json.dumps({HOSTILE: f"value {HOSTILE}"}, indent=2, ensure_ascii=False),
    ]
    for value in shown:
        assert value in text, value
    assert text.count(f"title {HOSTILE}") == 2
    assert text.count(f"g{HOSTILE}") == 3  # two table rows and the heading
    assert text.count(f"tool-{HOSTILE}") == 4  # a call and a result, in two members
    # the reasoning, the tool result and the member's failure detail (the bare HOSTILE)
    assert parsed.pre.count(HOSTILE) == 4  # reasoning and tool result, in two members
    assert f"&middot; {HOSTILE}" not in page
    assert f" · {HOSTILE}" in text  # the failed member's detail, in its summary line


def test_summary_table_rows_and_totals() -> None:
    table = summary_table(GROUPS, plain=True).splitlines()
    assert table[0].split() == ["group", "#", "status", "score", "turns", "tools", "errors", "time"]
    rows = table[2:-1]
    assert len(rows) == 4
    assert rows[0].split() == ["make-file", "0", "finished", "1", "2", "1", "0", "1.2s"]
    assert rows[2].split()[2:4] == ["model_error", "-"]  # a failure is never a 0
    assert rows[3].split()[6] == "3"
    assert table[-1] == (
        "4 trajectories in 2 groups: 3 finished, 1 model_error; mean score 0.667 over 3 scored"
    )


@pytest.mark.parametrize("plain", [True, False])
def test_summary_table_of_no_groups_is_the_header_and_a_zero_total(plain: bool) -> None:
    table = summary_table([], plain=plain).splitlines()
    assert table[0].split() == ["group", "#", "status", "score", "turns", "tools", "errors", "time"]
    assert table[-1] == "0 trajectories in 0 groups: none; mean score - over 0 scored"


@pytest.mark.parametrize("plain", [True, False])
def test_summary_table_shows_the_stop_reason_when_it_differs(plain: bool) -> None:
    g = group("g", member("g/0", stop=StopReason.MAX_TURNS))
    assert "budget_exhausted (max_turns)" in summary_table([g], plain=plain)


def test_summary_table_by_rich_has_the_same_cells_under_a_drawn_rule() -> None:
    table = summary_table(GROUPS).splitlines()
    assert table[0].split() == ["group", "#", "status", "score", "turns", "tools", "errors", "time"]
    assert set(table[1].strip()) == {"─"}  # rich's rule under the header, not dashes
    rows = table[2:-1]
    plain_rows = summary_table(GROUPS, plain=True).splitlines()[2:-1]
    assert [row.split() for row in rows] == [row.split() for row in plain_rows]
    assert table[-1] == summary_table(GROUPS, plain=True).splitlines()[-1]


def test_without_rich_the_table_and_the_bar_are_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)  # ``import rich`` raises ImportError
    assert summary_table(GROUPS) == summary_table(GROUPS, plain=True)
    stream = _Terminal()
    bar = ProgressBar(total=1, width=4, stream=stream)
    bar.start()
    bar.advance()
    assert stream.getvalue() == "[....] 0/1 groups\r\x1b[2K[####] 1/1 groups\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_pipe_writes_a_line_per_step() -> None:
    stream = io.StringIO()
    bar = ProgressBar(total=2, width=4, stream=stream)
    bar.start()
    bar.advance("make-file")
    bar.advance()
    assert stream.getvalue() == "[##..] 1/2 groups  make-file\n[####] 2/2 groups\n"


def test_progress_bar_on_a_terminal_redraws_one_line() -> None:
    stream = _Terminal()
    bar = ProgressBar(total=2, width=4, stream=stream, label="tasks", plain=True)
    bar.start()
    bar.advance()
    bar.advance()
    out = stream.getvalue()
    assert out.startswith("[....] 0/2 tasks")
    assert out.count("\r") == 2
    assert out.endswith("[####] 2/2 tasks\n")
    assert out.count("\n") == 1


def test_progress_bar_by_rich_redraws_on_a_terminal_and_ends_its_line() -> None:
    stream = _Terminal()
    bar = ProgressBar(total=2, width=4, stream=stream, label="tasks")
    bar.start()
    bar.advance("make-file")
    bar.advance("fix")
    out = stream.getvalue()
    assert "[" not in out.replace("\x1b[", "")  # not the hand-drawn bar
    assert "0/2" in out
    assert "1/2" in out
    assert "make-file" in out
    assert "2/2" in out
    assert "fix" in out
    assert out.count("\n") == 1  # one line, redrawn in place
    bar.close()  # already ended: nothing more
    bar.advance("late")
    assert stream.getvalue() == out


def test_progress_bar_by_rich_on_a_pipe_writes_a_line_per_step() -> None:
    stream = io.StringIO()
    bar = ProgressBar(total=2, width=4, stream=stream)
    bar.start()
    bar.advance()
    bar.advance()
    assert stream.getvalue() == "[##..] 1/2 groups\n[####] 2/2 groups\n"


@pytest.mark.parametrize("plain", [True, False])
def test_closing_an_unfinished_bar_ends_its_line_once(plain: bool) -> None:
    stream = _Terminal()
    bar = ProgressBar(total=3, width=4, stream=stream, plain=plain)
    bar.start()
    bar.advance()
    bar.close()
    bar.close()
    out = stream.getvalue()
    assert "1/3" in out
    assert out.replace("\x1b[?25h", "").endswith("\n")  # rich shows the cursor again last
    assert out.count("\n") == 1


def test_a_lone_surrogate_reads_back_from_the_jsonl_files(tmp_path: Path) -> None:
    """A model's JSON may carry ``"\\ud800"`` (a lone surrogate once decoded), which UTF-8
    cannot hold: both JSONL writers write its JSON escape, and the line reads back equal."""
    messages = (Message.user("t"), Message.assistant("a\ud800b"))
    groups = [group("g", member("g/0", messages=messages))]
    whole = tmp_path / "whole.jsonl"
    write_jsonl(groups, whole)
    with JsonLines.create(tmp_path / "live.jsonl") as live:
        live.append_group(groups[0])
    for path in (whole, tmp_path / "live.jsonl"):
        (line,) = path.read_text(encoding="utf-8").splitlines()
        assert json.loads(line) == trajectory_record(groups[0], 0)
