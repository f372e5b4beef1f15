"""Reports of scored groups: JSON lines for programs, an HTML page and a table for people.

A run of an env ends with ``GroupResult`` values; this module writes them down three ways:

- ``write_jsonl``: one JSON object per trajectory (group, member, score, status, turns, tool
  calls, tool errors, duration, the prepare and score hooks' metadata, each tool call's outcome,
  the messages, and tokens, masks and logprobs when the policy exported them). One line is one
  trajectory, so files from several runs concatenate. ``JsonLines`` writes the same lines as a
  run goes, group by group, so a run ended at once (a second Ctrl-C, a SIGKILL after SIGTERM)
  keeps every group it finished, each line whole.
- ``write_html``: one self-contained page (inline style, no script, no external asset): a summary
  table with a row per trajectory, and under it every conversation in an expandable section:
  every turn's text and reasoning, each tool call as its name and indented arguments, each
  result as plain text with its outcome (exit code, timeout, refusal), and the member's score,
  status and metadata. The page is rendered from the package's jinja2 templates
  (``entrypoints/templates``).
- ``summary_table``: the same summary as text for a terminal.

The page and the table are drawn from trajectory records (``ReportGroup``), so they show a
run's ``GroupResult`` s and, as well, any env's output file read back by ``report_files``: a
``trajectories.jsonl`` of ``trajcore run`` or ``trajcore demo``, or the groups JSONL that
Atropos's ``process`` mode writes (``trajcore report FILE``).

``ProgressBar`` shows how many groups are done while a run goes on.

Rules this module keeps:

- The HTML page is rendered with autoescape on and the templates never mark a value safe, so
  everything the model, a tool or the caller wrote (titles, notes, tasks, group ids, details,
  messages, tool calls) shows as text and can never run or break out of an attribute; its
  control characters (NUL, escape sequences, bells) show as their Unicode symbols, C1 controls
  and lone surrogates as their escapes.
- The table and the progress bar use ``rich`` when it is installed (the ``report`` extra) and
  plain text otherwise; ``plain=True`` asks for plain text either way. On a stream that is not
  a terminal the bar writes one line per step, so logs stay readable.
- A member that failed (infrastructure or model error) shows its status and its detail, never a
  score of 0: its ``score`` is ``null`` in JSON and ``-`` in the tables.
- A file is never left half-written: ``write_jsonl`` and ``write_html`` write a temporary file
  beside it and rename it over the old one; ``JsonLines.append`` writes its lines with one
  ``write`` on a file opened for appending, so a line is either all there or not at all.
- Writers take the groups as they are; they never re-judge them. ``kept`` says whether the
  group's verdict keeps the member for training.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs
import jinja2

from trajcore.domain.json_values import JSON, JSONObject
from trajcore.rollout.group import GroupResult
from trajcore.rollout.trajectory import ToolExchange, TrajectoryResult

__all__ = [
    "JsonLines",
    "ProgressBar",
    "ReportGroup",
    "ran_unsandboxed",
    "render_html",
    "report_groups",
    "summary_table",
    "trajectory_record",
    "write_html",
    "write_jsonl",
]


def _members(groups: Sequence[GroupResult]) -> Iterator[tuple[GroupResult, int, TrajectoryResult]]:
    for group in groups:
        for index, member in enumerate(group.members):
            yield group, index, member


def _exchange_record(exchange: ToolExchange) -> JSONObject:
    result = exchange.result
    report = result.exec
    return {
        "turn": exchange.turn,
        "call_id": result.call_id,
        "name": result.name,
        "outcome": result.outcome.value,
        "error": result.error,
        "exit_code": None if report is None else report.exit_code,
        "timed_out": None if report is None else report.timed_out,
        "sandboxed": None if report is None else report.sandboxed,
        "duration_s": None if report is None else round(report.duration_s, 4),
    }


def trajectory_record(group: GroupResult, index: int) -> JSONObject:
    """The JSON object of member ``index`` of ``group``: one line of the JSONL file.

    Raises:
        IndexError: ``group`` has no member ``index``.
    """
    member = group.members[index]
    stats = member.stats
    errors = stats.tool_errors
    record: JSONObject = {
        "group": group.group_id,
        "member": index,
        "trajectory_id": member.trajectory_id,
        "score": member.outcome.score,
        "kept": index in group.verdict.kept,
        "status": member.outcome.status.value,
        "stop_reason": None if stats.stop_reason is None else stats.stop_reason.value,
        "detail": member.outcome.detail,
        "turns": stats.turns,
        "tool_calls": stats.tool_calls,
        "tool_errors": errors.total,
        "tool_errors_by_kind": {
            "tool_error": errors.tool_error,
            "timeout": errors.timeout,
            "rejected": errors.rejected,
            "infra_error": errors.infra_error,
        },
        "parse_errors": stats.parse_errors,
        "duration_s": round(member.duration_s, 4),
        "slot": member.slot,
        "group_status": group.verdict.status.value,
        "group_drop_reason": (
            None if group.verdict.drop_reason is None else group.verdict.drop_reason.value
        ),
        "prepare_metadata": member.prepare_metadata,
        "score_metadata": member.score_metadata,
        "tool_results": [_exchange_record(exchange) for exchange in member.exchanges],
        "messages": [m.to_chat_dict() for m in member.messages],
    }
    tokens = member.tokens
    if tokens is not None:
        record["tokens"] = list(tokens.tokens)
        record["masks"] = list(tokens.masks)
        logprobs: JSON = (
            None if tokens.inference_logprobs is None else list(tokens.inference_logprobs)
        )
        record["inference_logprobs"] = logprobs
        record["token_exact"] = tokens.token_exact
    if group.environment is not None:  # the task environment (image reference) it ran over
        record["environment"] = group.environment
    return record


def _json_lines(records: Iterable[JSON]) -> str:
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it: a reader, or a run
    stopped in the middle, sees the old file or the new one, never a part of either."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        # a lone surrogate (a model's JSON "\ud800" decoded) cannot be UTF-8: written as its
        # escape, which inside a JSON string reads back as that very character
        partial.write_text(text, encoding="utf-8", errors="backslashreplace")
        partial.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def write_jsonl(groups: Sequence[GroupResult], path: Path) -> int:
    """Write one line per trajectory of ``groups`` to ``path`` (replacing it, at once).

    Returns the number of lines written. Raises ``OSError`` when the file cannot be written.
    """
    records = [trajectory_record(group, index) for group, index, _ in _members(groups)]
    _replace(path, _json_lines(records))
    return len(records)


@attrs.define(eq=False)
class JsonLines:
    """A JSON-lines file written as a run goes: ``JsonLines.create(path)`` empties it, each
    ``append`` adds whole lines, ``close`` closes it (also ``with``).

    Attributes:
        path: The file.
        lines: How many lines were appended.
    """

    path: Path
    _fd: int | None
    lines: int = 0

    @classmethod
    def create(cls, path: Path) -> JsonLines:
        """Open ``path`` empty. Raises ``OSError`` when it cannot be written."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
        return cls(path, os.open(path, flags, 0o644))

    def append(self, records: Iterable[Mapping[str, object]]) -> int:
        """Add one line per record, all with one ``write`` (a line is never left cut short by
        a stop between two of them); returns how many. Raises ``OSError``; ``ValueError``
        when closed."""
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        lines = [json.dumps(record, ensure_ascii=False) + "\n" for record in records]
        data = memoryview("".join(lines).encode("utf-8", "backslashreplace"))  # see _replace
        while data:  # (a regular file takes it all at once, unless the disk is full)
            data = data[os.write(self._fd, data) :]
        self.lines += len(lines)
        return len(lines)

    def append_group(self, group: GroupResult) -> int:
        """Add ``group``'s trajectory records (``trajectory_record``); returns how many."""
        return self.append(trajectory_record(group, i) for i in range(len(group.members)))

    def close(self) -> None:
        """Close the file (again: nothing)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> JsonLines:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ------------------------------------------------------------------------------- the terminal

_COLUMNS = ("group", "#", "status", "score", "turns", "tools", "errors", "time")
_RIGHT = frozenset({1, 3, 4, 5, 6, 7})


def _rich_installed() -> bool:
    try:
        import rich  # noqa: F401 - only whether it imports
    except ImportError:
        return False
    return True


@attrs.frozen(kw_only=True)
class ReportGroup:
    """One group as the page and the table show it: trajectory records and the group's verdict.

    Attributes:
        group_id: The group's id.
        status: The group's verdict (complete, partial, failed), or what the file says.
        detail: Why, in words (may be empty).
        duration_s: The group's wall time, when known.
        task: The task's text, shown above its conversations, or ``None``.
        members: One trajectory record per member (``trajectory_record``'s shape; records read
            from older or other files may lack fields, and show ``-`` for them).
    """

    group_id: str
    status: str
    detail: str = ""
    duration_s: float | None = None
    task: str | None = None
    members: tuple[JSONObject, ...] = ()


def report_groups(
    groups: Sequence[GroupResult], *, tasks: Mapping[str, str] | None = None
) -> list[ReportGroup]:
    """``groups`` as ``ReportGroup`` s; ``tasks`` maps a group id to its task's text."""
    tasks = tasks or {}
    return [
        ReportGroup(
            group_id=group.group_id,
            status=group.verdict.status.value,
            detail=group.verdict.detail,
            duration_s=group.duration_s,
            task=tasks.get(group.group_id),
            members=tuple(trajectory_record(group, i) for i in range(len(group.members))),
        )
        for group in groups
    ]


