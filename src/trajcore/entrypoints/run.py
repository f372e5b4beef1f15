"""``trajcore run``: any env, end to end, on a real pool, with the author's own model stand-in.

    trajcore run TARGET (--policy FUNCTION | --replay FILE | --base-url URL)
                 [--groups N] [--group-size N] [--out DIR] [--pool env|unisolated]
                 [--set FIELD=VALUE ...] [--model NAME] [--api-key-env VAR] [--plain]

``TARGET`` names the env class: ``my_module:MyEnv`` (a module importable from here; the
current directory is searched first) or ``path/to/my_env.py:MyEnv``. The env is built as its
CLI builds it (``config_init()``, then each ``--set FIELD=VALUE``: the value is read as JSON when
it parses, as text otherwise), with wandb off and messages kept, and runs ``--groups`` groups
of ``--group-size`` (default: the config's) items from its own ``get_next_item``, after its
``setup``, on the env's pool (``make_pool()``: the local pool of slot servers unless the config
says otherwise) or, with ``--pool unisolated``, on ``UnisolatedSandboxPool`` (real commands in
plain directories, NO ISOLATION: only for scripts you trust; refused with ``require_sandbox``
or ``require_stateful_sandbox`` set).

The model, one of:

- ``--policy FUNCTION``: a script of the model (``trajcore.rollout.scripted.ModelScript``:
  ``solve(messages) -> tool calls | final text | Message``), named ``module:function`` or
  ``path.py:function``, or just ``function`` for one in TARGET's module. A ``ChatServer`` (an
  object with ``chat``, or a class of one) is accepted too. In managed mode a script is
  rendered by the env's tool-call parser and sampled back as exact tokens.
- ``--replay FILE``: recorded tool calls: the ``trajectories.jsonl`` of an earlier
  ``trajcore run`` or ``trajcore demo`` (from a real model or a script); each trajectory plays
  the recorded turns of its task (``trajcore.rollout.scripted.Replay``). ``--groups`` defaults
  to the number of groups recorded.
- ``--base-url URL``: an OpenAI-compatible endpoint (OpenAI mode; ``--model``, and the API key
  from the variable ``--api-key-env``). A config whose ``mode`` is ``managed`` is refused (its
  token endpoint is process mode's: ``python env.py process --openai.base_url URL``); ``auto``
  is OpenAI mode here. Before the first group the endpoint must answer a one-token chat
  request, within the config's ``model_wait_s`` (``--set model_wait_s=SECONDS``), else the run
  stops naming the URL and what came back.

It writes into ``--out`` (default ``out/run/<env name>``, and ``out/run/<env name>-replay``
for a replay; a run never writes over the file it replays: it refuses, status 2):
``trajectories.jsonl`` (one record per trajectory), ``scored_groups.jsonl`` (what Atropos
would be sent, one ``ScoredDataGroup`` per line) and ``report.html`` (every turn's messages,
tool calls, results, scores and metadata), and prints the summary table. The two JSONL files
grow group by group as the run goes (whole lines only), so a run ended at once (a second
signal, a SIGKILL after SIGTERM) keeps every group it finished; the report and the table come
at the end. A run that ends before its groups are done (a signal, an error, or
``get_next_item`` giving ``None``) says so under the table and in the report's title, with what
stopped it and how many of the groups asked for were done ("stopped by SIGTERM after 1 of 3
groups"); the report names the error too.

Exit status: 0 when every group ran; 1 when the run stopped on an error (the groups done are
still written) or no trajectory of any group was scored (every one failed: the table and the
report say why); 2 for a usage or setting error; 128 + the signal after SIGINT or SIGTERM
(``trajcore.entrypoints.signals``), also with what was done written.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import attrs

from trajcore.adapters.fakes.unisolated import UnisolatedSandboxPool
from trajcore.adapters.llm.chat import OpenAIChatServer
from trajcore.adapters.llm.transport import RetryRules
from trajcore.domain.errors import ConfigError, TrajcoreError
from trajcore.domain.messages import Message
from trajcore.domain.tool_parsers import get_parser
from trajcore.entrypoints.atropos import scored_data, startup
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.entrypoints.atropos.scored_data import ScoredGroup
from trajcore.entrypoints.model_probe import send_probe
from trajcore.entrypoints.report import (
    JsonLines,
    ProgressBar,
    ran_unsandboxed,
    summary_table,
    write_html,
)
from trajcore.entrypoints.signals import Interrupted, closing_on_signals, exit_status
from trajcore.ports.chat_server import ChatServer
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.rollout.group import GroupResult
from trajcore.rollout.policy import ChatPolicy, Policy
from trajcore.rollout.scripted import ModelScript, Replay, ScriptedPolicy, replay_records

__all__ = ["RunEnd", "load_object", "main", "scripted_policy", "wait_for_endpoint"]

log = logging.getLogger("trajcore.run")


class UsageError(TrajcoreError):
    """The command line names something that cannot be used (said in the message)."""


def _module(where: str) -> ModuleType:
    """The module ``where`` names: a ``.py`` path, or a dotted name importable from here."""
    if where.endswith(".py") or os.sep in where:
        path = Path(where).resolve()
        if not path.is_file():
            raise UsageError(f"no such file: {where}")
        name = f"trajcore_run_{path.stem}_{abs(hash(str(path)))}"
        if name in sys.modules:
            return sys.modules[name]
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"cannot load {where} as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as error:
        raise UsageError(f"cannot import {where!r}: {error}") from None


def load_object(target: str, *, default_module: ModuleType | None = None) -> object:
    """The object ``module:name`` (or ``path.py:name``) names; a bare ``name`` is looked up in
    ``default_module``.

    Raises:
        UsageError: the module or the name cannot be found.
    """
    where, colon, name = target.rpartition(":")
    if not colon:
        where, name = "", target
    module = _module(where) if where else default_module
    if module is None:
        raise UsageError(f"{target!r}: expected MODULE:NAME or path/to/file.py:NAME")
    try:
        return getattr(module, name)
    except AttributeError:
        where = getattr(module, "__file__", None) or module.__name__  # the file the user named
        raise UsageError(f"{where} has no {name!r}") from None


def scripted_policy(env: AgentEnv[Any], script: ModelScript | Replay) -> ScriptedPolicy:
    """``script`` as the model of ``env``, in the env's mode: managed mode renders each step with
    the env's tool-call parser and samples it back as exact tokens; OpenAI mode re-renders
    tokens with the env's chat template."""
    if env.settings.mode == "managed":
        assert env.settings.parser is not None  # the settings checked it
        return ScriptedPolicy.managed(
            script,
            tokenizer=env.tokenizer_port(),
            template=env.chat_template(),
            parser=get_parser(env.settings.parser),
        )
    return ScriptedPolicy.openai(script, template=env.chat_template())


