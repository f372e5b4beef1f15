"""Code fixing: a small buggy Python module and its tests; the score is whether pytest passes.

``CodeFixEnv.prepare_workspace`` writes the module and its tests into the slot's workspace.
``verify_and_score`` runs ``SlotTools.pytest``: it writes the tests again (so a model that edited
them gains nothing), runs pytest in the same slot and reads its outcome; the score is 1.0 when
every test passes, else 0.0, with pytest's counts and the failing test ids as the score's
metadata (the report shows them).

Which Python runs the tests: the interpreter that runs the slot servers' exec agents, which the
sandbox always binds read-only (``SANDBOX_PYTHON``, under the local pool's default settings). A
virtual environment's own ``site-packages`` is not visible in the sandbox, so when that
interpreter cannot import pytest, ``verify_and_score`` ships this process's pytest (pure Python:
pytest and its few dependencies) into the workspace as one archive and puts it on
``PYTHONPATH``. Either way the tests run inside the sandbox, never on the host.

Run it as any Atropos env: ``python examples/code_fix.py serve|process|evaluate ...``; offline,
with ``solve`` (the model as a script: the fix, then "Done.") in place of a model:
``trajcore run examples/code_fix.py:CodeFixEnv --policy solve --groups 2``.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import io
import os
import sys
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.env import (
    AgentEnv,
    AgentEnvConfig,
    JSONObject,
    Message,
    SlotInfraError,
    SlotTools,
    ToolCall,
)
from trajcore.rollout.scripted import ScriptStep

__all__ = ["SANDBOX_PYTHON", "SOLUTIONS", "TASKS", "CodeFixEnv", "CodeTask", "solve"]

SANDBOX_PYTHON = os.path.realpath(sys.executable)
"""The interpreter the local pool's sandboxes run (and bind read-only): this one, resolved."""

SYSTEM_PROMPT = (
    "You fix Python code. The workspace holds a module and its tests; run them with "
    "`python3 -m pytest -q`, fix the module (not the tests), and reply without a tool call when "
    "the tests pass."
)


@attrs.frozen(kw_only=True)
class CodeTask:
    """A buggy ``module`` (file name to source) and the ``tests`` that catch the bug."""

    name: str
    prompt: str
    module: Mapping[str, str]
    tests: Mapping[str, str]


TASKS: tuple[CodeTask, ...] = (
    CodeTask(
        name="fizzbuzz",
        prompt="fizzbuzz.py fails its tests in test_fizzbuzz.py. Fix fizzbuzz.py.",
        module={
            "fizzbuzz.py": "def fizzbuzz(n: int) -> str:\n"
            "    if n % 3 == 0:\n        return 'Fizz'\n"
            "    if n % 5 == 0:\n        return 'Buzz'\n"
            "    if n % 15 == 0:\n        return 'FizzBuzz'\n"
            "    return str(n)\n"
        },
        tests={
            "test_fizzbuzz.py": "from fizzbuzz import fizzbuzz\n\n\n"
            "def test_numbers() -> None:\n"
            "    assert [fizzbuzz(i) for i in (1, 3, 5, 15, 30)] == "
            "['1', 'Fizz', 'Buzz', 'FizzBuzz', 'FizzBuzz']\n"
        },
    ),
    CodeTask(
        name="median",
        prompt="median.py gives wrong answers for some inputs (see test_median.py). Fix it.",
        module={
            "median.py": "def median(values: list[float]) -> float:\n"
            "    ordered = sorted(values)\n"
            "    return ordered[len(ordered) // 2]\n"
        },
        tests={
            "test_median.py": "from median import median\n\n\n"
            "def test_odd() -> None:\n    assert median([3, 1, 2]) == 2\n\n\n"
            "def test_even() -> None:\n    assert median([4, 1, 3, 2]) == 2.5\n"
        },
    ),
)

