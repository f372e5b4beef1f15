"""``trajcore slot-server``: serve N sandboxed slots over HTTP until SIGTERM.

::

    trajcore slot-server --slots 8 --root /srv/slots --listen 127.0.0.1:0 --token-file token
    trajcore slot-server --slots 8 --root /srv/slots --unix /run/slots.sock [--require-sandbox]

TCP needs a bearer token, read from ``--token-file`` or from the environment variable named by
``--token-env`` (which the server then removes from its own environment; a scheduler such as
Nomad passes it that way, never on a command line); a Unix socket is guarded by its file
permissions and takes a token optionally. When the server is healthy it prints exactly one line
of JSON on stdout, ``{"ready": true, "address": ..., "unix": ..., "pid": ..., ...}``, so a parent
process (the local pool, a Nomad task's health check) can wait for it; ``--listen HOST:0`` picks a
free port and the line names it. SIGTERM or SIGINT ends every sandbox, then the process, with
status 0. A bad flag or an unusable root exits 2 with ``reason @ field`` on stderr.

The policy (network, sandbox requirement, limits, timeout range) comes from these flags only;
nothing a model writes into a call changes it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from trajcore.adapters.sandbox.codec import unstructure
from trajcore.adapters.sandbox.exec_agent import name_process
from trajcore.adapters.sandbox.runtime import RuntimeConfig, SlotRuntime, check_config
from trajcore.adapters.sandbox.server import start_http_server
from trajcore.domain.errors import ConfigError
from trajcore.domain.sandbox_policy import SandboxPolicy
from trajcore.domain.slot_server_flags import (
    DEFAULT_SLOT_UID_BASE,
    SLOT_HELPERS,
    check_slot_uid_range,
)

__all__ = ["main", "parse_args"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, parsed (argparse exits 2 on a malformed one)."""
    parser = argparse.ArgumentParser(
        prog="trajcore slot-server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--slots", type=int, required=True, help="number of slots")
    parser.add_argument("--root", type=Path, required=True, help="directory for workspaces")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--listen", help="HOST:PORT for TCP (needs a token); port 0 = any")
    where.add_argument("--unix", help="path of a Unix socket to listen on")
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token-file", type=Path, help="file holding the bearer token")
    token.add_argument(
        "--token-env",
        metavar="NAME",
        help="environment variable holding the bearer token (removed from the environment once "
        "read)",
    )
    parser.add_argument("--allow-network", action="store_true", help="share the host network")
    parser.add_argument(
        "--require-sandbox", action="store_true", help="refuse every call when bwrap is unusable"
    )
    parser.add_argument("--bwrap", default="bwrap", help="bubblewrap executable")
    parser.add_argument("--max-processes", type=int, default=256)
    parser.add_argument("--memory-mb", type=int, default=2048)
    parser.add_argument("--cpu-seconds", type=int, default=None)
    parser.add_argument("--output-cap-bytes", type=int, default=64 << 10)
    parser.add_argument("--file-cap-bytes", type=int, default=10 << 20)
    parser.add_argument("--min-timeout-s", type=float, default=1.0)
    parser.add_argument("--default-timeout-s", type=float, default=120.0)
    parser.add_argument("--max-timeout-s", type=float, default=3600.0)
    parser.add_argument("--no-cgroups", action="store_true", help="use rlimits only")
    parser.add_argument(
        "--slot-helper",
        choices=SLOT_HELPERS,
        default="auto",
        help="what runs each slot's keeper and lease agents in the sandbox: the compiled helper "
        "(native; built with the host's C compiler on first use), the Python one, or native when "
        "it works (auto)",
    )
    parser.add_argument(
        "--slot-uid-base",
        type=int,
        default=DEFAULT_SLOT_UID_BASE,
        help="when run as root, slot i's sandbox runs as host uid/gid BASE+i (default "
        f"{DEFAULT_SLOT_UID_BASE}); a server that is not root runs every slot as itself",
    )
    parser.add_argument(
        "--slot-uid-block",
        type=int,
        default=0,
        metavar="K",
        help="this server's block of slot uids: slot i runs as BASE + K*SLOTS + i, so servers "
        "sharing a host's uids never share a slot uid (a Nomad job passes its allocation index)",
    )
    return parser.parse_args(argv)


def _config(args: argparse.Namespace) -> tuple[RuntimeConfig, str | None]:
    policy = SandboxPolicy(
        allow_network=args.allow_network,
        require_sandbox=args.require_sandbox,
        max_processes=args.max_processes,
        memory_bytes=args.memory_mb << 20,
        cpu_seconds=args.cpu_seconds,
        output_cap_bytes=args.output_cap_bytes,
        file_cap_bytes=args.file_cap_bytes,
        min_timeout_s=args.min_timeout_s,
        default_timeout_s=args.default_timeout_s,
        max_timeout_s=args.max_timeout_s,
    )
    if args.slots <= 0:
        raise ConfigError("--slots", f"must be > 0, got {args.slots}")
    token: str | None = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ConfigError("--token-file", f"cannot read: {error.strerror}") from None
        if not token:
            raise ConfigError("--token-file", "the file is empty")
    if args.token_env is not None:
        token = os.environ.pop(args.token_env, "").strip()
        if not token:
            raise ConfigError(
                "--token-env", f"the environment variable {args.token_env!r} is unset or empty"
            )
    if args.listen is not None and token is None:
        raise ConfigError("--token-file", "TCP needs a bearer token (--token-file or --token-env)")
    if args.slot_uid_block < 0:
        raise ConfigError("--slot-uid-block", f"must be >= 0, got {args.slot_uid_block}")
    uid_base = args.slot_uid_base + args.slot_uid_block * args.slots
    check_slot_uid_range("--slot-uid-block", uid_base, args.slots)
    config = RuntimeConfig(
        slots=args.slots,
        slot_uid_base=uid_base,
        root=args.root.absolute(),
        policy=policy,
        bwrap=args.bwrap,
        use_cgroups=not args.no_cgroups,
        slot_helper=args.slot_helper,
    )
    check_config(config)
    return config, token


async def _serve(args: argparse.Namespace, config: RuntimeConfig, token: str | None) -> int:
    runtime = SlotRuntime(config)
    try:
        await runtime.start()
    except BaseException:
        await runtime.aclose()
        raise
    try:
        server, address = await start_http_server(
            runtime,
            token,
            listen=None if args.unix is not None else str(args.listen),
            unix=args.unix,
        )
    except BaseException:
        await runtime.aclose()
        raise
    try:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        ready = {
            "ready": True,
            "address": address,
            "unix": args.unix,
            "pid": os.getpid(),
            "slots": config.slots,
            "sandboxed": runtime.sandboxed,
            "capabilities": unstructure(runtime.capabilities),
        }
        name_process("slot-server")
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        # Everything loaded so far lives as long as the server: out of the collector's sight,
        # full collections only walk what calls allocate.
        gc.collect()
        gc.freeze()
        await stop.wait()
    finally:
        await server.aclose()
        await runtime.aclose()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the slot server until SIGTERM. Returns the exit status (0, or 2 on a bad config)."""
    args = parse_args(argv)
    try:
        config, token = _config(args)
    except ConfigError as error:
        sys.stderr.write(f"trajcore slot-server: {error}\n")
        return 2
    try:
        return asyncio.run(_serve(args, config, token))
    except (OSError, ConfigError) as error:
        sys.stderr.write(f"trajcore slot-server: {error}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
