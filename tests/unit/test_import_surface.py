"""Every name the README, the docs and the examples use imports from where they say it lives.

Also: the env author's surface (``trajcore.env``, and ``trajcore`` itself, lazily) holds the
whole list, and ``trajcore.adapters.fakes`` exports every fake the docs name.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def _python_blocks(markdown: str) -> Iterator[str]:
    for match in re.finditer(r"```python\n(.*?)```", markdown, re.S):
        yield match.group(1)


def _from_imports(source: str) -> Iterator[tuple[str, str]]:
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.split(".")[0] == "trajcore"
        ):
            for alias in node.names:
                yield node.module, alias.name


def _used_imports() -> set[tuple[str, str, str]]:
    used: set[tuple[str, str, str]] = set()
    for path in DOCS:
        for block in _python_blocks(path.read_text()):
            used.update((path.name, m, n) for m, n in _from_imports(block))
    for path in EXAMPLES:
        used.update((path.name, m, n) for m, n in _from_imports(path.read_text()))
    return used


def _dotted_references() -> set[tuple[str, str]]:
    """Backticked ``trajcore.a.b`` or ``trajcore.a.b.Name`` references in the docs."""
    refs: set[tuple[str, str]] = set()
    for path in DOCS:
        for match in re.finditer(r"`(trajcore(?:\.[A-Za-z_]\w*)+)`", path.read_text()):
            refs.add((path.name, match.group(1)))
    return refs


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(dotted)


def test_the_docs_and_examples_import_something() -> None:
    used = _used_imports()
    assert any(m == "trajcore.adapters.fakes" or m.startswith("trajcore") for _, m, _ in used)
    assert len(used) >= 5, used


@pytest.mark.parametrize(("where", "module", "name"), sorted(_used_imports()))
def test_every_imported_name_exists(where: str, module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"{where}: from {module} import {name}"


@pytest.mark.parametrize(("where", "dotted"), sorted(_dotted_references()))
def test_every_dotted_reference_resolves(where: str, dotted: str) -> None:
    _resolve(dotted)


def test_every_fake_the_docs_name_is_exported_by_the_testing_facade() -> None:
    testing = importlib.import_module("trajcore.testing")
    named = {name for path in DOCS for name in re.findall(r"`(Fake[A-Z]\w*)`", path.read_text())}
    assert {"FakeChatServer", "FakeTokenServer", "FakeSandboxPool", "FakeToolServer"} <= named
    missing = sorted(name for name in named if not hasattr(testing, name))
    assert not missing, f"trajcore.testing lacks {missing}"
    assert set(testing.__all__) >= named


def test_the_testing_facade_loads_each_fake_from_its_home_on_first_use() -> None:
    testing = importlib.import_module("trajcore.testing")
    homes: dict[str, str] = vars(testing)["_HOMES"]
    assert sorted(homes) == sorted(testing.__all__)
    for name in testing.__all__:
        assert getattr(testing, name) is getattr(importlib.import_module(homes[name]), name), name
    with pytest.raises(AttributeError, match="no_such_fake"):
        _ = testing.no_such_fake


def test_the_env_surface_is_whole_and_the_same_from_trajcore() -> None:
    env = importlib.import_module("trajcore.env")
    import trajcore

    assert sorted(trajcore.__all__) == sorted(env.__all__)
    for name in env.__all__:
        assert getattr(trajcore, name) is getattr(env, name), name
    needed = {
        "AgentEnv", "AgentEnvConfig", "Message", "ToolCall", "ToolResult", "ToolSpec",
        "SlotTools", "ToolRegistry", "Toolset", "ToolsetCatalog", "ToolsetDistribution",
        "DistributionRegistry", "TrajcoreError", "ConfigError", "ToolServerError",
    }  # fmt: skip
    assert needed <= set(env.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = trajcore.Nope


def test_importing_trajcore_alone_stays_light() -> None:
    code = (
        "import sys, trajcore\n"
        "heavy = sorted(m for m in ('atroposlib', 'transformers', 'httpx') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "trajcore.Message\n"
        "assert 'atroposlib' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
