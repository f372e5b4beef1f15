"""The staged Python a root server's sandboxes bind carries its compiled caches, checked from the
host: pytest's rewritten plugin modules (a slot cannot write them into the read-only staging,
so without them every pytest run in a slot rewrites its plugins) and the plain ``.pyc``; the
staging writes them into its own tree only, naming the paths a slot sees."""

from __future__ import annotations

import json
import marshal
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.slot_server.slot_ids import (
    CACHES_NOTE,
    shared_python,
    stage_caches,
    stage_python,
)
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings

pytestmark = [
    pytest.mark.slow,  # a staging links the whole library and runs pytest once
    pytest.mark.skipif(os.geteuid() != 0, reason="only a root server stages its Python"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
]

PYTHON = Path(os.path.realpath(sys.executable))
PREFIX = Path(os.path.realpath(sys.base_prefix))

# Run by the staged installation's own interpreter (-B: it writes nothing on the host): its
# pytest's cache tag and the source file of each plugin it loads by entry point.
_PLUGINS = """
import importlib.util, json, sys
from importlib.metadata import entry_points
import pytest
files = [importlib.util.find_spec(e.value.split(":")[0]).origin
         for e in entry_points(group="pytest11")]
print(json.dumps({"tag": f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}",
                  "files": files}))
"""


def plugins() -> tuple[str, list[Path]]:
    """The pytest tag of the interpreter at ``PREFIX`` and its entry-point plugin files."""
    python = PREFIX / PYTHON.relative_to(PREFIX)
    done = subprocess.run(
        [str(python), "-B", "-s", "-E", "-c", _PLUGINS],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"the staged interpreter has no pytest: {done.stderr.strip()[-200:]}")
    found = json.loads(done.stdout)
    if not found["files"]:
        pytest.skip("the staged interpreter's pytest has no entry-point plugins")
    return found["tag"], [Path(f) for f in found["files"]]


def rewritten(staged: Path, source: Path, tag: str) -> Path:
    """Where pytest caches its rewritten ``source`` in the staging ``staged``."""
    relative = source.relative_to(PREFIX)
    return staged / relative.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"


@pytest.fixture
def building() -> Iterator[Path]:
    """A private folder on the installation's file system (hard links need one)."""
    folder = Path(tempfile.mkdtemp(prefix="staging-test-", dir="/var/tmp"))
    try:
        yield folder / "python"
    finally:
        shutil.rmtree(folder)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_slots_staged_library_holds_pytests_rewritten_plugins(
    anyio_backend: str,
) -> None:
    if not PYTHON.is_relative_to(PREFIX):
        pytest.skip(f"{PYTHON} is not the installation at {PREFIX}")
    tag, files = plugins()
    config = LocalPoolConfig(
        containers=1,
        server=SlotServerSettings(
            slots_per_container=1, acquire_timeout_s=60.0, start_timeout_s=120.0,
            isolation=SlotIsolation(require_sandbox=True),
        ),
    )  # fmt: skip
    async with LocalSandboxPool(config) as pool, pool.lease("t", timeout_s=60.0):
        staged = shared_python(PREFIX, PYTHON)  # the staging the server made: it exists
    note = json.loads((staged / CACHES_NOTE).read_text())
    assert note["error"] is None, note
    assert note["pytest_exit"] == 0, note
    for source in files:
        cached = rewritten(staged, source, tag)
        assert cached.is_file(), f"{cached} is missing: every slot's pytest rewrites {source}"
        assert cached.stat().st_mode & 0o004, f"{cached} is not world-readable"
        assert cached.stat().st_uid == 0
    plain = staged / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert (
        plain / "json" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    ).is_file()


def test_a_staging_makes_the_caches_in_its_own_tree_naming_the_slots_paths(
    building: Path,
) -> None:
    if not PYTHON.is_relative_to(PREFIX):
        pytest.skip(f"{PYTHON} is not the installation at {PREFIX}")
    tag, files = plugins()
    stage_python(PREFIX, PYTHON, building, copy=False)
    # What the host had cached goes, so only the staging's own run can bring it back.
    for link in building.rglob(f"*.{tag}.pyc"):
        link.unlink()
    library = f"lib/python{sys.version_info.major}.{sys.version_info.minor}"
    plain = (
        building / library / "json" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    )
    plain.unlink()
    host = [rewritten(PREFIX, f, tag) for f in files] + [PREFIX / plain.relative_to(building)]
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in host if p.exists()}
    assert not any(rewritten(building, f, tag).exists() for f in files)  # the control

    note = stage_caches(PREFIX, PYTHON, building)

    assert note["error"] is None, note
    assert note["pytest_exit"] == 0, note
    assert plain.is_file()
    for source in files:
        cached = rewritten(building, source, tag)
        assert cached.is_file(), f"{cached} was not made"
        code = marshal.loads(cached.read_bytes()[16:])
        assert code.co_filename == str(source)  # the path a slot sees, not the staging's
    after = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in host if p.exists()}
    assert after == before  # nothing written on the host's installation