def _value(text: str) -> object:
    try:
        value: object = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value


def _config(env_class: type[AgentEnv[Any]], settings: Sequence[str]) -> tuple[Any, object]:
    config, servers = env_class.config_init()
    if not isinstance(config, AgentEnvConfig):
        raise UsageError(f"{env_class.__name__}.config_init() gave no AgentEnvConfig")
    for setting in settings:
        field, equals, text = setting.partition("=")
        if not equals or not field:
            raise UsageError(f"--set {setting!r}: expected FIELD=VALUE")
        try:
            setattr(config, field.strip(), _value(text))
        except (ValueError, AttributeError, TypeError) as error:
            raise ConfigError(field.strip(), str(error)) from None
    config.use_wandb = False
    config.include_messages = True
    return config, servers


@attrs.define
class _Model:
    policy: Policy
    line: str


def _model(args: argparse.Namespace, env: AgentEnv[Any], env_module: ModuleType) -> _Model:
    if args.replay is not None:
        try:
            with args.replay.open(encoding="utf-8") as lines:
                records = replay_records(lines)
        except OSError as error:
            raise UsageError(f"--replay {args.replay}: {error.strerror}") from None
        replay = Replay.of(records)
        if args.groups is None:
            args.groups = max(1, len({str(r.get("group")) for r in records}))
        return _Model(
            scripted_policy(env, replay), f"replay of {args.replay} ({env.settings.mode} mode)"
        )
    if args.policy is not None:
        try:
            found = load_object(args.policy, default_module=env_module)
        except UsageError as error:
            raise UsageError(
                f"--policy {args.policy}: {error}; --policy names a script of the model, a "
                "function of the conversation that gives the model's next step (tool calls, a "
                "final text or a Message), defined in the env's file or as module:function "
                "(docs/writing_envs.md, section 7), or use --base-url URL for a real model"
            ) from None
        if isinstance(found, type) and hasattr(found, "chat"):
            found = found()
        if hasattr(found, "chat"):
            server: ChatServer = found  # type: ignore[assignment]  # duck-typed: has chat()
            return _Model(
                ChatPolicy(server, env.chat_template()), f"chat server {args.policy} (OpenAI mode)"
            )
        if not callable(found):
            raise UsageError(f"--policy {args.policy}: not a function of the conversation")
        script: ModelScript = found  # a callable; its steps are checked as they come
        return _Model(
            scripted_policy(env, script), f"script {args.policy} ({env.settings.mode} mode)"
        )
    assert args.base_url is not None
    chat = OpenAIChatServer(
        base_url=args.base_url, model=args.model, api_key=os.environ.get(args.api_key_env)
    )
    return _Model(
        ChatPolicy(chat, env.chat_template()),
        f"model {args.model!r} at {args.base_url} (OpenAI mode)",
    )


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="trajcore run",
        description="Run an env end to end on a real pool with a scripted, replayed or real "
        "model; write the scored groups and a report.",
    )
    parser.add_argument("target", help="the env class: module:Class or path/to/env.py:Class")
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--policy", help="the model as a script: module:function, or function")
    model.add_argument("--replay", type=Path, help="recorded tool calls: a trajectories.jsonl")
    model.add_argument("--base-url", help="an OpenAI-compatible endpoint (OpenAI mode)")
    parser.add_argument("--model", default="default", help="model name sent to --base-url")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="variable with the key")
    parser.add_argument(
        "--groups",
        type=int,
        help="groups to run (default 1; with --replay, the recording's number of groups)",
    )
    parser.add_argument("--group-size", type=int, help="trajectories per group (default: config)")
    parser.add_argument("--out", type=Path, help="output directory (default out/run/<env>)")
    parser.add_argument(
        "--pool",
        choices=("env", "unisolated"),
        default="env",
        help="env: the env's own pool (make_pool); unisolated: plain directories, NO ISOLATION",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a config setting"
    )
    parser.add_argument("--plain", action="store_true", help="plain-text table and progress")
    args = parser.parse_args(list(argv))
    if args.groups is not None and args.groups < 1:
        parser.error("--groups must be >= 1")
    if args.group_size is not None and args.group_size < 1:
        parser.error("--group-size must be >= 1")
    return args


