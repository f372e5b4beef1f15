"""The one rule a file tool's call keeps on every pool (``trajcore.domain.file_calls``), and the
home a path may start from (``home_relative``), as a shell reads it."""

from __future__ import annotations

import posixpath
import subprocess

import pytest

from trajcore.domain.file_calls import file_call_problem, text_problem
from trajcore.domain.slot_protocol import home_relative


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("plain text\n", None),
        ("é \u2028 \U0001f600", None),
        ("", None),
        ("\ud800", "not valid Unicode text (a lone surrogate at 0)"),
        ("the model \udcff", "not valid Unicode text (a lone surrogate at 10)"),
        ("ok\U0001f600\udfff", "not valid Unicode text (a lone surrogate at 3)"),
    ],
)
def test_text_that_no_utf_8_carries_says_where(text: str, problem: str | None) -> None:
    """The slot server's wording, which the pools answer with (it encodes strictly)."""
    assert text_problem(text) == problem
    if problem is None:
        text.encode("utf-8")
    else:
        with pytest.raises(UnicodeEncodeError):
            text.encode("utf-8")


@pytest.mark.parametrize(
    ("tool", "arguments", "refusal"),
    [
        ("write_file", {"path": "a.txt", "content": "x"}, None),
        ("read_file", {"path": "~//a.txt"}, None),
        ("write_file", {"path": "\udcff", "content": "x"}, None),  # a byte of a name: a path
        (
            "write_file",
            {"path": "a.txt", "content": "x\udcff"},
            "not valid Unicode text (a lone surrogate at 1) @ $.content",
        ),
        (
            "write_file",
            {"path": "/a", "content": "\ud800"},  # the path first
            "'/a' is absolute; give a path relative to the workspace @ $.path",
        ),
        (
            "read_file",
            {"path": "~/../x"},
            "'../x' contains '..'; paths must stay inside the workspace @ $.path",
        ),
        ("read_file", {"path": "a.txt", "content": "\ud800"}, None),  # a read takes no content
        ("write_file", {"path": 3, "content": None}, None),  # types: the spec's check
    ],
)
def test_a_file_call_is_refused_for_its_path_then_its_content(
    tool: str, arguments: dict[str, object], refusal: str | None
) -> None:
    assert file_call_problem(tool, arguments) == refusal


@pytest.mark.parametrize(
    ("path", "relative"),
    [("~//file", "file"), ("~///d//f", "d//f"), ("~//", "."), ("~//../x", "../x")],
)
def test_a_doubled_slash_after_the_home_stays_in_the_home(path: str, relative: str) -> None:
    """``~//file`` is ``$HOME//file`` in a shell, which names ``$HOME/file``: the workspace's
    ``file``, never ``/file``."""
    assert home_relative(path) == relative


def test_the_home_is_read_as_bash_reads_it() -> None:
    """What bash expands ``~//f`` and ``~///d//f`` to, with ``HOME`` the workspace, names the
    files ``home_relative`` names."""
    home = "/nonexistent/trajcore-home"  # expansion only: nothing is opened
    spelled = ["~//f", "~///d//f", "~/f", "~//"]
    script = 'for p in ~//f ~///d//f ~/f ~//; do echo "$p"; done'
    shell = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script],
        env={"HOME": home, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for path, expanded in zip(spelled, shell, strict=True):
        assert posixpath.normpath(expanded) == posixpath.normpath(
            posixpath.join(home, home_relative(path))
        ), (path, expanded)
