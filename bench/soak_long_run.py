"""A long run, measured for leaks: an env's process and its slot servers, sampled from outside.

An RL run lasts hours; whatever its env process or slot servers keep per trajectory and never give
back (memory, file descriptors, threads, asyncio tasks, processes, files, slot-uid processes,
cgroups) ends it. This runs an env the way Atropos's ``process`` mode runs one, for ``--minutes``
or ``--trajectories``, and reads every such resource from ``/proc`` of the processes, by pid,
from this (parent) process:

- the env process is this script's child (``--child``): ``SoakEnv`` on the real local pool
  (``--servers`` slot servers of ``--slots`` slots, bubblewrap, its own ``slot_uid_base`` and
  ``TMPDIR``, so nothing of another run is counted), ``--workers`` groups of ``--group-size`` at
  a time, each group as Atropos's process loop runs one: ``collect_trajectories``,
  ``postprocess_histories``, ``handle_send_to_api`` (not sent), ``wandb_log`` (wandb off);
- the model is a script (no weights), served by ``trajcore model`` in a third process and
  reached over HTTP through Atropos's server manager, as ``process --openai.base_url`` reaches
  a model (``--model http``, the default), or played in the env process
  (``trajcore.entrypoints.run.scripted_policy``, ``--model script``). Its calls vary:
  ``write_file``, ``read_file``, ``bash`` (one leaving a background process, one killed at its
  timeout, one whose output is cut at the cap), ``bash_stateful`` (one interrupted at its
  timeout), ``tmux``, a call with bad arguments; one trajectory in twenty has the script raise
  (``model_error``), one in ten has its score hook raise (``env_error``), one group in seven has
  its prepare hook raise (the whole group fails);
- every ``--sample-s`` the child lets its groups in flight end, starts no new one, and prints
  the trajectories done, its asyncio tasks and its gc-tracked objects; this process then reads
  (every sample is taken at rest, so in-flight work is not counted as growth): the env
  process's RSS, PSS, fds, threads and descendants; the slot servers' RSS, fds, threads and
  descendant processes; the model server's RSS and fds; the processes of the run's slot uids;
  the files and bytes under the run's ``TMPDIR`` (the pool's directory, workspaces, sockets)
  and the cgroups the servers made. After the env process ends: what is left under
  ``TMPDIR`` and of the slot uids' processes. With ``--kill-every K``, one slot server is
  killed (SIGKILL) after every K-th sample, as an OOM kill would, so the pool's replacement of a
  server is in the run too (the killed servers' slot uids and cgroups stay counted).

Printed: each resource's first, middle and last value, and its growth per 1,000 trajectories (a
least-squares slope over the second half of the samples, after the warm-up), beside a limit; a
resource over its limit is ``GROWS`` when its floor rose too (no sample of the second half below
any of the first, the last above them all by more than the resource's noise: 2 MiB of RSS or
PSS, which a minute's run moves by as its allocator takes pages, 10k objects, none for a count
of files, fds, threads or processes), else ``noisy`` (a bounded figure that moves about:
connections kept alive, a thread pool's threads). A short run's slopes are noisy (RSS moves by
pages); a leak shows as the same slope at every length, and its floor keeps rising. ``--samples
FILE`` keeps every sample as JSON lines. Defaults finish in about a minute, too short to judge
growth (``JUDGED_FROM`` trajectories: the slopes are printed, the verdict is the files and
processes left after the run only); docs/benchmarks.md records longer runs (``--minutes 25
--sample-s 30``).

Run: ``.venv/bin/python bench/soak_long_run.py [--minutes M | --trajectories N] [--model
http|script] [--kill-every K] [--workers 6] [--group-size 4] [--servers 2] [--slots 16]
[--sample-s 5] [--samples FILE] [--log FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.server_handling.server_baseline import (  # type: ignore[import-untyped]
    APIServerConfig,
)

from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.entrypoints.run import scripted_policy
from trajcore.env import AgentEnv, AgentEnvConfig, Message, SlotTools, ToolCall
from trajcore.rollout.scripted import ScriptStep

SELF = Path(__file__).resolve()
SLOT_UID_BASE = 1_960_000_000  # this run's own slot uids: no other pool's processes counted
MIB = 1024 * 1024


# ------------------------------------------------------------------------------ the env (child)


class ScriptRaised(RuntimeError):
    """The model script's deliberate failure (the member ends as ``model_error``)."""


