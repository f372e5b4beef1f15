"""The layer rules hold for the package, and the checker really catches violations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.layer_rules import check_layers

SRC = Path(__file__).resolve().parents[2] / "src"


def test_package_keeps_the_layer_rules() -> None:
    violations = check_layers(SRC)
    assert violations == [], "\n".join(map(str, violations))


MAX_MODULE_LINES = 700


def test_every_module_holds_one_concept_within_the_size_bound() -> None:
    """A module past the bound has grown a second concept: split it by concept."""
    sizes = {
        str(path.relative_to(SRC)): len(path.read_text(encoding="utf-8").splitlines())
        for path in SRC.rglob("*.py")
    }
    assert len(sizes) > 100  # the walk found the package
    over = {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert over == {}, f"modules over {MAX_MODULE_LINES} lines: {over}"


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for layer in ("domain", "ports", "rollout", "adapters"):
        (tmp_path / "pkg" / layer).mkdir(parents=True, exist_ok=True)
    return tmp_path


def test_checker_rejects_a_clock_in_the_domain(tmp_path: Path) -> None:
    src = _package(tmp_path, {"domain/planner.py": "import time\nfrom attrs import frozen\n"})
    [violation] = check_layers(src, root="pkg")
    assert violation.module == "time"
    assert violation.line == 1


def test_checker_rejects_the_domain_importing_an_adapter(tmp_path: Path) -> None:
    src = _package(tmp_path, {"domain/x.py": "from pkg.adapters.local import Pool\n"})
    [violation] = check_layers(src, root="pkg")
    assert "domain may not import adapters" in violation.reason


def test_checker_rejects_relative_escapes_and_third_party(tmp_path: Path) -> None:
    src = _package(
        tmp_path,
        {
            "ports/a.py": "from ..rollout import run\n",
            "rollout/b.py": "import httpx\nimport asyncio\nimport anyio\n",
            "adapters/c.py": "from pkg.entrypoints import cli\nimport httpx\n",
        },
    )
    found = {(v.path.name, v.module) for v in check_layers(src, root="pkg")}
    assert found == {
        ("a.py", "pkg.rollout"),
        ("b.py", "httpx"),
        ("b.py", "asyncio"),
        ("c.py", "pkg.entrypoints"),
    }


def test_importing_the_domain_loads_no_heavy_or_io_library() -> None:
    code = (
        "import sys, trajcore.domain.messages, trajcore.domain.slots, trajcore.domain.sampling\n"
        "import pkgutil, importlib, trajcore.domain as d\n"
        "for m in pkgutil.walk_packages(d.__path__, 'trajcore.domain.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'atroposlib','transformers','httpx','aiohttp','anyio','cattrs','torch','nomad','asyncio'})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