@attrs.define
class _Done:
    """The groups done so far, each written to the JSONL files as it ends."""

    trajectories: JsonLines
    scored_lines: JsonLines
    groups: list[GroupResult] = attrs.field(factory=list)
    scored: list[ScoredGroup] = attrs.field(factory=list)
    not_sent: list[str] = attrs.field(factory=list)
    tasks: dict[str, str] = attrs.field(factory=dict)

    @classmethod
    def create(cls, out: Path) -> _Done:
        """Empty JSONL files in ``out`` (made when missing). Raises ``OSError``."""
        out.mkdir(parents=True, exist_ok=True)
        trajectories = JsonLines.create(out / "trajectories.jsonl")
        try:
            return cls(trajectories, JsonLines.create(out / "scored_groups.jsonl"))
        except BaseException:
            trajectories.close()
            raise

    def add(self, result: GroupResult, task: str) -> None:
        """Keep ``result`` and write its lines now (before anything else is asked of the env,
        so a group that ran is never lost to a later error)."""
        self.groups.append(result)
        self.tasks[result.group_id] = task
        self.trajectories.append_group(result)

    def add_scored(self, scored: ScoredGroup) -> None:
        """Keep ``scored`` (the group as Atropos gets it) and write its line now."""
        self.scored.append(scored)
        self.scored_lines.append([scored])

    def close(self) -> None:
        self.trajectories.close()
        self.scored_lines.close()