class ScoreHookRaised(RuntimeError):
    """The score hook's deliberate failure (the member ends as ``env_error``)."""


class PrepareRaised(RuntimeError):
    """The prepare hook's deliberate failure (the group fails as ``env_error``)."""


def _call(index: int, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"c{index}", name=name, arguments=arguments)


STEPS: tuple[ToolCall, ...] = (
    _call(0, "write_file", path="notes.txt", content="soak\n" * 50),
    _call(1, "bash", command="cat notes.txt | wc -l; (sleep 30 &) ; echo started"),
    _call(2, "bash_stateful", command="cd /tmp && export SOAK=1 && echo $SOAK"),
    _call(3, "tmux", keys="echo tmux-$SOAK", wait_s=0.2),
    _call(4, "bash", command="sleep 5", timeout=1),
    _call(5, "bash", command="head -c 300000 /dev/zero | tr '\\0' x"),  # cut at the cap
    _call(6, "bash_stateful", command="sleep 5", timeout=1),
    _call(7, "read_file", path="notes.txt"),
    _call(8, "bash", command=7),  # bad arguments: answered as the model's mistake
)


def script(messages: Sequence[Message]) -> ScriptStep:
    """The model: the calls of ``STEPS`` one per turn, then "Done."; one time in twenty it
    raises at its first turn."""
    turn = sum(1 for m in messages if m.role == "assistant")
    if turn == 0 and random.random() < 0.05:
        raise ScriptRaised("the soak's deliberate model failure")
    return STEPS[turn] if turn < len(STEPS) else "Done."


