"""Reports of scored groups: JSON lines for programs, an HTML page and a table for people.

A run of an env ends with ``GroupResult`` values; this module writes them down three ways:

- ``write_jsonl``: one JSON object per trajectory (group, member, score, status, turns, tool
  calls, tool errors, duration, the messages, and tokens, masks and logprobs when the policy
  exported them). One line is one trajectory, so files from several runs concatenate.
- ``write_html``: one self-contained page (inline style, no script, no external asset): a summary
  table with a row per trajectory, and under it every conversation in an expandable section, tool
  calls shown as their name and indented arguments, tool results as plain text. The page is
  rendered from the package's jinja2 templates (``entrypoints/templates``).
- ``summary_table``: the same summary as text for a terminal.

``ProgressBar`` shows how many groups are done while a run goes on.

Rules this module keeps:

- The HTML page is rendered with autoescape on and the templates never mark a value safe, so
  everything the model, a tool or the caller wrote (titles, notes, tasks, group ids, details,
  messages, tool calls) shows as text and can never run or break out of an attribute.
- The table and the progress bar use ``rich`` when it is installed (the ``report`` extra) and
  plain text otherwise; ``plain=True`` asks for plain text either way. On a stream that is not
  a terminal the bar writes one line per step, so logs stay readable.
- A member that failed (infrastructure or model error) shows its status and its detail, never a
  score of 0: its ``score`` is ``null`` in JSON and ``-`` in the tables.
- Writers take the groups as they are; they never re-judge them. ``kept`` says whether the
  group's verdict keeps the member for training.
"""

from __future__ import annotations

import functools
import io
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs
import jinja2

from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.messages import Message
from trajcore.rollout.group import GroupResult
from trajcore.rollout.trajectory import TrajectoryResult

__all__ = [
    "ProgressBar",
    "render_html",
    "summary_table",
    "trajectory_record",
    "write_html",
    "write_jsonl",
]


def _members(groups: Sequence[GroupResult]) -> Iterator[tuple[GroupResult, int, TrajectoryResult]]:
    for group in groups:
        for index, member in enumerate(group.members):
            yield group, index, member


def _score(member: TrajectoryResult) -> str:
    score = member.outcome.score
    return "-" if score is None else f"{score:g}"


def _status(member: TrajectoryResult) -> str:
    stop = member.stats.stop_reason
    status = member.outcome.status.value
    if stop is None or stop.value in (status, "natural"):
        return status
    return f"{status} ({stop.value})"


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
    return record


def write_jsonl(groups: Sequence[GroupResult], path: Path) -> int:
    """Write one line per trajectory of ``groups`` to ``path`` (replacing it).

    Returns the number of lines written. Raises ``OSError`` when the file cannot be written.
    """
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for group, index, _ in _members(groups):
            out.write(json.dumps(trajectory_record(group, index), ensure_ascii=False))
            out.write("\n")
            count += 1
    return count


# ------------------------------------------------------------------------------- the terminal

_COLUMNS = ("group", "#", "status", "score", "turns", "tools", "errors", "time")
_RIGHT = frozenset({1, 3, 4, 5, 6, 7})


def _rich_installed() -> bool:
    try:
        import rich  # noqa: F401 - only whether it imports
    except ImportError:
        return False
    return True


def _summary_rows(groups: Sequence[GroupResult]) -> list[tuple[str, ...]]:
    return [
        (
            group.group_id,
            str(index),
            _status(member),
            _score(member),
            str(member.stats.turns),
            str(member.stats.tool_calls),
            str(member.stats.tool_errors.total),
            f"{member.duration_s:.1f}s",
        )
        for group, index, member in _members(groups)
    ]


def summary_table(groups: Sequence[GroupResult], *, plain: bool = False) -> str:
    """A table with a row per trajectory, and a totals line under it.

    Drawn by ``rich`` when it is installed and ``plain`` is false, else as fixed-width columns
    separated by two spaces under a dashed rule.
    """
    rows = _summary_rows(groups)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_COLUMNS)]
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


def _totals(groups: Sequence[GroupResult]) -> str:
    members = [member for _, _, member in _members(groups)]
    scores = [m.outcome.score for m in members if m.outcome.score is not None]
    statuses: dict[str, int] = {}
    for member in members:
        statuses[member.outcome.status.value] = statuses.get(member.outcome.status.value, 0) + 1
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


@functools.cache
def _templates() -> jinja2.Environment:
    """The report's templates (package data), escaping every value they show."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("trajcore.entrypoints", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
    )


def _anchor(group: GroupResult, index: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in group.group_id)
    return f"t-{safe}-{index}"


def _message_view(message: Message) -> dict[str, object]:
    return {
        "role": message.role,
        "name": message.name,
        "tool_call_id": message.tool_call_id,
        "reasoning": message.reasoning,
        "content": message.content,
        "tool_calls": [
            {
                "name": call.name,
                "id": call.id,
                "arguments": json.dumps(call.arguments, indent=2, ensure_ascii=False),
            }
            for call in message.tool_calls
        ],
    }


def _member_view(group: GroupResult, index: int, member: TrajectoryResult) -> dict[str, object]:
    return {
        "anchor": _anchor(group, index),
        "group_id": group.group_id,
        "index": index,
        "status_class": member.outcome.status.value,
        "status": _status(member),
        "score": _score(member),
        "turns": member.stats.turns,
        "tool_calls": member.stats.tool_calls,
        "tool_errors": member.stats.tool_errors.total,
        "time": f"{member.duration_s:.1f}s",
        "detail": member.outcome.detail,
        "messages": [_message_view(m) for m in member.messages],
    }


def render_html(
    groups: Sequence[GroupResult],
    *,
    title: str,
    notes: Sequence[str] = (),
    tasks: Mapping[str, str] | None = None,
) -> str:
    """The report page: summary table, then every conversation, expandable.

    ``notes`` are lines shown under the title (the model used, the pool). ``tasks`` maps a group
    id to its task's text, shown above that group's conversations.
    """
    tasks = tasks or {}
    members = [[_member_view(group, i, m) for i, m in enumerate(group.members)] for group in groups]
    sections = [
        {
            "group_id": group.group_id,
            "status": group.verdict.status.value,
            "detail": group.verdict.detail,
            "time": f"{group.duration_s:.1f}s",
            "task": tasks.get(group.group_id),
            "members": views,
        }
        for group, views in zip(groups, members, strict=True)
    ]
    return (
        _templates()
        .get_template("report.html.j2")
        .render(
            title=title,
            notes=list(notes),
            totals=_totals(groups),
            rows=[view for views in members for view in views],
            groups=sections,
        )
    )


def write_html(
    groups: Sequence[GroupResult],
    path: Path,
    *,
    title: str,
    notes: Sequence[str] = (),
    tasks: Mapping[str, str] | None = None,
) -> None:
    """Write ``render_html(...)`` to ``path``. Raises ``OSError`` when it cannot be written."""
    path.write_text(render_html(groups, title=title, notes=notes, tasks=tasks), encoding="utf-8")