@attrs.frozen(kw_only=True)
class RunEnd:
    """How a run of ``asked`` groups ended, as its summary and report say it (``trajcore run``
    and ``trajcore demo``).

    Attributes:
        asked: the groups asked for.
        done: the groups done.
        stopped_by: what stopped the run before its end (a signal's name, an error's type), or
            None when nothing did.
        error: the error that stopped it, as ``TYPE: MESSAGE``, or None.
    """

    asked: int
    done: int
    stopped_by: str | None = None
    error: str | None = None

    @classmethod
    def of(cls, cause: BaseException | None, *, asked: int, done: int) -> RunEnd:
        """The end of a run that ``cause`` stopped (an ``Interrupted``: its signal; another
        exception: an error), or that ran to its end when ``cause`` is None."""
        if cause is None:
            return cls(asked=asked, done=done)
        if isinstance(cause, Interrupted):
            return cls(asked=asked, done=done, stopped_by=signal.Signals(cause.signum).name)
        name = type(cause).__name__
        return cls(asked=asked, done=done, stopped_by=name, error=f"{name}: {cause}")

    def line(self) -> str | None:
        """One line saying the run ended early, or None for a run that did every group."""
        groups = f"after {self.done} of {self.asked} groups"
        if self.stopped_by is not None:
            return f"stopped by {self.stopped_by} {groups}"
        if self.done < self.asked:
            return f"ended {groups}: the env had no more items (get_next_item gave None)"
        return None

    def title(self, title: str) -> str:
        """``title``, followed by ``line()`` when there is one."""
        line = self.line()
        return title if line is None else f"{title}: {line}"

    def notes(self) -> list[str]:
        """The report's lines on how the run ended: the error that stopped it, if one did."""
        return [] if self.error is None else [f"error: {self.error}"]


def _task_text(env: AgentEnv[Any], item: object) -> str:
    """The item's last user message, for the report; what the env's hook raised instead (the
    group's members already say it, as ``env_error``)."""
    try:
        messages: list[Message] = env.task_messages(item)
    except Exception as error:  # noqa: BLE001 - the report's text only; the run goes on
        return f"(task_messages raised {type(error).__name__}: {error})"
    return next((m.content for m in reversed(messages) if m.role == "user"), "")


async def _run(
    env: AgentEnv[Any], model: _Model, args: argparse.Namespace, done: _Done, bar: ProgressBar
) -> None:
    if args.base_url is not None:
        await wait_for_endpoint(
            args.base_url,
            model=args.model,
            api_key=os.environ.get(args.api_key_env),
            wait_s=env.config.model_wait_s,
        )
    await env.setup()
    pool: SandboxPool | None = None
    async with contextlib.AsyncExitStack() as stack:
        if args.pool == "unisolated":
            pool = await stack.enter_async_context(
                UnisolatedSandboxPool(
                    slots_per_container=max(1, args.group_size or env.config.group_size),
                    acquire_timeout_s=env.config.acquire_timeout_s,
                )
            )
        async with env.rollout_services(policy=model.policy, pool=pool):
            for _ in range(args.groups):
                item = await env.get_next_item()
                if item is None:
                    log.info("get_next_item() gave None: no more items")
                    break
                result = await env.run_group(item, group_size=args.group_size)
                done.add(result, _task_text(env, item))
                scored = env.scored_group(result)
                if scored is not None:
                    done.add_scored(scored)
                else:
                    why = scored_data.scored_group(result, env.settings)
                    done.not_sent.append(f"{result.group_id}: {why.drop_reason} {why.detail}")
                scores = [m.outcome.score for m in result.members]
                bar.advance(f"{result.verdict.status.value}, scores {scores}")