def _as_report(
    groups: Sequence[GroupResult] | Sequence[ReportGroup], tasks: Mapping[str, str] | None = None
) -> list[ReportGroup]:
    results = [g for g in groups if isinstance(g, GroupResult)]
    reported = [g for g in groups if isinstance(g, ReportGroup)]
    return report_groups(results, tasks=tasks) if results else reported


def _field(record: JSONObject, name: str) -> str:
    value = record.get(name)
    return "-" if value is None else str(value)


def _record_score(record: JSONObject) -> str:
    score = record.get("score")
    return f"{score:g}" if isinstance(score, int | float) and not isinstance(score, bool) else "-"


def _record_status(record: JSONObject) -> str:
    status = str(record.get("status") or "-")
    stop = record.get("stop_reason")
    if stop is None or stop in (status, "natural"):
        return status
    return f"{status} ({stop})"


def _record_time(record: JSONObject) -> str:
    seconds = record.get("duration_s")
    return f"{seconds:.1f}s" if isinstance(seconds, int | float) else "-"


def _summary_rows(groups: Sequence[ReportGroup]) -> list[tuple[str, ...]]:
    return [
        (
            group.group_id,
            _field(record, "member") if "member" in record else str(index),
            _record_status(record),
            _record_score(record),
            _field(record, "turns"),
            _field(record, "tool_calls"),
            _field(record, "tool_errors"),
            _record_time(record),
        )
        for group in groups
        for index, record in enumerate(group.members)
    ]


