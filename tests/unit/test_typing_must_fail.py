"""mypy --strict catches an env author's mistakes: the cases in ``typing_tests/must_fail.py``.

One ``mypy.api.run`` over every case (each in its own file, with the project's mypy settings and
cache) and the control; each case must report its error code in its own file, and the control
must report nothing.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from mypy import api
from typing_tests.must_fail import CASES, CONTROL, PRELUDE

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    folder = tmp_path_factory.mktemp("must_fail")
    # Module names unique to this run: mypy's cache is keyed by module name, and a name it has
    # seen before (at another path, in an earlier run) could be answered from the cache.
    run = uuid.uuid4().hex[:12]
    files = {"control": folder / f"control_{run}.py"}
    files["control"].write_text(PRELUDE + CONTROL)
    for name, (_, body) in CASES.items():
        files[name] = folder / f"{name}_{run}.py"
        files[name].write_text(PRELUDE + body)
    stdout, stderr, _ = api.run(
        ["--config-file", str(ROOT / "pyproject.toml"), *(str(p) for p in files.values())]
    )
    assert not stderr.strip(), stderr
    found: dict[str, list[str]] = {name: [] for name in files}
    for line in stdout.splitlines():
        for name, path in files.items():
            if line.startswith(f"{path}:") and ": error:" in line:
                found[name].append(line)
    return found


def test_the_control_type_checks(reports: dict[str, list[str]]) -> None:
    assert reports["control"] == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_mistake_is_reported_with_its_code(reports: dict[str, list[str]], name: str) -> None:
    code = CASES[name][0]
    codes = [m.group(1) for line in reports[name] if (m := re.search(r"\[([a-z-]+)\]$", line))]
    assert code in codes, reports[name]