def _write(
    done: _Done, out: Path, end: RunEnd, *, title: str, notes: list[str], plain: bool
) -> None:
    done.close()
    written = done.trajectories.lines
    write_html(
        done.groups,
        out / "report.html",
        title=end.title(title),
        notes=[*notes, *end.notes()],
        tasks=done.tasks,
    )
    print(summary_table(done.groups, plain=plain))
    if (line := end.line()) is not None:
        print(line)
    if ran_unsandboxed(done.groups):
        print("note: commands ran without a sandbox (bubblewrap unusable, or --pool unisolated)")
    print(f"wrote {written} trajectories to {out / 'trajectories.jsonl'}")
    sent = out / "scored_groups.jsonl"
    print(f"{len(done.scored)} scored groups (what Atropos would be sent): {sent}")
    for line in done.not_sent:
        print(f"  not sent: {line.strip()}")
    print(f"report: {out / 'report.html'}")


def _check_choices(args: argparse.Namespace, config: AgentEnvConfig) -> None:
    """Refuse a config the command line cannot honour; ``--base-url`` makes ``auto`` OpenAI mode.

    Raises:
        ConfigError: ``mode`` managed with ``--base-url``; ``require_sandbox`` (or
            ``require_stateful_sandbox``) with ``--pool unisolated``.
    """
    if args.base_url is not None:
        if config.mode == "managed":
            raise ConfigError(
                "mode",
                "--base-url runs OpenAI mode (the endpoint's chat completions); managed mode "
                "needs its token endpoint: run `python ENV.py process --openai.base_url URL`, "
                "or drop --set mode=managed",
            )
        config.mode = "openai"
    if args.pool == "unisolated":
        for field in ("require_sandbox", "require_stateful_sandbox"):
            if getattr(config, field):
                raise ConfigError(
                    field, "--pool unisolated runs commands without a sandbox; use --pool env"
                )


async def wait_for_endpoint(
    base_url: str, *, model: str, api_key: str | None, wait_s: float
) -> None:
    """Return once ``base_url`` answers a one-token chat request for ``model``
    (``startup.wait_for_model``: a refused connection or a 5xx is tried again each second).

    Raises:
        ModelEndpointUnavailable: it answered the wrong thing, or nothing within ``wait_s``;
            the message names the URL and what came back.
    """
    retry = RetryRules(max_attempts=1, attempt_timeout_s=startup.PROBE_TIMEOUT_S)
    chat = OpenAIChatServer(base_url=base_url, model=model, api_key=api_key, retry=retry)

    async def send() -> object:
        return await send_probe(chat)

    expected = (
        f"POST {base_url.rstrip('/')}/chat/completions answering 200 with an OpenAI chat "
        f"completion for model {model!r}"
    )
    probe = startup.EndpointProbe(url=base_url, expected=expected, send=send, close=chat.aclose)
    await startup.wait_for_model([probe], wait_s=wait_s)


def _out_dir(args: argparse.Namespace, env_name: str) -> Path:
    """The output directory: ``--out``, else ``out/run/<env name>`` (``...-replay`` for a
    replay, so replaying the default output never writes over the recording).

    Raises:
        UsageError: the run would write its ``trajectories.jsonl`` over the ``--replay`` file.
    """
    default = Path("out") / "run" / (f"{env_name}-replay" if args.replay else env_name)
    out: Path = args.out or default
    written = out / "trajectories.jsonl"
    if args.replay is not None and written.resolve() == args.replay.resolve():
        raise UsageError(
            f"--replay {args.replay} is the file this run writes (--out {out}): "
            "give another --out so the recording is kept"
        )
    return out


def _nothing_scored(groups: Sequence[GroupResult]) -> bool:
    """Whether ``groups`` ran and not one member of them has a score."""
    return bool(groups) and all(m.outcome.score is None for g in groups for m in g.members)


