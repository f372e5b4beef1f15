"""Chaos: hostile but plausible model actions across many leases of a pool of two slot servers.

A hypothesis state machine holds up to three leases of a real local pool (two slot servers, two
slots each, bubblewrap, the sandbox required) and, step by step, has a lease do what an
exploring policy does by accident: deep and wide trees, file names of arbitrary bytes, big
outputs, background and ``setsid`` jobs, memory held in ``/tmp`` and ``/dev/shm``, signals to
everything it can reach, and model text (any code points, lone surrogates and NULs included)
carried through the hermes tool-call parser into real calls. After every step it checks, from
the host:

- no slot server restarted (each server's pid is the one it had at the start);
- every other live lease still answers a call correctly;
- model text either ran and came back exactly, or was refused for its own call alone;
- a released lease's jobs are gone, and every new lease starts on an empty workspace.

When the machine's run ends, the pool closes and leaves no process, no mount and no directory.
The CI profile runs a few short sequences; ``./dev test --deep`` runs many long ones.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import shlex
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import anyio
import anyio.from_thread
import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from tests.security.harness import host_pids
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

_ids = itertools.count(1)
_DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"


@attrs.define(eq=False)
class Pool:
    """The pool under test, run on an event loop in a portal thread."""

    portal: anyio.from_thread.BlockingPortal
    pool: LocalSandboxPool
    servers: dict[str, int]

    def execute(self, lease: Lease, *calls: ToolCall) -> list[ToolResult]:
        slot_calls = [SlotCall(lease=lease, call=call, timeout_s=30.0) for call in calls]
        return self.portal.call(self.pool.execute, lease.slot.container, slot_calls)

    def workspace(self, lease: Lease) -> Path:
        run_dir = self.pool.run_dir
        assert run_dir is not None
        return run_dir / "slots" / lease.slot.container / "slots" / str(lease.slot.index)


def bash(command: str) -> ToolCall:
    return ToolCall(id=f"c{next(_ids)}", name="bash", arguments={"command": command})


@pytest.fixture(scope="module")
def chaos_pool() -> Iterator[Pool]:
    config = LocalPoolConfig(
        containers=2,
        server=SlotServerSettings(
            slots_per_container=2, acquire_timeout_s=60.0,
            isolation=SlotIsolation(
                require_sandbox=True, min_timeout_s=0.2, max_processes=64, memory_bytes=512 << 20,
                output_cap_bytes=1 << 16,
            ),
        ),
    )  # fmt: skip
    pool = LocalSandboxPool(config)
    with anyio.from_thread.start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(pool):
            run_dir = pool.run_dir
            assert run_dir is not None
            servers = {name: pool.server_pid(name) for name in pool.container_names()}
            yield Pool(portal=portal, pool=pool, servers=servers)
        # after close: no process of the pool, no mount or directory of it
        assert not run_dir.exists(), f"the pool left {run_dir}"
        mounts = Path("/proc/self/mountinfo").read_text()
        assert str(run_dir) not in mounts
        left = [pid for pid in servers.values() if pid in host_pids()]
        assert left == [], f"slot servers {left} outlived the pool"


# ----------------------------------------------------------------------------- actions


def deep_tree(depth: int) -> str:
    p = "/".join(["d"] * min(depth, 1500))
    command = f"mkdir -p {p}"
    if depth > 1500:
        rest = "/".join(["d"] * (depth - 1500))
        command += f" && cd -P {p} && mkdir -p {rest}"
    return command


def wide_tree(count: int) -> str:
    return f"mkdir -p w && cd w && seq 1 {count} | sed 's/^/f/' | xargs touch"


def odd_name(name: bytes) -> str:
    escaped = "".join(f"\\{byte:03o}" for byte in name)
    return f"touch \"$(printf '{escaped}')\" && chmod 000 \"$(printf '{escaped}')\""


def big_output(size: int) -> str:
    return f"head -c {size} /dev/urandom | base64"


def memory_hold(where: str, mib: int) -> str:
    return f"head -c {mib}M /dev/zero > {where}/hold-{secrets.token_hex(4)}; echo held"


# Sizes lean to the hazards (past Python's recursion limit, tens of thousands of entries) so a
# short derandomized run meets them; the deep profile explores the rest.
ACTIONS = st.one_of(
    st.one_of(st.sampled_from([1100, 3000]), st.integers(10, 3000)).map(deep_tree),
    st.one_of(st.just(20_000), st.integers(10, 20_000)).map(wide_tree),
    st.binary(min_size=1, max_size=12)
    .map(lambda raw: bytes(b for b in raw if b not in (0, 0x2F)) or b"x")
    .map(odd_name),
    st.integers(1, 4 << 20).map(big_output),
    st.tuples(st.sampled_from(["/tmp", "/dev/shm", "."]), st.integers(1, 700)).map(
        lambda pair: memory_hold(*pair)
    ),
    st.just("mkdir -p locked/a/b && touch locked/a/f && chmod -R 000 locked; echo locked"),
    st.just("mkfifo pipe; (cat pipe >/dev/null &) ; ln -s / root-link; ln -s /etc/shadow sh"),
    st.just("kill -9 -1; echo survived"),
)
# every code point: lone surrogates, NUL and controls included (not the parser's own markup,
# which would end the call early, as it does in vLLM's parser)
MODEL_TEXT = st.one_of(
    st.sampled_from(["\udcff", "a\ud800b", "nul\x00", "\r\n\x1b[2J", "é\u2028\U0001f600"]),
    st.text(alphabet=st.characters(exclude_categories=()), max_size=40),
).filter(lambda text: "tool_call" not in text)


class ChaosMachine(RuleBasedStateMachine):
    """See the module docstring."""

    pool: Pool  # set by the test before the run

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[int, tuple[AbstractContextManager[Lease], Lease]] = {}
        self.dead: set[int] = set()  # leases whose sandbox a step ended (their calls fail)
        self.jobs: dict[int, list[str]] = {}
        self.keys = itertools.count()

    # -- leases

    @precondition(lambda self: len(self.held) < 3)
    @rule(target=leases)
    def acquire(self) -> int:
        key = next(self.keys)
        context = self.pool.portal.wrap_async_context_manager(self.pool.pool.lease(f"chaos-{key}"))
        lease = context.__enter__()
        self.held[key] = (context, lease)
        assert os.listdir(self.pool.workspace(lease)) == [], "a new lease found files"
        (answer,) = self.pool.execute(lease, bash("ls -A; ls -A /dev/shm; echo end"))
        assert (answer.outcome, answer.content) == (ToolOutcome.OK, "end\n"), answer
        return key

    @rule(key=consumes(leases))
    def release(self, key: int) -> None:
        self._release(key)

    def _release(self, key: int) -> None:
        context, _ = self.held.pop(key)
        context.__exit__(None, None, None)
        self.dead.discard(key)
        self.pool.portal.call(_wait_gone, self.jobs.pop(key, []))

    # -- hostile actions

    @rule(key=leases, command=ACTIONS)
    def act(self, key: int, command: str) -> None:
        _, lease = self.held[key]
        (result,) = self.pool.execute(lease, bash(command))
        if key in self.dead:
            return
        if result.outcome is ToolOutcome.INFRA_ERROR:
            # only a lease that signalled its own processes may lose its sandbox
            assert "kill -9 -1" in command, result
            self.dead.add(key)
        if command.startswith("kill"):
            self.dead.add(key)  # whatever survived, treat the lease as spent

    @rule(key=leases, setsid=st.booleans())
    def background_job(self, key: int, setsid: bool) -> None:
        _, lease = self.held[key]
        marker = f"{900 + next(_ids) % 99}.{secrets.randbelow(10**6):06d}"
        start = "setsid " if setsid else "nohup "
        self.pool.execute(lease, bash(f"({start}sleep {marker} >/dev/null 2>&1 &); echo ok"))
        self.jobs.setdefault(key, []).append(marker)

    @rule(key=leases, text=MODEL_TEXT, other=leases)
    def model_text(self, key: int, text: str, other: int) -> None:
        """Model text carried through the hermes parser into a real call, beside another
        lease's call: it round-trips or is refused for itself alone."""
        arguments = {"command": "printf %s " + shlex.quote(text)}
        call_json = json.dumps({"name": "bash", "arguments": arguments})
        raw = f"<tool_call>{call_json}</tool_call>"
        parsed = get_parser("hermes").parse(raw)
        assert parsed.errors == (), parsed.errors
        (parsed_call,) = parsed.calls
        # a model numbers each turn's calls from call_0; the rollout sends each under an id of
        # its own (ToolRouter), as here
        call = attrs.evolve(parsed_call, id=f"{parsed_call.id}#{next(_ids)}")
        _, lease = self.held[key]
        _, beside = self.held[other]
        if key in self.dead or other in self.dead:
            return
        results = self._together(lease, call, beside)
        mine, theirs = results
        if mine.outcome is ToolOutcome.OK:
            assert mine.exec is not None
            assert mine.exec.stdout == text, (text, mine)
        else:
            assert mine.outcome is ToolOutcome.REJECTED, mine
            assert "\0" in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text), mine
        assert (theirs.outcome, theirs.content) == (ToolOutcome.OK, "beside\n"), theirs

    def _together(self, lease: Lease, call: ToolCall, beside: Lease) -> list[ToolResult]:
        if lease.slot.container == beside.slot.container and lease != beside:
            calls = [
                SlotCall(lease=lease, call=call, timeout_s=30.0),
                SlotCall(lease=beside, call=bash("echo beside"), timeout_s=30.0),
            ]
            return self.pool.portal.call(self.pool.pool.execute, lease.slot.container, calls)
        (mine,) = self.pool.execute(lease, call)
        (theirs,) = self.pool.execute(beside, bash("echo beside"))
        return [mine, theirs]

    # -- what must hold after every step

    @invariant()
    def servers_never_restart(self) -> None:
        now = self.pool.portal.call(_server_pids, self.pool.pool)
        assert now == self.pool.servers, "a slot server was restarted"

    @invariant()
    def every_live_lease_answers(self) -> None:
        for key, (_, lease) in self.held.items():
            if key in self.dead:
                continue
            (answer,) = self.pool.execute(lease, bash(f"echo alive-{key}"))
            assert (answer.outcome, answer.content) == (ToolOutcome.OK, f"alive-{key}\n"), answer

    def teardown(self) -> None:
        for key in list(self.held):
            self._release(key)
        statistics = self.pool.portal.call(self.pool.pool.statistics)
        assert statistics.quarantined == 0, statistics


def _server_pids(pool: LocalSandboxPool) -> dict[str, int]:
    return {name: pool.server_pid(name) for name in pool.container_names()}


async def _wait_gone(markers: list[str]) -> None:
    """Every ``sleep MARKER`` job of a released lease ends (host ``/proc``)."""
    if not markers:
        return
    with anyio.move_on_after(10):
        while _jobs_with(markers):  # noqa: ASYNC110 - only /proc tells
            await anyio.sleep(0.05)
    assert _jobs_with(markers) == [], "a job of a released lease outlived its reset"


def _jobs_with(markers: list[str]) -> list[int]:
    found = []
    for pid in host_pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) >= 2 and argv[0].endswith(b"sleep") and argv[1].decode() in markers:
            found.append(pid)
    return found


def test_chaos(chaos_pool: Pool) -> None:
    ChaosMachine.pool = chaos_pool
    run = ChaosMachine.TestCase
    run.settings = settings(
        max_examples=200 if _DEEP else 10,
        stateful_step_count=40 if _DEEP else 20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    run().runTest()