class SoakEnv(AgentEnv[int]):
    """Items are numbers; every seventh group's prepare hook raises, one score in ten raises."""

    name = "soak"
    _next: int = 0

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        config, servers = super().config_init()
        config.tokenizer_name = str(qwen3_tokenizer_path())  # shipped: no download
        config.use_wandb = False
        return config, servers

    async def get_next_item(self) -> int:
        self._next += 1
        return self._next

    def build_task(self, item: int) -> list[Message]:
        return [Message.user(f"Soak task {item}: use the tools, then say Done.")]

    async def prepare_workspace(self, item: int, tools: SlotTools) -> None:
        if item % 7 == 3:
            raise PrepareRaised(f"the soak's deliberate prepare failure (item {item})")
        await tools.upload({"seed.txt": f"{item}\n"})

    async def verify_and_score(
        self, item: int, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        if random.random() < 0.1:
            raise ScoreHookRaised("the soak's deliberate score failure")
        return 1.0 if await tools.check("test -s notes.txt && test -s seed.txt") else 0.0


def soak_env(args: argparse.Namespace) -> SoakEnv:
    """The env, configured for this run (its own slot uids, no group limit on failures); with
    ``--base-url``, its model is that endpoint, through Atropos's server manager."""
    config, servers = SoakEnv.config_init()
    if args.base_url is not None:
        servers = [
            APIServerConfig(
                server_type="openai", base_url=args.base_url, model_name="stub-model",
                api_key="EMPTY", timeout=60,
            )
        ]  # fmt: skip
    config.group_size = args.group_size
    config.local_containers = args.servers
    config.slots_per_container = args.slots
    config.slot_uid_base = SLOT_UID_BASE
    config.max_turns = len(STEPS) + 2
    config.slot_lifetime_s = 120.0
    config.max_failed_groups = None
    config.include_messages = True
    config.max_token_length = 32768  # the long output's tokens kept: no cut to log
    return SoakEnv(config, servers)


@attrs.define
class Soak:
    """The env process's run: ``workers`` loops of Atropos's process step, paused for each
    sample so that every sample is taken at rest (no group in flight)."""

    env: SoakEnv
    args: argparse.Namespace
    done: dict[str, int] = attrs.field(factory=lambda: {"trajectories": 0, "groups": 0})
    deadline: float = attrs.field(init=False)
    stop: asyncio.Event = attrs.field(factory=asyncio.Event)
    gate: asyncio.Event = attrs.field(factory=asyncio.Event)  # clear: a sample is due
    idle: asyncio.Event = attrs.field(factory=asyncio.Event)  # set: no group in flight
    running: int = 0

    def __attrs_post_init__(self) -> None:
        self.deadline = time.monotonic() + self.args.minutes * 60
        self.gate.set()
        self.idle.set()

    async def sampled(self) -> None:
        """One sample line; the parent reads /proc, then answers on stdin."""
        line = {
            "tag": "sample", "tasks": len(asyncio.all_tasks()),
            "objects": len(gc.get_objects()), **self.done,
        }  # fmt: skip
        print(json.dumps(line), flush=True)
        await asyncio.to_thread(sys.stdin.readline)

    async def one_group(self) -> None:
        """What Atropos's ``process`` does with one item (wandb off: nothing sent)."""
        env = self.env
        atropos: Any = env  # Atropos's BaseEnv methods, untyped there
        item = await env.get_next_item()
        scored, _ = await env.collect_trajectories(item)
        if scored is not None:
            processed = await atropos.postprocess_histories(scored)
            await atropos.handle_send_to_api(
                processed, item, do_send_to_api=False, abort_on_any_max_length_exceeded=False
            )
        await env.wandb_log()

    async def worker(self) -> None:
        while not self.stop.is_set():
            await self.gate.wait()
            if self.stop.is_set():
                return
            self.running += 1
            self.idle.clear()
            try:
                await self.one_group()
            finally:
                self.running -= 1
                if self.running == 0:
                    self.idle.set()
            self.done["groups"] += 1
            self.done["trajectories"] += self.args.group_size
            if self.done["trajectories"] >= self.args.trajectories or (
                time.monotonic() >= self.deadline
            ):
                self.stop.set()
                self.gate.set()

    async def sampler(self) -> None:
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(self.stop.wait(), self.args.sample_s)
            except TimeoutError:
                self.gate.clear()  # the groups in flight end; no new one starts
                await self.idle.wait()
                if not self.stop.is_set():
                    await self.sampled()
                self.gate.set()

    async def run(self) -> None:
        """Sample with the pool up and idle, run, sample again before the pool closes."""
        await self.env.setup()
        policy = scripted_policy(self.env, script) if self.args.base_url is None else None
        async with self.env.rollout_services(policy=policy):
            await self.sampled()
            workers = [asyncio.create_task(self.worker()) for _ in range(self.args.workers)]
            sampling = asyncio.create_task(self.sampler())
            await asyncio.gather(*workers)
            await sampling
            await self.sampled()
        print(json.dumps({"tag": "end", **self.done}), flush=True)


# ------------------------------------------------------------------------- /proc (parent)


def _status(pid: int) -> dict[str, str]:
    fields: dict[str, str] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _kib(text: str) -> int:
    return int(text.split(maxsplit=1)[0])


def pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return _kib(line.split(":", 1)[1])
    return 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def children_of() -> dict[int, list[int]]:
    """Every process's children, from one pass over ``/proc``."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                after = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(after[1]), []).append(int(entry))
    return tree


def descendants(pid: int, tree: dict[int, list[int]]) -> list[int]:
    found: list[int] = []
    todo = list(tree.get(pid, []))
    while todo:
        one = todo.pop()
        found.append(one)
        todo.extend(tree.get(one, []))
    return found


def slot_uid_processes(uids: Sequence[range]) -> int:
    """Processes whose owner is one of ``uids``."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        count += any(uid in span for span in uids)
    return count


def files_under(root: Path) -> int:
    count = 0
    for _, dirs, names in os.walk(root):
        count += len(dirs) + len(names)
    return count


def bytes_under(root: Path) -> int:
    """Allocated bytes of the files under ``root`` (as ``du`` counts them; none followed)."""
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total


def cgroups_of(servers: Sequence[int]) -> int:
    """The cgroup folders the slot servers ``servers`` made (``trajcore-PID-*``, in every
    hierarchy) and the folders below them (a slot's each)."""
    prefixes = tuple(f"trajcore-{pid}-" for pid in servers)
    count = 0
    for folder, dirs, _ in os.walk("/sys/fs/cgroup"):
        depth = folder.count("/") - 3
        for name in dirs:
            if name.startswith(prefixes):
                count += sum(1 + len(below) for _, below, _ in os.walk(os.path.join(folder, name)))
        if depth >= 3:
            dirs[:] = []  # the servers' folders sit at most this deep
        else:
            dirs[:] = [name for name in dirs if not name.startswith(prefixes)]
    return count


def slot_uids(pid: int) -> range:
    """The host uids of slot server ``pid``'s slots, from its command line."""
    words = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    slots = int(words[words.index("--slots") + 1])
    base = next(int(w.split("=", 1)[1]) for w in words if w.startswith("--slot-uid-base="))
    return range(base, base + slots)


def is_slot_server(pid: int) -> bool:
    try:
        return b"trajcore.entrypoints.slot_server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@attrs.frozen
class Resource:
    """A figure sampled over the run, with the growth per 1,000 trajectories it may show."""

    name: str
    unit: str
    limit: float  # per 1,000 trajectories
    scale: float = 1.0  # the raw figure divided by this, as printed
    noise: float = 0.0  # a rise of the floor, as printed, that is not yet growth (pages)


JUDGED_FROM = 500
"""The fewest trajectories whose samples are judged for growth (``parent``): before that the
second half of a run is still its warm-up (a minute's run read +1 fd and +0.7 MiB of the slot
servers there, and nothing after)."""

RESOURCES: tuple[Resource, ...] = (
    Resource("env RSS", "MiB", 4.0, 1024, noise=2.0),
    Resource("env PSS", "MiB", 4.0, 1024, noise=2.0),
    Resource("env fds", "", 1.0),
    Resource("env threads", "", 1.0),
    Resource("env asyncio tasks", "", 1.0),
    Resource("env gc objects", "k", 5.0, 1000, noise=10.0),
    Resource("env descendants", "", 1.0),
    Resource("servers RSS (sum)", "MiB", 4.0, 1024, noise=2.0),
    Resource("servers fds (sum)", "", 1.0),
    Resource("servers threads (sum)", "", 1.0),
    Resource("servers descendants", "", 1.0),
    Resource("model server RSS", "MiB", 4.0, 1024, noise=2.0),
    Resource("model server fds", "", 1.0),
    Resource("slot-uid processes", "", 1.0),
    Resource("files under TMPDIR", "", 1.0),
    Resource("bytes under TMPDIR", "MiB", 1.0, MIB),
    Resource("slot cgroups", "", 1.0),
)


def sample(
    env_pid: int, model_pid: int | None, said: dict[str, Any], tmp: Path, uids: dict[int, range]
) -> dict[str, float]:
    """Every resource of ``RESOURCES`` now (raw: KiB for memory)."""
    tree = children_of()
    status = _status(env_pid)
    family = descendants(env_pid, tree)
    servers = [pid for pid in tree.get(env_pid, []) if is_slot_server(pid)]
    server_rss = server_fds = server_threads = server_descendants = 0
    for pid in servers:
        if pid not in uids:
            uids[pid] = slot_uids(pid)
        try:
            server_status = _status(pid)
            server_rss += _kib(server_status["VmRSS"])
            server_threads += int(server_status["Threads"])
            server_fds += fds(pid)
        except (OSError, KeyError):
            continue
        server_descendants += len(descendants(pid, tree))
    model_rss = model_fds = 0
    if model_pid is not None:
        model_rss, model_fds = _kib(_status(model_pid)["VmRSS"]), fds(model_pid)
    return {
        "model server RSS": model_rss,
        "model server fds": model_fds,
        "env RSS": _kib(status["VmRSS"]),
        "env PSS": pss_kib(env_pid),
        "env fds": fds(env_pid),
        "env threads": int(status["Threads"]),
        "env asyncio tasks": int(said["tasks"]),
        "env gc objects": int(said["objects"]),
        "env descendants": len(family),
        "servers RSS (sum)": server_rss,
        "servers fds (sum)": server_fds,
        "servers threads (sum)": server_threads,
        "servers descendants": server_descendants,
        "slot-uid processes": slot_uid_processes(list(uids.values())),
        "files under TMPDIR": files_under(tmp),
        "bytes under TMPDIR": bytes_under(tmp),
        "slot cgroups": cgroups_of(list(uids)),  # of every server seen, killed ones too
    }


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` over ``xs`` (0 with fewer than two distinct xs)."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


@attrs.frozen
class Row:
    """One resource over the run. ``floor_rose``: no sample of the second half is below any of
    the first (the pool's first, idle sample aside) and the last is above them all: a bounded
    figure that moves about (connections kept, threads of a pool) does not do that, a leak
    does."""

    resource: Resource
    first: float
    middle: float
    last: float
    per_thousand: float
    floor_rose: bool

    @property
    def verdict(self) -> str:
        if self.per_thousand <= self.resource.limit:
            return "flat"
        return "GROWS" if self.floor_rose else "noisy"


def rows(points: Sequence[tuple[int, dict[str, float]]]) -> Iterator[Row]:
    """Each resource's figures; the slope over the second half of ``points``."""
    half = len(points) // 2
    second = points[half:] if len(points) >= 4 else points
    xs = [float(done) for done, _ in second]
    for resource in RESOURCES:
        at = [values[resource.name] / resource.scale for _, values in points]
        ys = at[half:] if len(points) >= 4 else at
        before = max(at[1:half], default=at[0])
        rose = len(points) >= 4 and min(at[half:]) >= before and at[-1] > before + resource.noise
        yield Row(resource, at[0], at[half], at[-1], slope(xs, ys) * 1000, rose)


@attrs.define
class Run:
    """What the parent saw: the samples, the child's last line and exit status, its failures,
    what was left after it ended and how long the slot-uid processes took to go."""

    points: list[tuple[int, dict[str, float]]] = attrs.field(factory=list)
    end: dict[str, Any] = attrs.field(factory=dict)
    status: int = 0
    failures: int = 0
    log_tail: str = ""
    files_left: int = 0
    processes_left: int = 0
    uids: dict[int, range] = attrs.field(factory=dict)  # each slot server's slot uids
    killed: int = 0  # slot servers killed (--kill-every)
    waited_s: float = 0.0


def watch(
    args: argparse.Namespace,
    child: subprocess.Popen[str],
    model: subprocess.Popen[str] | None,
    tmp: Path,
    run: Run,
) -> None:
    """Sample at each of the child's sample lines (with ``--kill-every K``, SIGKILL one slot
    server after every K-th), then tell it to go on."""
    assert child.stdout is not None
    assert child.stdin is not None
    started = time.monotonic()
    for line in child.stdout:
        if not line.startswith("{"):
            continue
        said = json.loads(line)
        if said["tag"] == "end":
            run.end = said
            continue
        values = sample(child.pid, None if model is None else model.pid, said, tmp, run.uids)
        run.points.append((int(said["trajectories"]), values))
        if args.kill_every and len(run.points) % args.kill_every == 0 and said["groups"]:
            servers = sorted(p for p in children_of().get(child.pid, []) if is_slot_server(p))
            if servers:  # a server the pool started for this run: it replaces it
                os.kill(servers[run.killed % len(servers)], signal.SIGKILL)
                run.killed += 1
        child.stdin.write("go\n")
        child.stdin.flush()
        print(
            f"  t={time.monotonic() - started:6.0f} s  trajectories={said['trajectories']:6d}  "
            f"env RSS {values['env RSS'] / 1024:.1f} MiB  fds {values['env fds']:.0f}  "
            f"tasks {values['env asyncio tasks']:.0f}  servers RSS "
            f"{values['servers RSS (sum)'] / 1024:.1f} MiB  TMPDIR files "
            f"{values['files under TMPDIR']:.0f}",
            flush=True,
        )


@contextlib.contextmanager
def model_server(log: IO[str], environ: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """``trajcore model`` serving ``script`` on loopback (its URL is its first line)."""
    argv = [sys.executable, "-m", "trajcore.entrypoints.cli", "model", f"{SELF}:script"]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=environ)
    try:
        yield server
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        server.wait()


def soak(args: argparse.Namespace) -> Run:
    """Run the env process to its end under its own TMPDIR and watch it; what is left after."""
    run = Run()
    tmp = Path(tempfile.mkdtemp(prefix="trajcore-soak-"))
    tmp.chmod(0o755)  # the slots' uids pass through it to their workspaces, as through /tmp
    environ = {**os.environ, "TMPDIR": str(tmp)}
    argv = [sys.executable, str(SELF), "--child", *sys.argv[1:]]
    kept = open(args.log, "w+") if args.log else tempfile.TemporaryFile("w+")  # noqa: SIM115
    with kept as log, contextlib.ExitStack() as stack:  # outside TMPDIR
        model: subprocess.Popen[str] | None = None
        if args.model == "http":
            model = stack.enter_context(model_server(log, environ))
            assert model.stdout is not None
            argv += ["--base-url", model.stdout.readline().strip()]
        child = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
            env=environ,
        )  # fmt: skip
        try:
            watch(args, child, model, tmp, run)
        finally:
            if child.poll() is None:
                child.terminate()
            run.status = child.wait()
            stack.close()
        run.files_left = files_under(tmp)
        gone_at = time.monotonic()
        run.processes_left = slot_uid_processes(list(run.uids.values()))
        while run.processes_left and time.monotonic() - gone_at < 10:  # a pid namespace's end
            time.sleep(0.1)  # is not at once
            run.processes_left = slot_uid_processes(list(run.uids.values()))
        run.waited_s = time.monotonic() - gone_at
        shutil.rmtree(tmp, ignore_errors=True)
        log.seek(0)
        lines = log.readlines()
    run.failures = sum("failed (" in line for line in lines)
    run.log_tail = "".join(lines[-30:])
    return run


def parent(args: argparse.Namespace) -> int:
    started = time.monotonic()
    run = soak(args)
    elapsed = time.monotonic() - started
    points = run.points
    if run.status != 0 or len(points) < 2:
        print(run.log_tail, end="")
        print(f"the env process ended with status {run.status} after {len(points)} samples")
        return 1
    trajectories = int(run.end.get("trajectories", points[-1][0]))
    print(
        f"\ncpus={os.cpu_count()}  {trajectories} trajectories ({run.end.get('groups')} groups) "
        f"in {elapsed:.0f} s = {trajectories / elapsed:.1f} traj/s; {len(points)} samples; "
        f"{args.workers} groups of {args.group_size} at a time; {args.servers} slot servers x "
        f"{args.slots} slots (bwrap); {run.failures} members failed (as the soak makes some); "
        f"{run.killed} slot servers killed"
    )
    print(f"{'resource':<26}{'first':>10}{'middle':>10}{'last':>10}{'per 1k traj':>13}"
          f"{'limit':>8}  verdict")  # fmt: skip
    if args.samples:
        with open(args.samples, "w") as out:
            for done, values in points:
                out.write(json.dumps({"trajectories": done, **values}) + "\n")
    failed = 0
    judged = trajectories >= JUDGED_FROM
    for row in rows(points):
        unit = f" {row.resource.unit}" if row.resource.unit else ""
        verdict = row.verdict if judged or row.verdict == "flat" else f"({row.verdict}: too short)"
        print(
            f"{row.resource.name + unit:<26}{row.first:>10.1f}{row.middle:>10.1f}{row.last:>10.1f}"
            f"{row.per_thousand:>+13.2f}{row.resource.limit:>8.1f}  {verdict}"
        )
        failed += judged and row.verdict == "GROWS"
    print(
        f"after the run: {run.files_left} files left under TMPDIR, {run.processes_left} "
        f"slot-uid processes left {run.waited_s:.1f} s after the env process ended"
    )
    failed += run.files_left > 0 or run.processes_left > 0
    if not judged:
        print(
            f"growth is judged from {JUDGED_FROM} trajectories on (a shorter run's second half is "
            f"still its warm-up: pools of connections and threads filling); this run's "
            f"{trajectories} are a smoke of the soak only: --minutes 10 or more for a verdict"
        )
    clean = "no resource grows" if judged else "nothing left after the run; growth not judged"
    print(f"VERDICT: {clean if failed == 0 else f'{failed} findings'}")
    return 0 if failed == 0 else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=1.0, help="how long the run lasts")
    parser.add_argument(
        "--trajectories", type=int, default=10**9, help="stop after this many trajectories"
    )
    parser.add_argument("--workers", type=int, default=6, help="groups at a time")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--servers", type=int, default=2, help="slot servers")
    parser.add_argument("--slots", type=int, default=16, help="slots per server")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    parser.add_argument(
        "--model", choices=("http", "script"), default="http",
        help="http: the script served by `trajcore model`, reached through Atropos's server "
        "manager (OpenAI mode); script: the script in the env process",
    )  # fmt: skip
    parser.add_argument("--log", help="keep the env's and the model server's stderr here")
    parser.add_argument("--samples", help="write every sample here, as JSON lines")
    parser.add_argument(
        "--kill-every", type=int, default=0, metavar="K",
        help="SIGKILL one slot server after every K-th sample (the pool replaces it); 0: never",
    )  # fmt: skip
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(Soak(soak_env(args), args).run())
        return
    raise SystemExit(parent(args))


if __name__ == "__main__":
    main()
