"""docs/writing_envs.md runs: its Python blocks, in order, as one program (a failing block is
named by its line in the page)."""

from __future__ import annotations
import __future__

import re
import sys
import types
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # it starts a local pool and runs pytest in a slot

PAGE = Path(__file__).resolve().parents[2] / "docs" / "writing_envs.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[int, str]]:
    text = PAGE.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in BLOCK.finditer(text)]


def test_the_page_has_a_block_for_every_topic() -> None:
    code = "\n".join(source for _, source in blocks())
    for needed in (
        "FakeSandboxPool",
        "UnisolatedSandboxPool",
        "LocalSandboxPool",
        "tools.pytest",
        "tool_registry",
        "ToolsetCatalog",
        "ToolsetDistribution",
        "ScriptedPolicy.managed",
        "FakeTokenServer",
        "OpenAIChatServer",
        "AgentEnv[Text, WordCountConfig]",
    ):
        assert needed in code, needed


def test_every_python_block_runs_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    module = types.ModuleType("writing_envs_doc")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    flags = __future__.annotations.compiler_flag
    for line, source in blocks():
        # Each block compiles at its own line, so a traceback names the page's line.
        code = compile(
            "\n" * (line - 1) + source, str(PAGE), "exec", flags=flags, dont_inherit=True
        )
        exec(code, module.__dict__)