def _built(
    env_class: type[AgentEnv[Any]], config: AgentEnvConfig, servers: object
) -> AgentEnv[Any]:
    """The env, built; a tokenizer it cannot load is a ``ConfigError`` naming this command's flag.

    Raises:
        ConfigError: a setting the env refuses.
    """
    try:
        return env_class(config, servers)
    except ConfigError as error:  # the env names the setting; this command's flag is --set
        if error.field != "tokenizer_name":
            raise
        reason = f"{error.reason} (--set tokenizer_name=PATH)"
        raise ConfigError("tokenizer_name", reason) from None
    except OSError as error:  # Atropos loads tokenizer_name when the env is built
        raise ConfigError(
            "tokenizer_name",
            f"building the env failed loading {config.tokenizer_name!r}: {error} (offline, "
            "give a local tokenizer folder: --set tokenizer_name=PATH)",
        ) from None


def main(argv: Sequence[str]) -> int:
    """Run the env; returns the exit status (see the module docstring)."""
    args = _arguments(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        env_class = load_object(args.target)
        if not (isinstance(env_class, type) and issubclass(env_class, AgentEnv)):
            raise UsageError(f"{args.target} is not an AgentEnv subclass")
        env_module = sys.modules[env_class.__module__]
        config, servers = _config(env_class, args.set)
        _check_choices(args, config)
        env = _built(env_class, config, servers)
        model = _model(args, env, env_module)
        out = _out_dir(args, env.name or env_class.__name__)
    except (TrajcoreError, OSError) as error:
        print(f"trajcore run: {error}", file=sys.stderr)
        return 2
    if args.groups is None:
        args.groups = 1
    if args.pool == "unisolated":
        print("trajcore run: --pool unisolated: commands run WITHOUT ISOLATION", file=sys.stderr)
    print(
        f"trajcore run: {env_class.__name__}, {args.groups} groups, {model.line}", file=sys.stderr
    )
    if (out / "trajectories.jsonl").exists():  # said, so an earlier run is not lost unnoticed
        print(f"trajcore run: replacing the earlier run's output in {out}", file=sys.stderr)
    try:
        done = _Done.create(out)
    except OSError as error:
        print(f"trajcore run: --out {out}: {error}", file=sys.stderr)
        return 2
    bar = ProgressBar(total=args.groups, plain=args.plain)
    notes = [f"env: {args.target}", f"model: {model.line}", f"pool: {args.pool}"]
    title = f"trajcore run: {env_class.__name__}"
    # The report is written within the block too: a signal while it is written stops the
    # command with its one line, and leaves the files whole (``trajcore.entrypoints.report``).
    with closing_on_signals("trajcore run"):
        try:
            status, end = _run_to_end(env, model, args, done, bar)
        finally:
            done.close()
        _write(done, out, end, title=title, notes=notes, plain=args.plain)
    return status


def _run_to_end(
    env: AgentEnv[Any], model: _Model, args: argparse.Namespace, done: _Done, bar: ProgressBar
) -> tuple[int, RunEnd]:
    """Run the groups; returns the exit status (see the module docstring) and how it ended."""
    status = 0
    cause: BaseException | None = None
    bar.start()
    try:
        anyio.run(_run, env, model, args, done, bar, backend="asyncio")
    except TrajcoreError as error:
        print(f"\ntrajcore run: {type(error).__name__}: {error}", file=sys.stderr)
        status, cause = 1, error
    except Interrupted as stop:
        print(f"\ntrajcore run: stopped by {stop}; writing what was done", file=sys.stderr)
        status, cause = exit_status(stop.signum), stop
    finally:
        bar.close()
    end = RunEnd.of(cause, asked=args.groups, done=len(done.groups))
    if status == 0 and _nothing_scored(done.groups):
        print(
            f"\ntrajcore run: no trajectory of the {len(done.groups)} groups was scored: every "
            "one failed (see the table and the report for why)",
            file=sys.stderr,
        )
        status = 1
    return status, end