def ran_unsandboxed(groups: Sequence[GroupResult]) -> bool:
    """Whether any tool call of ``groups`` ran without a sandbox (its report says so)."""
    return any(
        e.result.exec is not None and not e.result.exec.sandboxed
        for g in groups
        for m in g.members
        for e in m.exchanges
    )


def summary_table(
    groups: Sequence[GroupResult] | Sequence[ReportGroup], *, plain: bool = False
) -> str:
    """A table with a row per trajectory, and a totals line under it.

    Drawn by ``rich`` when it is installed and ``plain`` is false, else as fixed-width columns
    separated by two spaces under a dashed rule.
    """
    groups = _as_report(groups)
    rows = _summary_rows(groups)
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(_COLUMNS)]
    if not plain and _rich_installed():
        table = _rich_table(rows, widths)
    else:
        table = _plain_table(rows, widths)
    return f"{table}\n{_totals(groups)}"


def _plain_table(rows: Sequence[Sequence[str]], widths: Sequence[int]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(width) if i in _RIGHT else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(_COLUMNS), line(["-" * w for w in widths]), *map(line, rows)])


def _rich_table(rows: Sequence[Sequence[str]], widths: Sequence[int]) -> str:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i, name in enumerate(_COLUMNS):
        table.add_column(name, justify="right" if i in _RIGHT else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    out = io.StringIO()
    # Wide enough that no cell is cut: the table takes its natural width.
    console = Console(file=out, width=sum(widths) + 3 * len(widths) + 8, color_system=None)
    console.print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()).strip("\n")


def _totals(groups: Sequence[ReportGroup]) -> str:
    members = [record for group in groups for record in group.members]
    scores = [
        float(score)
        for record in members
        if isinstance(score := record.get("score"), int | float) and not isinstance(score, bool)
    ]
    statuses: dict[str, int] = {}
    for record in members:
        status = str(record.get("status") or "-")
        statuses[status] = statuses.get(status, 0) + 1
    mean = f"{sum(scores) / len(scores):.3f}" if scores else "-"
    counted = ", ".join(f"{count} {status}" for status, count in sorted(statuses.items()))
    return (
        f"{len(members)} trajectories in {len(groups)} groups: {counted or 'none'}; "
        f"mean score {mean} over {len(scores)} scored"
    )


