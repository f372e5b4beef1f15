"""Each public name has one import path: the module that defines it, or one of the facades.

The facades are ``trajcore`` (lazy), ``trajcore.env`` (an env author's names),
``trajcore.compat`` (the seed ports) and ``trajcore.testing`` (the fakes). Any other module
that lists in ``__all__`` a name it only imports gives that name a second home, which is what
this test refuses.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
FACADES = frozenset(
    {
        "trajcore/__init__.py",
        "trajcore/env.py",
        "trajcore/compat.py",
        "trajcore/testing/__init__.py",
    }
)


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """A module's top-level statements, with those under ``if`` (``TYPE_CHECKING``) and ``try``."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out += _statements(node.body) + _statements(node.orelse)
        elif isinstance(node, ast.Try):
            out += _statements(node.body) + _statements(node.orelse)
            for handler in node.handlers:
                out += _statements(handler.body)
    return out


def second_homes(source: str) -> list[str]:
    """The names in ``__all__`` that the module does not define itself."""
    defined: set[str] = set()
    exported: list[str] = []
    for node in _statements(ast.parse(source).body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "__all__":
                    exported = [str(name) for name in ast.literal_eval(node.value)]
                elif isinstance(target, ast.Name):
                    defined.add(target.id)
    return [name for name in exported if name not in defined]


def _modules() -> list[str]:
    return sorted(str(path.relative_to(SRC)) for path in (SRC / "trajcore").rglob("*.py"))


def test_the_check_sees_a_re_export() -> None:
    """Control: a module that imports a name and lists it in ``__all__`` is caught."""
    source = (
        'from trajcore.domain.messages import Message\n__all__ = ["Message", "f"]\ndef f(): ...\n'
    )
    assert second_homes(source) == ["Message"]
    typed = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    X = int\nelse:\n    X = str\n"
        '__all__ = ["X"]\n'
    )
    assert second_homes(typed) == []


@pytest.mark.parametrize("module", [m for m in _modules() if m not in FACADES])
def test_no_module_but_a_facade_re_exports(module: str) -> None:
    homes = second_homes((SRC / module).read_text(encoding="utf-8"))
    assert not homes, f"{module} re-exports {homes}: import them from where they are defined"


def test_the_facades_exist() -> None:
    assert all((SRC / facade).is_file() for facade in FACADES)


def one_meaning(facades: dict[str, dict[str, object]]) -> list[str]:
    """The names that two facades export as different objects (one name, two meanings)."""
    seen: dict[str, tuple[str, object]] = {}
    clashes: list[str] = []
    for facade, names in facades.items():
        for name, value in names.items():
            first = seen.setdefault(name, (facade, value))
            if first[1] is not value:
                clashes.append(f"{name}: {first[0]} and {facade}")
    return clashes


def test_the_check_sees_one_name_with_two_meanings() -> None:
    """Control: the same name bound to two classes in two facades is caught; one object is not."""

    class Context: ...

    class SeedContext: ...

    assert one_meaning({"a": {"Context": Context}, "b": {"Context": SeedContext}}) == [
        "Context: a and b"
    ]
    assert one_meaning({"a": {"Context": Context}, "b": {"Context": Context}}) == []


def test_a_name_means_one_thing_in_every_facade() -> None:
    """``trajcore.env``, ``trajcore.compat`` and ``trajcore.testing`` share a name only for one
    object: a seed's class that trajcore also names is exported under its seed's name
    (``HermesToolContext``, ``SeedToolResult``)."""
    import importlib

    facades = {}
    for facade in ("trajcore.env", "trajcore.compat", "trajcore.testing"):
        module = importlib.import_module(facade)
        facades[facade] = {name: getattr(module, name) for name in module.__all__}
    assert one_meaning(facades) == []
