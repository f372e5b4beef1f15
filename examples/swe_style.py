"""SWE-style tasks: each item is a repository with a failing test, shipped as its own image.

The repositories live under ``examples/swe_style/<name>/repo``; each has a ``Containerfile``
beside it that installs the repository's dependencies (Debian's packages) and pytest into an
image and puts the repository at ``/repo``. ``./dev images`` builds them into podman's store
as ``localhost/trajcore-swe-<name>:latest``, labelled with the digest of the task's folder
(``source_digest``), so a test can tell a stale image from a current one (``image_problem``).

- ``task_environment(item)`` names the item's image (``containers-storage:...``): the pool
  leases the slot over it, so the trajectory's commands run the image's Python, pytest and
  dependencies, with the slot's workspace at ``/workspace``.
- ``prepare_workspace`` copies ``/repo`` into the workspace, and the repository is edited
  there, as a clone would be. A lease owns the image's files where the slot server makes
  idmapped clones of the image (a server run as root, on a kernel and file system that allow
  them): it may edit ``/repo`` in place, each change landing in its own layer, never in the
  cache. Elsewhere they stay the cache owner's and are read-only to the lease
  (``docs/environments.md``, "What a lease over an image can and cannot do"); the copy works
  on both.
- ``verify_and_score`` puts the repository's tests back as the image ships them (a model that
  edited them gains nothing) and runs them with the image's pytest in the same slot. The score
  is 1.0 when every test passes, else 0.0, with pytest's counts and failing ids as metadata.

An item names its image; the slot server materializes it once per host into its image cache
(``docs/environments.md``), so the pool must run with an image cache. Without one the lease is
refused and the group fails as infrastructure, never as a 0.

Run it as any Atropos env, ``python examples/swe_style.py serve|process|evaluate ...``, after
``./dev images``; offline, ``solve`` plays a model that runs the tests, writes the fix and
stops. ``python examples/swe_style.py source-digest NAME`` prints the digest ``./dev images``
labels task NAME's image with.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import sys
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

__all__ = [
    "IMAGE_LABEL",
    "SOLUTIONS",
    "TASKS",
    "TASKS_DIR",
    "SweStyleEnv",
    "SweTask",
    "image_problem",
    "solve",
    "source_digest",
]

TASKS_DIR = Path(__file__).resolve().parent / "swe_style"
"""The tasks' folders: ``<name>/Containerfile`` and ``<name>/repo``."""

IMAGE_LABEL = "trajcore.source"
"""The label ``./dev images`` gives each image: ``source_digest`` of the task's folder."""

SYSTEM_PROMPT = (
    "You fix bugs in Python repositories. The workspace holds the repository; run its tests "
    "with `python3 -m pytest -q tests`, fix the code (not the tests), and reply without a tool "
    "call when the tests pass."
)


@attrs.frozen(kw_only=True)
class SweTask:
    """One repository with a failing test, and the image that ships it.

    Attributes:
        name: The task's folder under ``TASKS_DIR`` (and its image's name).
        prompt: What the model is told.
        image: The image's reference (``containers-storage:localhost/trajcore-swe-NAME:latest``).
        repo: Where the repository lies in the image.
        tests: The repository's test folder, relative to its root.
    """

    name: str
    prompt: str
    image: str
    repo: str = "/repo"
    tests: str = "tests"

    @property
    def image_name(self) -> str:
        """The image's name in the engine's store (the reference without its transport)."""
        return self.image.split(":", 1)[1]


def _task(name: str, prompt: str) -> SweTask:
    return SweTask(
        name=name, prompt=prompt, image=f"containers-storage:localhost/trajcore-swe-{name}:latest"
    )


TASKS: tuple[SweTask, ...] = (
    _task(
        "inventory",
        "The inventory repository's tests fail: a second delivery of an SKU already in stock "
        "loses units. Fix the package so that `python3 -m pytest -q tests` passes.",
    ),
    _task(
        "versions",
        "The versions repository picks the wrong release when versions have two-digit parts "
        "(1.10 against 1.9). Fix the package so that `python3 -m pytest -q tests` passes.",
    ),
)

SOLUTIONS: Mapping[str, ToolCall] = {
    "inventory": ToolCall(
        id="pending",
        name="bash",
        arguments={
            "command": "sed -i 's/attrs.evolve(held, unit_cents=unit_cents)/attrs.evolve("
            "held, unit_cents=unit_cents, quantity=held.quantity + quantity)/' "
            "inventory/stock.py"
        },
    ),
    "versions": ToolCall(
        id="pending",
        name="bash",
        arguments={
            "command": "sed -i 's/return max(candidates)/return max(candidates, key=Version)/' "
            "versions/pick.py"
        },
    ),
}
"""Each task's fix, as the tool call a model would make."""


