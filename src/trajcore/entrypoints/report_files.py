"""``trajcore report FILE``: the report page and table of any env's output file.

    trajcore report FILE [--out PAGE.html] [--title TEXT] [--plain]

``FILE`` is JSON Lines in either of the two shapes an env run writes:

- trajcore's trajectory records (one trajectory per line: ``trajectories.jsonl`` of
  ``trajcore run`` and ``trajcore demo``, ``report.write_jsonl``), grouped back by ``group``;
- Atropos's scored groups (one group per line, ``tokens``/``scores``/``messages``...: what
  ``python my_env.py process --env.data_path_to_save_groups FILE`` writes). A trajcore env's
  groups carry each member's story in ``overrides[i]["trajcore"]`` (status, stop reason, turns,
  tool calls and errors, slot, the hooks' metadata), and the page shows it; any other Atropos
  env's groups show their messages and scores.

It writes the self-contained HTML page (default: ``FILE`` with ``.report.html`` for its
suffix, so ``groups.jsonl`` gives ``groups.report.html`` and the ``groups.html`` Atropos writes
beside its groups file is left as it is) and prints the summary table. Exit status 0, or 2
with ``reason @ line N`` on stderr when the file cannot be read. It needs the ``report`` extra
(jinja2; rich for the drawn table), and says so when it is missing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from trajcore.domain.errors import InvalidInput
from trajcore.domain.json_values import JSON, JSONObject, json_lines
from trajcore.entrypoints.report import ReportGroup, summary_table, write_html

__all__ = ["main", "read_report_groups", "report_groups_of_lines"]


def _count(messages: object, what: str) -> int:
    if not isinstance(messages, list):
        return 0
    if what == "turns":
        return sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")
    return sum(
        len(calls)
        for m in messages
        if isinstance(m, Mapping) and isinstance(calls := m.get("tool_calls"), list)
    )


def _atropos_members(group: JSONObject, line: int) -> tuple[str, list[JSONObject]]:
    scores = group.get("scores")
    if not isinstance(scores, list):
        raise InvalidInput(f"line {line}.scores", "expected a list of scores")
    messages = group.get("messages")
    overrides = group.get("overrides")
    group_overrides = group.get("group_overrides")
    group_id = f"group-{line}"
    if isinstance(group_overrides, dict) and isinstance(group_overrides.get("trajcore_group"), str):
        group_id = str(group_overrides["trajcore_group"])
    members: list[JSONObject] = []
    for i, score in enumerate(scores):
        conversation: JSON = (
            messages[i] if isinstance(messages, list) and i < len(messages) else None
        )
        override = overrides[i] if isinstance(overrides, list) and i < len(overrides) else None
        story = override.get("trajcore") if isinstance(override, dict) else None
        story = story if isinstance(story, dict) else {}
        record: JSONObject = {
            "group": group_id,
            "member": i,
            "trajectory_id": story.get("trajectory_id", f"{group_id}/{i}"),
            "score": score,
            "kept": True,  # Atropos was sent only what was kept
            "status": story.get("status", "sent"),
            "stop_reason": story.get("stop_reason"),
            "detail": None,
            "turns": story.get("turns", _count(conversation, "turns")),
            "tool_calls": story.get("tool_calls", _count(conversation, "calls")),
            "tool_errors": story.get("tool_errors"),
            "duration_s": story.get("duration_s"),
            "slot": story.get("slot"),
            "environment": story.get("environment"),
            "prepare_metadata": story.get("prepare_metadata"),
            "score_metadata": story.get("score_metadata"),
            "messages": conversation if isinstance(conversation, list) else [],
        }
        members.append(record)
    return group_id, members


def report_groups_of_lines(lines: Iterable[str]) -> list[ReportGroup]:
    """The groups of a JSON Lines text in either shape (see the module docstring).

    Raises:
        InvalidInput: a line that is not a JSON object, or neither a trajectory record nor an
            Atropos group (field ``line N``).
    """
    order: list[str] = []
    members: dict[str, list[JSONObject]] = {}
    status: dict[str, str] = {}
    for number, value in json_lines(lines):
        if "trajectory_id" in value and "group" in value:
            group_id = str(value["group"])
            found = [value]
            status.setdefault(group_id, str(value.get("group_status") or "-"))
        elif "scores" in value:
            group_id, found = _atropos_members(value, number)
            status[group_id] = "sent to the trainer"
        else:
            raise InvalidInput(
                f"line {number}",
                "neither a trajectory record (trajectory_id, group) nor an Atropos group (scores)",
            )
        if group_id not in members:
            order.append(group_id)
        members.setdefault(group_id, []).extend(found)
    return [ReportGroup(group_id=g, status=status[g], members=tuple(members[g])) for g in order]


def read_report_groups(path: Path) -> list[ReportGroup]:
    """``report_groups_of_lines`` of the file at ``path``.

    Raises:
        InvalidInput: as ``report_groups_of_lines``. OSError: the file cannot be read.
    """
    with path.open(encoding="utf-8") as lines:
        return report_groups_of_lines(lines)


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="trajcore report",
        description="Write the HTML report of an env's output file and print its summary.",
    )
    parser.add_argument("file", type=Path, help="trajectories.jsonl, or Atropos's groups JSONL")
    parser.add_argument("--out", type=Path, help="the page to write (default: FILE.report.html)")
    parser.add_argument("--title", help="the page's title (default: the file's name)")
    parser.add_argument("--plain", action="store_true", help="print the table as plain text")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    """Write the page and print the table; returns the exit status."""
    args = _arguments(argv)
    try:
        groups = read_report_groups(args.file)
    except (InvalidInput, OSError) as error:
        print(f"trajcore report: {args.file}: {error}", file=sys.stderr)
        return 2
    out: Path = args.out or args.file.with_suffix(".report.html")
    write_html(groups, out, title=args.title or f"trajcore report: {args.file.name}")
    print(summary_table(groups, plain=args.plain))
    print(f"report: {out}")
    return 0