@attrs.define
class ProgressBar:
    """A one-line progress bar on a text stream (standard error by default).

    On a terminal the line is redrawn in place, by ``rich`` when it is installed and ``plain``
    is false; elsewhere (a log file, a pipe) each step is a line of its own, so logs stay
    readable. ``close`` ends a bar that will not reach ``total`` (a run that failed).

    Attributes:
        total: Steps in all.
        label: What a step is ("groups").
        width: Characters of the bar.
        stream: Where it is drawn.
        plain: Draw the bar by hand even when ``rich`` is installed.
    """

    total: int
    label: str = "groups"
    width: int = 30
    stream: TextIO = attrs.field(factory=lambda: sys.stderr)
    plain: bool = False
    done: int = attrs.field(default=0, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _rich: Any = attrs.field(default=None, init=False)  # rich's Progress and its task id

    def _line(self, note: str) -> str:
        filled = self.width if self.total <= 0 else self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        return f"[{bar}] {self.done}/{self.total} {self.label}" + (f"  {note}" if note else "")

    def _tty(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty()) if callable(isatty) else False

    def start(self) -> None:
        """Draw the empty bar (on a terminal only)."""
        if not self._tty():
            return
        if not self.plain and _rich_installed():
            self._rich = self._start_rich()
            return
        self.stream.write(self._line(""))
        self.stream.flush()

    def _start_rich(self) -> tuple[Any, Any]:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        progress = Progress(
            BarColumn(bar_width=self.width, complete_style="green", finished_style="green"),
            MofNCompleteColumn(),
            TextColumn(self.label),
            TextColumn("{task.fields[note]}"),
            console=Console(file=self.stream),
            auto_refresh=False,  # redrawn at each step: no thread of its own
            redirect_stdout=False,
            redirect_stderr=False,
        )
        task = progress.add_task(self.label, total=self.total, note="")
        progress.start()  # draws the first frame
        return progress, task

    def advance(self, note: str = "") -> None:
        """One more step done; ``note`` is shown after the count. Nothing is drawn once closed."""
        if self._closed:
            return
        self.done += 1
        if self._rich is not None:
            progress, task = self._rich
            progress.update(task, completed=self.done, note=note)
            progress.refresh()
            if self.done >= self.total:
                self.close()
            return
        if self._tty():
            self.stream.write("\r\x1b[2K" + self._line(note))
            if self.done >= self.total:
                self.stream.write("\n")
                self._closed = True
        else:
            self.stream.write(self._line(note) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Stop redrawing and end the bar's line; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._rich is not None:
            progress, _ = self._rich
            self._rich = None
            progress.stop()
        elif self._tty() and self.done < self.total:
            self.stream.write("\n")
            self.stream.flush()


# ------------------------------------------------------------------------------------ HTML


# C0 controls and DEL as the Unicode symbols for them (NUL as U+2400, ESC as U+241B), except
# the tab and the line ends, which the page's <pre> blocks show as they are; C1 controls and
# lone surrogates (which UTF-8 cannot write) as their escapes, ``\x85``, ``\ud800``
_CONTROL_PICTURES: dict[int, int | str] = {
    **{code: 0x2400 + code for code in range(0x20) if chr(code) not in "\t\n\r"},
    0x7F: 0x2421,
    **{code: f"\\x{code:02x}" for code in range(0x80, 0xA0)},
    **{code: f"\\u{code:04x}" for code in range(0xD800, 0xE000)},
}


def _visible(value: object) -> object:
    """``value`` as the page shows it: text with its control characters drawn as symbols (a
    tool's raw output may hold NUL, escape sequences or bells, which a browser would drop,
    act on or choke on), anything else as it is."""
    return value.translate(_CONTROL_PICTURES) if isinstance(value, str) else value


@functools.cache
def _templates() -> jinja2.Environment:
    """The report's templates (package data), escaping every value they show and drawing its
    control characters as symbols (``_visible``)."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("trajcore.entrypoints", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        finalize=_visible,
    )


def _anchor(group_id: str, index: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in group_id)
    return f"t-{safe}-{index}"


def _arguments(arguments: object) -> str:
    if isinstance(arguments, str):  # the OpenAI wire form: JSON text
        try:
            decoded: object = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
        return json.dumps(decoded, indent=2, ensure_ascii=False)
    return json.dumps(arguments, indent=2, ensure_ascii=False)


def _text(value: object) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _result_line(result: Mapping[str, object]) -> str:
    parts = [str(result.get("outcome") or "?")]
    if result.get("exit_code") is not None:
        parts.append(f"exit code {result['exit_code']}")
    if result.get("timed_out"):
        parts.append("timed out")
    if result.get("sandboxed") is False:
        parts.append("not sandboxed")
    if isinstance(seconds := result.get("duration_s"), int | float):
        parts.append(f"{seconds:.2f}s")
    if result.get("error"):
        parts.append(str(result["error"]))
    return " · ".join(parts)


def _message_view(message: Mapping[str, object], results: Mapping[str, str]) -> dict[str, object]:
    calls = message.get("tool_calls")
    views = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        function = function if isinstance(function, Mapping) else {}
        views.append(
            {
                "name": _text(function.get("name")),
                "id": _text(call.get("id")) if isinstance(call, Mapping) else "",
                "arguments": _arguments(function.get("arguments", {})),
            }
        )
    call_id = message.get("tool_call_id")
    return {
        "role": _text(message.get("role")) or "?",
        "name": _text(message.get("name")),
        "tool_call_id": _text(call_id),
        "reasoning": _text(message.get("reasoning_content")),
        "content": _text(message.get("content")),
        "tool_calls": views,
        "result": results.get(call_id) if isinstance(call_id, str) else None,
    }


def _metadata(record: JSONObject) -> list[dict[str, str]]:
    shown = []
    for label, key in (
        ("prepare metadata", "prepare_metadata"),
        ("score metadata", "score_metadata"),
    ):
        value = record.get(key)
        if value is not None:
            shown.append({"label": label, "json": json.dumps(value, indent=2, ensure_ascii=False)})
    return shown


def _member_view(group_id: str, index: int, record: JSONObject) -> dict[str, object]:
    results = record.get("tool_results")
    by_call = {
        str(r["call_id"]): _result_line(r)
        for r in (results if isinstance(results, list) else [])
        if isinstance(r, Mapping) and r.get("call_id") is not None
    }
    messages = record.get("messages")
    return {
        "anchor": _anchor(group_id, index),
        "group_id": group_id,
        "index": record.get("member", index),
        "trajectory_id": _text(record.get("trajectory_id")),
        "slot": _text(record.get("slot")),
        "environment": _text(record.get("environment")),
        "status_class": str(record.get("status") or ""),
        "status": _record_status(record),
        "score": _record_score(record),
        "kept": record.get("kept"),
        "turns": _field(record, "turns"),
        "tool_calls": _field(record, "tool_calls"),
        "tool_errors": _field(record, "tool_errors"),
        "time": _record_time(record),
        "detail": _text(record.get("detail")),
        "metadata": _metadata(record),
        "messages": [
            _message_view(m, by_call)
            for m in (messages if isinstance(messages, list) else [])
            if isinstance(m, Mapping)
        ],
    }


def render_html(
    groups: Sequence[GroupResult] | Sequence[ReportGroup],
    *,
    title: str,
    notes: Sequence[str] = (),
    tasks: Mapping[str, str] | None = None,
) -> str:
    """The report page: summary table, then every conversation, expandable.

    ``groups`` are a run's results or ``ReportGroup`` s (read from a file). ``notes`` are lines
    shown under the title (the model used, the pool). ``tasks`` maps a group id to its task's
    text, shown above that group's conversations.
    """
    report = _as_report(groups, tasks)
    members = [
        [_member_view(group.group_id, i, record) for i, record in enumerate(group.members)]
        for group in report
    ]
    sections = [
        {
            "group_id": group.group_id,
            "status": group.status,
            "detail": group.detail,
            "time": "-" if group.duration_s is None else f"{group.duration_s:.1f}s",
            "task": group.task,
            "members": views,
        }
        for group, views in zip(report, members, strict=True)
    ]
    return (
        _templates()
        .get_template("report.html.j2")
        .render(
            title=title,
            notes=list(notes),
            totals=_totals(report),
            rows=[view for views in members for view in views],
            groups=sections,
        )
    )


def write_html(
    groups: Sequence[GroupResult] | Sequence[ReportGroup],
    path: Path,
    *,
    title: str,
    notes: Sequence[str] = (),
    tasks: Mapping[str, str] | None = None,
) -> None:
    """Write ``render_html(...)`` to ``path`` (replacing it, at once). Raises ``OSError`` when
    it cannot be written."""
    _replace(path, render_html(groups, title=title, notes=notes, tasks=tasks))
