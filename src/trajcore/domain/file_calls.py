"""What a file tool's call (``read_file``, ``write_file``) may carry, whatever the workspace holds.

One rule for every pool: the slot server applies it before it opens anything, the shipped fakes
apply it before they touch their files, and ``SlotTools`` applies it to a hook's own call before
it sends one. A call it refuses is ``REJECTED`` with ``reason @ $.field`` and reads or writes
nothing, on every pool, so an env tested on a fake meets the same answer on a real one.

Rules it keeps:

- The path is looked at first (``workspace_path_problem`` after ``home_relative``), then a
  write's ``content``; a call with both wrong is refused for its path.
- ``content`` is text UTF-8 can carry: a lone surrogate (``LONE_SURROGATE``, what a model's JSON
  ``"\\ud800"`` decodes to) is refused, whatever its place. A path may hold ``U+DC80..U+DCFF``
  (a byte of a name), a file's text may not: no file holds that character.
"""

from __future__ import annotations

from collections.abc import Mapping

from trajcore.domain.messages import LONE_SURROGATE
from trajcore.domain.slot_protocol import home_relative, workspace_path_problem

__all__ = ["file_call_problem", "text_problem"]


def text_problem(text: str) -> str | None:
    """Why ``text`` (a file's content, a command) is no text a slot can hold, or ``None``: it
    holds a lone surrogate, which no UTF-8 carries. Worded as the slot server's refusal, before
    its `` @ $.field``."""
    found = LONE_SURROGATE.search(text)
    if found is None:
        return None
    return f"not valid Unicode text (a lone surrogate at {found.start()})"


def file_call_problem(tool: str, arguments: Mapping[str, object]) -> str | None:
    """The refusal (``reason @ $.field``) of a ``read_file`` or ``write_file`` call whose
    ``arguments`` (of the types the tool's spec asks) can touch no file of any workspace, or
    ``None``: its ``path`` (``workspace_path_problem``), then, for a write, its ``content``
    (``text_problem``). Arguments of other types are left to the spec's check."""
    path = arguments.get("path")
    if isinstance(path, str):
        problem = workspace_path_problem(home_relative(path))
        if problem is not None:
            return f"{problem} @ $.path"
    content = arguments.get("content")
    if tool == "write_file" and isinstance(content, str):
        problem = text_problem(content)
        if problem is not None:
            return f"{problem} @ $.content"
    return None
