"""``SlotTools.pytest`` on real pools: upload a test tree, run pytest in the slot, read the
outcome (counts, failing ids, the exit's meaning), on the unisolated pool and the local pool."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
from examples.code_fix import SANDBOX_PYTHON, _pytest_env

from trajcore.adapters.fakes.unisolated import UnisolatedSandboxPool
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_protocol import SLOT_TOOLS
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.pytest_outcome import PytestExit
from trajcore.rollout.tools import SlotTools, ToolRouter

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # each pytest run starts a Python


TREE = {
    "calc/__init__.py": "",
    "calc/ops.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "tests/test_ops.py": (
        "import pytest\nfrom calc.ops import add, mul\n\n\n"
        "def test_add():\n    assert add(2, 2) == 4\n\n\n"
        "def test_mul():\n    assert mul(2, 3) == 6\n\n\n"
        "@pytest.mark.parametrize('n', [0, 1])\ndef test_add_twice(n):\n"
        "    assert add(n, n) == 2 * n\n\n\n"
        "@pytest.mark.skip\ndef test_later():\n    pass\n"
    ),
}
FIXED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def unisolated() -> AbstractAsyncContextManager[SandboxPool]:
    return UnisolatedSandboxPool(slots_per_container=1)


def local() -> AbstractAsyncContextManager[SandboxPool]:
    config = LocalPoolConfig(
        containers=1,
        server=SlotServerSettings(
            slots_per_container=1,
            acquire_timeout_s=30.0,
            isolation=SlotIsolation(require_sandbox=True, min_timeout_s=0.5),
        ),
    )
    return LocalSandboxPool(config)


POOLS = [
    pytest.param(unisolated, id="unisolated"),
    pytest.param(
        local,
        id="local",
        marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
    ),
]


@asynccontextmanager
async def slot_tools(
    make: Callable[[], AbstractAsyncContextManager[SandboxPool]],
) -> AsyncIterator[SlotTools]:
    async with (
        make() as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
        pool.lease("t", timeout_s=30.0) as lease,
    ):
        router = ToolRouter(
            lease=lease, dispatcher=dispatcher, tool_server=None,
            offered=frozenset(SLOT_TOOLS), tool_timeout_s=120.0, trajectory_id="t",
        )  # fmt: skip
        yield SlotTools(router)


@pytest.mark.parametrize("make", POOLS)
async def test_pytest_in_the_slot_reads_counts_failing_ids_and_the_verdict(
    make: Callable[[], AbstractAsyncContextManager[SandboxPool]],
) -> None:
    async with slot_tools(make) as tools:
        python = await _pytest_env(tools)  # a Python that imports pytest in the slot
        broken = await tools.pytest(TREE, python=python)
        assert broken.exit is PytestExit.TESTS_FAILED
        assert broken.exit_code == 1
        assert (broken.passed, broken.failed, broken.skipped) == (2, 2, 1)
        assert broken.failing == (
            "tests/test_ops.py::test_add",
            "tests/test_ops.py::test_add_twice[1]",
        )
        assert not broken.passed_all
        await tools.write_file("calc/ops.py", FIXED)
        fixed = await tools.pytest(python=python, args=["tests", "-k", "add or mul or later"])
        assert fixed.exit is PytestExit.PASSED
        assert (fixed.passed, fixed.failed, fixed.skipped) == (4, 0, 1)
        assert fixed.passed_all


@pytest.mark.parametrize("make", POOLS)
async def test_pytest_in_the_slot_tells_errors_nothing_and_no_pytest(
    make: Callable[[], AbstractAsyncContextManager[SandboxPool]],
) -> None:
    async with slot_tools(make) as tools:
        python = await _pytest_env(tools)
        collection = await tools.pytest({"t/test_x.py": "import nope\n"}, python=python, args=["t"])
        assert collection.exit is PytestExit.INTERRUPTED
        assert collection.failing == ("t/test_x.py",)
        assert collection.errors == 1
        empty = await tools.pytest({"e/README": "none"}, python=python, args=["e"])
        assert empty.exit is PytestExit.NO_TESTS
        assert not empty.passed_all
        missing = await tools.pytest(
            python=f"{SANDBOX_PYTHON} -I -S"
        )  # no site-packages: no pytest
        assert missing.exit is PytestExit.NOT_RUN
        assert "pytest" in missing.output
        inside = await tools.pytest(
            {"sub/test_y.py": "def test_y():\n    pass\n"}, python=python, cwd="sub"
        )
        assert inside.passed_all


@pytest.mark.parametrize("make", POOLS)
async def test_pytest_in_the_slot_reads_bytecode_from_a_fresh_folder_it_removes_after(
    make: Callable[[], AbstractAsyncContextManager[SandboxPool]],
) -> None:
    """On the unisolated pool the slot's /tmp is the host's: the run leaves nothing there."""
    async with slot_tools(make) as tools:
        python = await _pytest_env(tools)
        # the Python that runs pytest first notes the bytecode folder it was given
        noting = 'sh -c \'printf %s "$PYTHONPYCACHEPREFIX" > prefix.txt; exec "$0" "$@"\''
        ran = await tools.pytest(
            {"p/test_p.py": "def test_p():\n    pass\n"},
            python=f"{noting} env {python}",
            args=["p"],
        )
        assert ran.passed_all, ran.output
        folder = await tools.read_file("prefix.txt")
        assert folder.startswith("/"), folder
        assert not await tools.check(f"test -e {folder}")  # removed after the run
        failed = await tools.pytest(
            {"p/test_p.py": "def test_p():\n    assert False\n"},
            python=f"{noting} env {python}",
            args=["p"],
        )
        assert failed.exit is PytestExit.TESTS_FAILED  # pytest's own status still comes back
        assert failed.exit_code == 1
        assert not await tools.check(f"test -e {await tools.read_file('prefix.txt')}")
