"""``./dev mutate`` keeps, with each module's stored run, digests of what the run saw (the
module, its selected tests and the toolchain), so ``--summary`` says which rows still stand for
the code as it is and ``--all --stale`` reruns only the others: a full run, resumed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_run", REPO / "mutation" / "run.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutation_run", module)
    spec.loader.exec_module(module)
    return module


tool = _load_tool()


def _tree(root: Path) -> None:
    files = {
        "src/trajcore/domain/m.py": "def f() -> int:\n    return 1\n",
        "tests/conftest.py": "",
        "tests/unit/conftest.py": "",
        "tests/unit/test_m.py": "def test_f() -> None: ...\n",
        "tests/unit/test_m_more.py": "def test_g() -> None: ...\n",
        "tests/unit/helper.py": "",
        "tests/other/test_elsewhere.py": "",
        "mutation/plugin.py": "",
        "requirements.lock": "mutmut==3.8\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _stored(root: Path, tests: list[str], **extra: Any) -> dict[str, Any]:
    run = {"module": "domain/m.py", "complete": True, "killed": 3, "survivors": []}
    return {**run, "fingerprint": tool.fingerprint("domain/m.py", tests, root), **extra}


def test_the_files_a_selection_runs_are_its_test_files_and_their_conftests(
    tmp_path: Path,
) -> None:
    _tree(tmp_path)
    args = ["tests/unit/test_m.py::test_f", "-k", "not slow", "tests/unit"]
    assert tool.selected_files(args, tmp_path) == [
        "tests/conftest.py",
        "tests/unit/conftest.py",
        "tests/unit/test_m.py",
        "tests/unit/test_m_more.py",
    ]


def test_a_run_stands_while_its_module_tests_and_toolchain_are_unchanged(
    tmp_path: Path,
) -> None:
    _tree(tmp_path)
    tests = ["tests/unit/test_m.py"]
    stored = _stored(tmp_path, tests)
    assert tool.staleness(stored, "domain/m.py", tests, tmp_path) == ""
    # a file the selection does not run changes nothing
    (tmp_path / "tests/other/test_elsewhere.py").write_text("x = 1\n")
    assert tool.staleness(stored, "domain/m.py", tests, tmp_path) == ""


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ("src/trajcore/domain/m.py", "the module changed since"),
        ("tests/unit/test_m.py", "its tests changed since"),
        ("tests/unit/conftest.py", "its tests changed since"),
        ("tests/conftest.py", "its tests changed since"),
        ("mutation/plugin.py", "the toolchain changed since"),
        ("requirements.lock", "the toolchain changed since"),
    ],
)
def test_a_run_no_longer_stands_once_what_it_saw_changes(
    tmp_path: Path, edit: str, why: str
) -> None:
    _tree(tmp_path)
    tests = ["tests/unit/test_m.py"]
    stored = _stored(tmp_path, tests)
    (tmp_path / edit).write_text((tmp_path / edit).read_text() + "# edited\n")
    assert tool.staleness(stored, "domain/m.py", tests, tmp_path) == why


def test_a_changed_selection_or_a_cut_run_or_no_digests_do_not_stand(tmp_path: Path) -> None:
    _tree(tmp_path)
    tests = ["tests/unit/test_m.py"]
    stored = _stored(tmp_path, tests)
    wider = [*tests, "-k", "f"]
    assert tool.staleness(stored, "domain/m.py", wider, tmp_path) == "its tests changed since"
    cut = _stored(tmp_path, tests, complete=False)
    assert tool.staleness(cut, "domain/m.py", tests, tmp_path) == "cut short"
    old = {k: v for k, v in stored.items() if k != "fingerprint"}
    assert tool.staleness(old, "domain/m.py", tests, tmp_path) == (
        "run before fingerprints were kept"
    )


def test_a_stored_run_is_judged_again_against_the_equivalents_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missed = {"function": "f", "original": "return 1", "mutant": "return 2", "line": 2}
    stored = {
        "module": "domain/m.py",
        "killed": 3,
        "survivors": [missed],
        "equivalents": [],
        "equivalent": 0,
        "missed": 1,
        "rate": 0.75,
    }
    listed = tmp_path / "equivalent.toml"
    listed.write_text(
        '[[equivalent]]\nmodule = "domain/m.py"\nfunction = "f"\noriginal = "return 1"\n'
        'mutant = "return 2"\nwhy = "no caller reads it"\n'
    )
    monkeypatch.setattr(tool, "EQUIVALENT", listed)
    now = tool.rejudged(stored)
    assert (now["missed"], now["equivalent"], now["rate"]) == (0, 1, 1.0)
    assert now["equivalents"] == [{**missed, "why": "no caller reads it"}]
    listed.write_text("")  # the entry taken out again: the mutant is missed once more
    again = tool.rejudged(now)
    assert (again["missed"], again["equivalent"], again["rate"]) == (1, 0, 0.75)
    assert again["survivors"] == [missed]


def test_one_module_is_run_by_one_run_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one module would wipe each other's working folder: the second is told."""
    monkeypatch.setattr(tool, "BUILD", tmp_path)
    with tool.module_lock("domain/m.py") as first, tool.module_lock("domain/m.py") as second:
        assert (first, second) == (True, False)
        with tool.module_lock("domain/other.py") as another:
            assert another
    with tool.module_lock("domain/m.py") as again:
        assert again


def test_a_resumed_run_leaves_a_module_that_became_current_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--all --stale`` decides each module at its turn, from the runs stored by then."""
    key = "domain/converters.py"
    config = tool.load_config()
    done = {
        "module": key,
        "complete": True,
        "fingerprint": tool.fingerprint(key, tool.tests_for(key, config)),
    }
    results = tmp_path / "results.json"
    results.write_text(json.dumps({key: done}))
    monkeypatch.setattr(tool, "BUILD", tmp_path)
    monkeypatch.setattr(tool, "RESULTS", results)
    assert tool.run_each([key], config, 1, None, resumed=True) == [done]
