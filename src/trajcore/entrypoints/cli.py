"""The ``trajcore`` command: one program, several roles.

    trajcore slot-server ...   serve N sandbox slots over HTTP (what every container runs)
    trajcore tool-server ...   serve registered Python tools over HTTP or MCP (--mcp stdio|http)
    trajcore demo ...          run the shell-tasks env on the local pool and write a report
    trajcore run ENV ...       run any env end to end with a scripted, replayed or real model
    trajcore report FILE       the HTML report and summary of an env's output file
    trajcore model SCRIPT      a script of the model served as an OpenAI-compatible endpoint

Each subcommand's module is imported only when it runs, so ``trajcore slot-server`` starts
without loading transformers or atroposlib, and runs in the core install (``pip install
trajcore``); a subcommand whose extra is not installed exits 2 naming the extra to install.

Ctrl-C before a subcommand handles signals itself (while its module and the env load, say)
ends the command with one line on stderr and status 130, never a traceback; from then on the
subcommand's own handling applies (``trajcore.entrypoints.signals``). A SIGTERM (a scheduler's
stop) there ends ``run``, ``demo``, ``report`` and ``model`` the same way, with status 143;
the servers (``slot-server``, ``tool-server``) keep the default SIGTERM until they install their
own.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
from collections.abc import Iterator, Sequence
from types import FrameType

__all__ = ["main"]

_COMMANDS: dict[str, tuple[str, str]] = {
    "slot-server": ("trajcore.entrypoints.slot_server", "serve sandbox slots over HTTP"),
    "tool-server": ("trajcore.entrypoints.tool_server", "serve Python tools over HTTP or MCP"),
    "demo": ("trajcore.entrypoints.demo", "run the shell-tasks env offline and write a report"),
    "run": (
        "trajcore.entrypoints.run",
        "run any env end to end (scripted, replayed or real model)",
    ),
    "report": ("trajcore.entrypoints.report_files", "report an env's output file (HTML, table)"),
    "model": (
        "trajcore.entrypoints.model_stub",
        "serve a script of the model as an OpenAI-compatible endpoint (process mode offline)",
    ),
}
# The extra each subcommand needs beyond the core install (the slot server needs none).
_EXTRAS: dict[str, str] = {
    "tool-server": "tool-server",
    "demo": "atropos",
    "run": "atropos",
    "report": "report",
    "model": "atropos",
}
# The commands a SIGTERM ends with one line and status 143 before they handle signals (the
# servers handle SIGTERM themselves once started, and die of it before).
_TERMINABLE = frozenset({"run", "demo", "report", "model"})


def _usage() -> str:
    lines = ["usage: trajcore COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in _COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand named by ``argv[0]``; returns the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in _COMMANDS:
        print(f"trajcore: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        with _terminated_on_sigterm(command in _TERMINABLE):
            return _run(command, rest)
    except _Terminated:  # a SIGTERM before the subcommand's own handlers
        with contextlib.suppress(OSError, ValueError):
            print(f"\ntrajcore {command}: terminated (SIGTERM)", file=sys.stderr)
        return _TERMINATED
    except KeyboardInterrupt:  # before the subcommand's own handlers, or a command without
        with contextlib.suppress(OSError, ValueError):
            print(f"\ntrajcore {command}: interrupted (SIGINT)", file=sys.stderr)
        return _INTERRUPTED


_INTERRUPTED = 128 + 2  # the shell's status for SIGINT
_TERMINATED = 128 + 15  # ... and for SIGTERM


class _Terminated(KeyboardInterrupt):
    """A SIGTERM arrived while no handler of the subcommand's own was installed."""


def _raise_terminated(_signum: int, _frame: FrameType | None) -> None:
    raise _Terminated("SIGTERM")


@contextlib.contextmanager
def _terminated_on_sigterm(wanted: bool) -> Iterator[None]:
    """Within the block a SIGTERM raises ``_Terminated`` where the program is, as Ctrl-C raises
    ``KeyboardInterrupt`` (a subcommand's own handler, installed within, takes over and gives
    this one back). A SIGTERM ignored on entry (``nohup``-style) stays ignored."""
    if not wanted or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if previous is not None:  # (None: installed outside Python, cannot be restored)
            signal.signal(signal.SIGTERM, previous)


def _run(command: str, rest: list[str]) -> int:
    try:
        module = importlib.import_module(_COMMANDS[command][0])
    except ModuleNotFoundError as error:
        extra = _EXTRAS.get(command)
        if extra is None or error.name is None or error.name.startswith("trajcore"):
            raise
        print(
            f"trajcore {command}: needs {error.name!r}, which is not installed: "
            f"install trajcore[{extra}]",
            file=sys.stderr,
        )
        return 2
    status: int = module.main(rest)
    return status


if __name__ == "__main__":
    sys.exit(main())