def solve(messages: Sequence[Message]) -> ScriptStep:
    """The next step for the bundled task in ``messages``: run the tests, apply the fix, run
    the tests again, then "Done."."""
    text = "\n".join(m.content for m in messages if m.role == "user")
    task = next((t for t in TASKS if t.prompt in text), None)
    if task is None:
        return "I do not know this task."
    run_tests = ToolCall(
        id="pending", name="bash", arguments={"command": "python3 -m pytest -q tests"}
    )
    steps = (run_tests, SOLUTIONS[task.name], run_tests)
    turn = sum(1 for m in messages if m.role == "assistant")
    return steps[turn] if turn < len(steps) else "Done."


class SweStyleEnv(AgentEnv[SweTask]):
    """The bundled repositories, round and round, each in its own image; scored by its tests."""

    name = "swe_style"
    _next: int = 0

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        config, servers = super().config_init()
        config.tokenizer_name = str(qwen3_tokenizer_path())  # shipped: no download
        config.use_wandb = False
        return config, servers

    async def get_next_item(self) -> SweTask:
        self._next += 1
        return TASKS[(self._next - 1) % len(TASKS)]

    def build_task(self, item: SweTask) -> list[Message]:
        return [Message.system(SYSTEM_PROMPT), Message.user(item.prompt)]

    def task_environment(self, item: SweTask) -> str | None:
        """The item's image: every member's lease runs over it."""
        return item.image

    async def prepare_workspace(self, item: SweTask, tools: SlotTools) -> JSONObject:
        """Copy the repository out of the image into the workspace (writable, the slot's own).

        Raises:
            SlotInfraError: the slot cannot copy it (the lease is not over the item's image).
        """
        repo = shlex.quote(item.repo)
        copied = await tools.run(f"cp -R {repo}/. . && chmod -R u+w . && find . -type f | wc -l")
        if copied.exit_code != 0:
            raise SlotInfraError(
                f"cannot copy {item.repo} out of {item.image} (is the lease over it?): "
                f"{copied.stderr.strip()[-500:]}"
            )
        return {"image": item.image, "files": int(copied.stdout.split()[-1])}

    async def verify_and_score(
        self, item: SweTask, tools: SlotTools, messages: Sequence[Message]
    ) -> tuple[float, JSONObject]:
        # The tests as the image ships them, whatever the model did to them; then the image's
        # pytest in the same slot. pytest raises SlotInfraError when the slot cannot run it.
        tests = shlex.quote(item.tests)
        source = shlex.quote(f"{item.repo}/{item.tests}")
        restored = await tools.run(f"rm -rf {tests} && cp -R {source} {tests}")
        if restored.exit_code != 0:
            raise SlotInfraError(
                f"cannot restore {item.tests} from {item.image}: {restored.stderr.strip()[-500:]}"
            )
        outcome = await tools.pytest(args=[item.tests], python="python3")
        metadata: JSONObject = {
            "pytest": outcome.exit.value,
            "passed": outcome.passed,
            "failed": outcome.failed,
            "errors": outcome.errors,
            "failing": list(outcome.failing),
        }
        return (1.0 if outcome.passed_all else 0.0), metadata

    async def eval_items(self) -> Sequence[SweTask]:
        return TASKS


def source_digest(name: str) -> str:
    """sha256 over the paths and bytes of task ``name``'s folder (caches excluded), in path
    order: the label ``./dev images`` gives its image."""
    folder = TASKS_DIR / name
    digest = hashlib.sha256()
    files = (
        p
        for p in folder.rglob("*")
        if p.is_file()
        and not any(part.startswith((".", "__pycache__")) for part in p.relative_to(folder).parts)
    )
    for path in sorted(files):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def image_problem(task: SweTask) -> str | None:
    """Why ``task``'s image cannot be used here (``None``: podman's store holds it, built from
    this tree's folder)."""
    if shutil.which("podman") is None:
        return "podman is not installed (./dev images builds the tasks' images with it)"
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", '{{index .Labels "' + IMAGE_LABEL + '"}}',
         task.image_name],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return f"no image {task.image_name}: ./dev images builds it"
    if done.stdout.strip() != source_digest(task.name):
        return f"the image {task.image_name} was built from another tree: ./dev images rebuilds it"
    return None


if __name__ == "__main__":
    if sys.argv[1:2] == ["source-digest"] and len(sys.argv) == 3:
        sys.stdout.write(source_digest(sys.argv[2]) + "\n")
    else:
        SweStyleEnv.cli()
