"""``trajcore demo``: the shell-tasks env in Atropos's process mode on the local pool, reported.

    trajcore demo [--out DIR] [--base-url URL] [--model NAME] [--api-key-env VAR]
                  [--model-wait-s SECONDS] [--groups N] [--group-size N] [--plain]

What it runs: ``ShellTasksEnv`` from the repository's ``examples/shell_tasks.py`` (so it runs
from a checkout, ``./dev demo``; an installed wheel has no ``examples/`` and says so), driven
through ``AgentEnv.process_manager``, the very code path of ``python examples/shell_tasks.py
process`` (Atropos's loop: get an item, collect a group, write it to Atropos's JSONL, and
Atropos's own HTML page at the end). The sandbox is the embedded default: a
``LocalSandboxPool`` of slot servers on this machine (bubblewrap when it works here; without it
commands run unsandboxed and the demo says so). wandb is off and nothing is sent to a trainer.

The model: with ``--base-url`` (or ``OPENAI_BASE_URL``) the env talks to that OpenAI-compatible
endpoint (OpenAI mode; ``--model``, the API key read from the variable ``--api-key-env``), once
it answers a one-token chat request: the demo waits at most ``--model-wait-s`` (10 s) for it,
then stops naming the URL and what came back. With
neither, it says so and uses ``ScriptedSolver``, a chat server that plays back tool calls which
solve the bundled tasks, so the whole pipeline runs offline. The tokenizer that re-renders
training tokens is Qwen3's, shipped with the locked dependencies (no download); OpenAI-mode tokens
are marked not token-exact either way.

What it writes into ``--out`` (default ``./out/demo``):

- ``trajectories.jsonl``: one line per trajectory (``trajcore.entrypoints.report``);
- ``report.html``: the summary table and every conversation, self-contained;
- ``atropos_groups.jsonl`` and ``atropos_groups.html``: what Atropos's process mode writes.

A progress bar runs on standard error and the summary table is printed at the end, both drawn
by ``rich`` when it is installed (``--plain``: plain text either way). ``trajectories.jsonl``
grows group by group (whole lines only); the report comes at the end. SIGINT or SIGTERM stops it
with the pool closed and writes what was done (a second signal stops it at once, keeping the
groups already in ``trajectories.jsonl``: ``trajcore.entrypoints.signals``); a demo stopped
before its groups are sent, by a signal or an error, says so under the table and in the report's
title, with how many of the groups asked for were sent (``trajcore.entrypoints.run.RunEnd``,
as ``trajcore run`` says it). Process mode
retries a group that is not sent (say, every member failed); the demo stops with an error after
``2 * groups + 2`` groups (or after ``max_failed_groups`` failed groups in a row) rather than
retry forever; an error ends it with its message and status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import os
import sys
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import attrs

from trajcore.adapters.llm.chat import OpenAIChatServer
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.errors import ConfigError, StateError, TrajcoreError
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.entrypoints.atropos.failing_groups import GroupsFailing
from trajcore.entrypoints.atropos.services import RolloutServices
from trajcore.entrypoints.report import (
    JsonLines,
    ProgressBar,
    ran_unsandboxed,
    summary_table,
    write_html,
)
from trajcore.entrypoints.run import RunEnd, wait_for_endpoint
from trajcore.entrypoints.signals import Interrupted, closing_on_signals, exit_status
from trajcore.ports.chat_server import ChatServer
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.ports.tool_server import ToolServer
from trajcore.rollout.group import GroupResult
from trajcore.rollout.policy import Policy

__all__ = ["main"]

_EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _shell_tasks() -> ModuleType:
    """The repository's ``examples/shell_tasks.py``, imported by path.

    Raises:
        ConfigError: this trajcore is not a checkout with ``examples/`` (field ``examples``).
    """
    path = _EXAMPLES / "shell_tasks.py"
    if not path.is_file():
        raise ConfigError(
            "examples",
            f"the demo runs the repository's examples/shell_tasks.py, not found at {path} (an "
            "installed trajcore has no examples/): run it from a checkout: ./dev demo",
        )
    name = "trajcore_demo_shell_tasks"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="trajcore demo",
        description="Run the shell-tasks env in process mode on the local pool; write a report.",
    )
    parser.add_argument("--out", type=Path, default=Path("out/demo"), help="output directory")
    parser.add_argument("--base-url", help="OpenAI-compatible API root (default: OPENAI_BASE_URL)")
    parser.add_argument("--model", default="default", help="model name sent with each request")
    parser.add_argument(
        "--model-wait-s",
        type=float,
        default=10.0,
        help="longest wait for the endpoint to answer before the first group (default 10)",
    )
    parser.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", help="variable holding the API key"
    )
    parser.add_argument("--groups", type=int, default=0, help="groups (default: one per task)")
    parser.add_argument("--group-size", type=int, default=2, help="trajectories per group")
    parser.add_argument(
        "--plain", action="store_true", help="draw progress and the table as plain text"
    )
    args = parser.parse_args(list(argv))
    if args.groups < 0:
        parser.error("--groups must be >= 0")
    if args.group_size < 1:
        parser.error("--group-size must be >= 1")
    if not args.model_wait_s > 0:
        parser.error("--model-wait-s must be > 0")
    return args


@attrs.define
class _Run:
    """What the demo env reports back: judged groups (relabelled by task) and progress."""

    progress: ProgressBar
    limit: int
    trajectories: JsonLines
    groups: list[GroupResult] = attrs.field(factory=list)
    tasks: dict[str, str] = attrs.field(factory=dict)
    attempts: int = 0


def _demo_env(shell_tasks: ModuleType, chat: ChatServer, run: _Run) -> type[AgentEnv[Any]]:
    base: type[AgentEnv[Any]] = shell_tasks.ShellTasksEnv

    class DemoEnv(base):  # type: ignore[valid-type,misc]  # a class loaded from examples/
        name = "shell_tasks_demo"

        def make_chat_server(self) -> ChatServer:
            return chat

        def rollout_services(
            self,
            *,
            policy: Policy | None = None,
            pool: SandboxPool | None = None,
            tool_server: ToolServer | None = None,
        ) -> AbstractAsyncContextManager[RolloutServices]:
            # The demo's model is its own chat server, not Atropos's servers: passed in as the
            # policy, so no stall check reads those unused servers' timeout (and warns about
            # --openai.timeout, a flag the demo does not have). ``_process`` closes it.
            given = policy if policy is not None else self.make_policy(chat=chat)
            services: AbstractAsyncContextManager[RolloutServices] = super().rollout_services(
                policy=given, pool=pool, tool_server=tool_server
            )
            return services

        async def run_group(
            self, item: Any, *, group_size: int | None = None, for_eval: bool = False
        ) -> GroupResult:
            run.attempts += 1
            if run.attempts > run.limit:
                raise StateError(
                    f"{run.limit} groups ran and too few were sent; see the log for why"
                )
            result: GroupResult = await super().run_group(
                item, group_size=group_size, for_eval=for_eval
            )
            label = f"{len(run.groups) + 1:02d}-{item.name}"
            run.groups.append(attrs.evolve(result, group_id=label))
            run.trajectories.append_group(run.groups[-1])
            run.tasks[label] = f"{item.name}: {item.prompt}"
            scores = [m.outcome.score for m in result.members]
            run.progress.advance(f"{item.name} scores {scores}")
            return result

    return DemoEnv


async def _process(
    env: AgentEnv[Any], chat: ChatServer, args: argparse.Namespace, base_url: str | None
) -> None:
    try:
        if base_url:
            await wait_for_endpoint(
                base_url,
                model=args.model,
                api_key=os.environ.get(args.api_key_env),
                wait_s=args.model_wait_s,
            )
        await env.process_manager()
    finally:
        with anyio.move_on_after(10.0, shield=True):
            await chat.aclose()


def _report(
    run: _Run, out: Path, end: RunEnd, *, mode: str, groups: int, args: argparse.Namespace
) -> None:
    run.trajectories.close()
    written = run.trajectories.lines
    notes = [f"policy: {mode}", f"{groups} groups of {args.group_size}, Atropos process mode"]
    write_html(
        run.groups,
        out / "report.html",
        title=end.title("trajcore demo: shell tasks"),
        notes=[*notes, *end.notes()],
        tasks=run.tasks,
    )
    print(summary_table(run.groups, plain=args.plain))
    if (line := end.line()) is not None:
        print(line)
    if ran_unsandboxed(run.groups):
        print("note: bubblewrap is unusable here, so commands ran without a sandbox")
    print(f"wrote {written} trajectories to {out / 'trajectories.jsonl'}")
    print(f"report: {out / 'report.html'}   Atropos's own: {out / 'atropos_groups.jsonl'}")


def _close_groups_file(env: AgentEnv[Any]) -> None:
    """Close Atropos's groups file: it is opened when the env is built and closed only by a
    process run that reaches its end (closing twice is a no-op)."""
    writer = getattr(env, "jsonl_writer", None)
    if writer is not None:
        writer.close()


def _process_to_end(
    env: AgentEnv[Any],
    chat: ChatServer,
    args: argparse.Namespace,
    base_url: str | None,
    run: _Run,
    *,
    groups: int,
) -> tuple[int, RunEnd]:
    """Run process mode; returns the exit status (see ``main``) and how the demo ended."""
    status = 0
    cause: BaseException | None = None
    try:
        anyio.run(_process, env, chat, args, base_url, backend="asyncio")
    except (TrajcoreError, GroupsFailing) as exc:
        run.progress.close()
        print(f"\ntrajcore demo: {type(exc).__name__}: {exc}", file=sys.stderr)
        status, cause = 1, exc
    except Interrupted as stop:  # the pool is closed: report what was done
        run.progress.close()
        print(f"\ntrajcore demo: stopped by {stop}", file=sys.stderr)
        status, cause = exit_status(stop.signum), stop
    finally:
        run.progress.close()
        run.trajectories.close()
        _close_groups_file(env)
    # The groups done are those process mode sent (it runs a group again when not).
    return status, RunEnd.of(cause, asked=groups, done=env.curr_step)


def main(argv: Sequence[str]) -> int:
    """Run the demo; returns the exit status (0 when every group ran and the report is written)."""
    args = _arguments(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in ("atroposlib", "atroposlib.envs.base"):  # their per-group INFO lines
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        shell_tasks = _shell_tasks()
    except ConfigError as exc:
        print(f"trajcore demo: {exc}", file=sys.stderr)
        return 2
    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    chat: ChatServer
    if base_url:
        chat = OpenAIChatServer(
            base_url=base_url, model=args.model, api_key=os.environ.get(args.api_key_env)
        )
        mode = f"model {args.model!r} at {base_url} (OpenAI mode)"
    else:
        chat = shell_tasks.ScriptedSolver()
        mode = "scripted policy (no model endpoint)"
        print(
            "No model endpoint is configured (--base-url or OPENAI_BASE_URL), so the demo uses a "
            "scripted policy that solves the bundled tasks. Everything else is real: process "
            "mode, the local sandbox pool, verification in the slot.",
            file=sys.stderr,
        )
    tasks = shell_tasks.TASKS
    groups = args.groups or len(tasks)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("atropos_groups.jsonl", "atropos_groups.html"):
        (out / stale).unlink(missing_ok=True)
    config = AgentEnvConfig(
        tokenizer_name=str(qwen3_tokenizer_path()),
        use_wandb=False,
        group_size=args.group_size,
        total_steps=groups,
        include_messages=True,
        ensure_scores_are_not_same=False,
        data_path_to_save_groups=str(out / "atropos_groups.jsonl"),
        max_turns=10,
        max_tokens=2048,
        max_token_length=32768,
        local_containers=2,
        slots_per_container=max(1, math.ceil(args.group_size / 2)),
        terminal_timeout_s=30.0,
        slot_lifetime_s=300.0,  # below Atropos's worker_timeout (600 s)
        acquire_timeout_s=120.0,
    )
    run = _Run(
        progress=ProgressBar(total=groups, plain=args.plain),
        limit=2 * groups + 2,
        trajectories=JsonLines.create(out / "trajectories.jsonl"),
    )
    env = _demo_env(shell_tasks, chat, run)(config, None)
    env.n_groups_to_process = groups
    env.group_size_to_process = args.group_size
    env.max_token_len = config.max_token_length  # no trainer tells process mode a limit
    print(f"trajcore demo: {groups} groups of {args.group_size}, {mode}", file=sys.stderr)
    run.progress.start()
    with closing_on_signals("trajcore demo"):
        status, end = _process_to_end(env, chat, args, base_url, run, groups=groups)
        _report(run, out, end, mode=mode, groups=groups, args=args)  # (a signal here: files whole)
    return status
