"""What every ``SandboxPool`` answers for a file tool's path and text, checked against a live lease.

``read_file`` and ``write_file`` take a ``path`` relative to the slot's workspace, and the slot
server answers it in one of three ways. The fakes answer it the same way, so an env tested on
them does not meet a different answer on a real pool:

- **Refused**, whatever the workspace holds: a path ``workspace_path_problem`` finds fault with
  (after ``home_relative``: ``~`` is the workspace): empty, a NUL byte, a lone surrogate that
  stands for no byte of a name, absolute, or a ``..`` component anywhere (``a/../file`` too,
  which would land inside). The call is ``REJECTED`` with that rule's reason at ``$.path``,
  and nothing is read or written.
- **The file's failure**: a well-formed path that names no regular file: a directory (``dir``,
  ``.``, ``~``), a regular file asked for as a directory (``file/``, ``file/.``, ``file/x``),
  or a write with a trailing slash (``new/``: a directory by its spelling). The call is a
  ``TOOL_ERROR`` naming the path, and nothing is written.
- **Read or written**: every other spelling of a path inside, each naming the file its
  components name: ``./n.txt``, ``~/n.txt`` and ``n.txt`` are one file, ``a//b/./c`` is
  ``a/b/c``, ``\\udcff`` (one byte 0xff of a name), ``~user/x`` (a name like any other),
  ``~//n.txt`` (``n.txt``: as in a shell, ``~`` is ``$HOME`` and ``$HOME//n.txt`` is
  ``$HOME/n.txt``, never ``/n.txt``).

A write's ``content`` is text: one holding a lone surrogate (a model's JSON ``"\\ud800"``), which
no UTF-8 carries, is ``REJECTED`` at ``$.content`` (``file_calls.text_problem``) and writes
nothing; a call whose path is refused too is refused for its path (``file_call_problem``).

``check_refused_paths``, ``check_paths_that_name_no_file``, ``check_path_spellings`` and
``check_refused_contents`` each take a started pool and a lease of it whose workspace is empty;
``PATH_CHECKS`` lists them for ``SandboxPoolContract.test_paths``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from trajcore.domain.file_calls import text_problem
from trajcore.domain.slot_protocol import home_relative, workspace_path_problem
from trajcore.domain.slots import Lease
from trajcore.domain.tools import ToolOutcome, ToolResult
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.portal_pools import slot_call

__all__ = [
    "NO_FILE_READS",
    "NO_FILE_WRITES",
    "PATH_CHECKS",
    "REFUSED_CONTENTS",
    "REFUSED_PATHS",
    "CheckPaths",
    "check_path_spellings",
    "check_paths_that_name_no_file",
    "check_refused_contents",
    "check_refused_paths",
]

REFUSED_PATHS: tuple[str, ...] = (
    "",
    "a\0b",
    "\ud800x",
    "/etc/passwd",
    "//x",
    "..",
    "../outside",
    "a/../file",
    "a/..",
    "./..",
    "~/../x",
    "~//../x",
    "~/a/../file",
)
"""Paths refused whatever the workspace holds (``workspace_path_problem``)."""

NO_FILE_READS: tuple[str, ...] = (
    "dir", "dir/", "dir/.", ".", "./", "~", "~/", "~//", "file/", "file/.", "file/x", "dir/inner/",
)  # fmt: skip
"""Paths a read finds no regular file at, over a workspace of ``file`` and ``dir/inner``."""

NO_FILE_WRITES: tuple[str, ...] = (
    "dir", "dir/", "dir/.", ".", "./", "~", "~/", "~//", "file/", "file/.", "file/x", "dir/inner/",
    "new/", "new/.", "new/x/", "new/x/.",
)  # fmt: skip
"""Paths a write finds no regular file to write at, over the same workspace."""

CheckPaths = Callable[[SandboxPool, Lease], Awaitable[None]]


async def _run(
    pool: SandboxPool, lease: Lease, path: str, content: str | None = None
) -> ToolResult:
    """``read_file`` of ``path``, or ``write_file`` of ``content`` to it."""
    if content is None:
        call = slot_call(lease, "read_file", path=path)
    else:
        call = slot_call(lease, "write_file", path=path, content=content)
    (result,) = await pool.execute(lease.slot.container, [call])
    return result


async def _prepare(pool: SandboxPool, lease: Lease) -> None:
    """Put ``file`` ("F") and ``dir/inner`` ("I") in the workspace."""
    for path, content in (("file", "F"), ("dir/inner", "I")):
        wrote = await _run(pool, lease, path, content)
        assert wrote.outcome is ToolOutcome.OK, wrote


async def _assert_untouched(pool: SandboxPool, lease: Lease) -> None:
    for path, content in (("file", "F"), ("dir/inner", "I")):
        read = await _run(pool, lease, path)
        assert (read.outcome, read.content) == (ToolOutcome.OK, content), (path, read)


async def check_refused_paths(pool: SandboxPool, lease: Lease) -> None:
    """Each of ``REFUSED_PATHS`` is ``REJECTED`` by ``read_file`` and ``write_file`` with the
    domain rule's reason at ``$.path``; ``file`` keeps its text (``a/../file`` wrote nothing)."""
    await _prepare(pool, lease)
    for path in REFUSED_PATHS:
        problem = workspace_path_problem(home_relative(path))
        assert problem is not None, path
        for content in (None, "w"):  # a read, then a write
            result = await _run(pool, lease, path, content)
            assert (result.outcome, result.error) == (
                ToolOutcome.REJECTED,
                f"{problem} @ $.path",
            ), (path, result)
    await _assert_untouched(pool, lease)