SOLUTIONS: Mapping[str, tuple[ToolCall, ...]] = {
    "fizzbuzz": (
        ToolCall(
            id="pending",
            name="write_file",
            arguments={
                "path": "fizzbuzz.py",
                "content": "def fizzbuzz(n: int) -> str:\n"
                "    if n % 15 == 0:\n        return 'FizzBuzz'\n"
                "    if n % 3 == 0:\n        return 'Fizz'\n"
                "    if n % 5 == 0:\n        return 'Buzz'\n"
                "    return str(n)\n",
            },
        ),
    ),
    "median": (
        ToolCall(
            id="pending",
            name="write_file",
            arguments={
                "path": "median.py",
                "content": "def median(values: list[float]) -> float:\n"
                "    ordered = sorted(values)\n    middle = len(ordered) // 2\n"
                "    if len(ordered) % 2:\n        return ordered[middle]\n"
                "    return (ordered[middle - 1] + ordered[middle]) / 2\n",
            },
        ),
    ),
}


def solve(messages: Sequence[Message]) -> ScriptStep:
    """The next step for the bundled task in ``messages``: run the tests, write the fix, run
    them again, then "Done."."""
    text = "\n".join(m.content for m in messages if m.role == "user")
    task = next((t for t in TASKS if t.prompt in text), None)
    if task is None:
        return "I do not know this task."
    run_tests = ToolCall(
        id="pending", name="bash", arguments={"command": f"ls; cat {' '.join(task.tests)}"}
    )
    steps = (run_tests, *SOLUTIONS[task.name])
    turn = sum(1 for m in messages if m.role == "assistant")
    return steps[turn] if turn < len(steps) else "Done."


class CodeFixEnv(AgentEnv[CodeTask]):
    """The bundled tasks, round and round; scored by pytest in the slot."""

    name = "code_fix"
    _next: int = 0

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        config, servers = super().config_init()
        config.tokenizer_name = str(qwen3_tokenizer_path())  # shipped: no download
        config.use_wandb = False
        return config, servers

    async def get_next_item(self) -> CodeTask:
        self._next += 1
        return TASKS[(self._next - 1) % len(TASKS)]

    def build_task(self, item: CodeTask) -> list[Message]:
        return [Message.system(SYSTEM_PROMPT), Message.user(item.prompt)]

    async def prepare_workspace(self, item: CodeTask, tools: SlotTools) -> None:
        await tools.upload({**item.module, **item.tests})

    async def verify_and_score(
        self, item: CodeTask, tools: SlotTools, messages: Sequence[Message]
    ) -> tuple[float, JSONObject]:
        # The tests as shipped, whatever the model did to them, then pytest in the same slot.
        # pytest raises SlotInfraError when the slot cannot run it: a failure, never a 0. Once
        # _pytest_env found pytest, a run that never reports (a conftest the model wrote that
        # exits, a pytest.py shadowing it) is the model's doing: not passed_all, so 0.
        outcome = await tools.pytest(
            item.tests, args=sorted(item.tests), python=await _pytest_env(tools)
        )
        metadata: JSONObject = {
            "pytest": outcome.exit.value,
            "passed": outcome.passed,
            "failed": outcome.failed,
            "errors": outcome.errors,
            "failing": list(outcome.failing),
        }
        return (1.0 if outcome.passed_all else 0.0), metadata

    async def eval_items(self) -> Sequence[CodeTask]:
        return TASKS


async def _pytest_env(tools: SlotTools) -> str:
    """How to call a Python that can import pytest in the slot (shipping pytest if need be).

    Raises:
        SlotInfraError: the slot could not run the commands, or pytest could not be unpacked
            in the sandbox (the env's environment, not the model's work, is at fault).
    """
    if await tools.check(f"{SANDBOX_PYTHON} -c 'import pytest'"):
        return SANDBOX_PYTHON
    await tools.write_file(".verify/pytest.b64", _pytest_archive())
    unpacked = await tools.run("cd .verify && base64 -d pytest.b64 | tar xzf -")
    if unpacked.exit_code != 0:
        raise SlotInfraError(f"cannot unpack pytest in the sandbox: {unpacked.stderr}")
    return f"PYTHONPATH=.verify {SANDBOX_PYTHON}"


@functools.cache
def _pytest_archive() -> str:
    """This process's pytest and its pure-Python dependencies, as base64 of a ``.tar.gz``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py"):
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin is None:
                continue
            origin = Path(spec.origin)
            source = origin.parent if origin.name == "__init__.py" else origin
            tar.add(source, arcname=source.name, filter=_no_bytecode)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _no_bytecode(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name else info


if __name__ == "__main__":
    CodeFixEnv.cli()