async def check_paths_that_name_no_file(pool: SandboxPool, lease: Lease) -> None:
    """Each of ``NO_FILE_READS`` (``NO_FILE_WRITES``) is the ``TOOL_ERROR`` of ``read_file``
    (``write_file``), naming the path; nothing is written (``new/`` leaves no ``new``)."""
    await _prepare(pool, lease)
    for paths, content in ((NO_FILE_READS, None), (NO_FILE_WRITES, "w")):
        for path in paths:
            result = await _run(pool, lease, path, content)
            assert result.outcome is ToolOutcome.TOOL_ERROR, (path, result)
            assert result.error is not None
            assert repr(path) in result.error, (path, result)
    await _assert_untouched(pool, lease)
    left = await _run(pool, lease, "new")
    assert left.outcome is ToolOutcome.TOOL_ERROR, left


async def check_path_spellings(pool: SandboxPool, lease: Lease) -> None:
    """Spellings of a path inside name the file their components name: what one writes, each
    other spelling of it reads (the text is the written spelling, in ASCII)."""
    spellings = (
        ("./n.txt", ("n.txt", "~/n.txt", "./n.txt")),
        ("~/m.txt", ("m.txt",)),
        ("~//h.txt", ("h.txt", "~/h.txt", "~///h.txt")),
        ("a//b/./c", ("a/b/c", "~/a/b/c")),
        ("\udcff", ("\udcff",)),
        ("~user/x", ("~user/x",)),
    )
    for written, reads in spellings:
        wrote = await _run(pool, lease, written, ascii(written))
        assert wrote.outcome is ToolOutcome.OK, (written, wrote)
        for path in reads:
            read = await _run(pool, lease, path)
            assert (read.outcome, read.content) == (ToolOutcome.OK, ascii(written)), (path, read)


REFUSED_CONTENTS: tuple[str, ...] = ("\ud800", "the model \udcff", "a\udfffb")
"""Contents no write takes, wherever it goes (``text_problem``: a lone surrogate)."""


async def check_refused_contents(pool: SandboxPool, lease: Lease) -> None:
    """``write_file`` of each of ``REFUSED_CONTENTS``, over ``file`` and to a new path, is
    ``REJECTED`` with the domain rule's reason at ``$.content``; a refused path is answered
    first; nothing is written (``file`` keeps its text, ``new.txt`` is not there)."""
    await _prepare(pool, lease)
    for content in REFUSED_CONTENTS:
        problem = text_problem(content)
        assert problem is not None, content
        for path in ("file", "new.txt", "~//new.txt"):
            result = await _run(pool, lease, path, content)
            assert (result.outcome, result.error) == (
                ToolOutcome.REJECTED,
                f"{problem} @ $.content",
            ), (path, content, result)
    both = await _run(pool, lease, "../x", REFUSED_CONTENTS[0])
    assert (both.outcome, both.error) == (
        ToolOutcome.REJECTED,
        f"{workspace_path_problem('../x')} @ $.path",
    ), both
    await _assert_untouched(pool, lease)
    left = await _run(pool, lease, "new.txt")
    assert left.outcome is ToolOutcome.TOOL_ERROR, left


PATH_CHECKS: tuple[CheckPaths, ...] = (
    check_refused_paths,
    check_paths_that_name_no_file,
    check_path_spellings,
    check_refused_contents,
)
"""The checks, for a parametrised contract test."""
