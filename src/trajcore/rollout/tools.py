"""Where a trajectory's tool calls go, and the slot-bound toolbox the env's hooks get.

``ToolRouter`` sends each call to the place that serves its tool: a slot tool (``bash``,
``bash_stateful``, ``tmux``, ``read_file``, ``write_file``) runs in the trajectory's own slot
through the batching ``ToolDispatcher``; any other offered tool goes to the external
``ToolServer`` with the trajectory's context; a tool that was not offered is ``REJECTED`` without
running. Results come back in the order of the calls. The timeout of a slot call is the env's
(``tool_timeout_s``); whatever ``timeout`` the model wrote into its arguments is only ever a
request the slot server may shorten to, never lengthen past, the env's figure.

``SlotTools`` is the ToolContext of the hooks (prepare the workspace, verify and score): the same
router, bound to the trajectory's lease, with typed helpers for the common cases. Its calls go
out marked as the hooks' (``SlotCall.hook``): a ``bash`` command of theirs may use the process
reserve the model's commands leave free, so a check still starts when the model's leftover
processes hold all they may (docs/sandbox.md, "Processes"). Its helpers
cannot lie to a score: ``check`` and ``run`` answer with what the command did and raise
``SlotInfraError`` when the slot could not run it (an infrastructure error, a refusal, a lost
lease), and file reads and writes raise ``SlotFileError`` (the slot's ``TOOL_ERROR``: what the
model left at the path, for the env to score) or ``SlotInfraError``, and ``InvalidInput`` for a
path of the hook's own that names no file of the workspace; the trajectory runner turns a
``SlotInfraError`` raised from the scoring hook into an infrastructure failure, never a 0,
except ``SlotBudgetSpent`` (the lease was ended for the disk budget the model spent), which
gives the member ``sandbox_budget_score``.
``pytest`` uploads a test tree, runs pytest in the slot and reads its outcome
(``trajcore.rollout.pytest_outcome``). ``fork`` opens n copies of a lease over a task
environment, from its current files (``EnvironmentPool.snapshot`` and ``lease_from``).
"""

from __future__ import annotations

import itertools
import math
import shlex
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

import anyio
import attrs

from trajcore.domain import validators
from trajcore.domain.environment_leases import EnvironmentUnavailable, ForkRefused, Snapshot
from trajcore.domain.errors import (
    AcquireTimeout,
    InvalidInput,
    SlotBudgetSpent,
    SlotFileError,
    SlotInfraError,
    ToolServerError,
)
from trajcore.domain.file_calls import text_problem
from trajcore.domain.json_values import JSONObject
from trajcore.domain.slot_protocol import SLOT_TOOLS, home_relative, workspace_path_problem
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tools import (
    ExecReport,
    ToolCall,
    ToolContext,
    ToolOutcome,
    ToolResult,
)
from trajcore.ports.sandbox_pool import EnvironmentPool, SandboxPool
from trajcore.ports.tool_server import ToolServer
from trajcore.rollout.awaited import CallLog, remembered
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.pytest_outcome import PytestOutcome, read_pytest_outcome

__all__ = ["SlotTools", "ToolRouter", "capped"]

_LEAST_CALL_S = 0.01  # the least time a turn's calls get, when the turns' deadline is that near


@attrs.define
class ToolRouter:
    """Routes one trajectory's calls to its slot or to the tool server.

    Attributes:
        lease: The trajectory's slot.
        dispatcher: The shared batching dispatcher.
        tool_server: External tools, or ``None`` when the env has none.
        offered: The tools the model was offered (by name); others are refused.
        tool_timeout_s: The env's limit for one slot call.
        trajectory_id: For the tool server's context.
        hook: Its calls are the env's hooks' (``SlotTools``), not the model's: their commands
            may use the lease's process reserve (docs/sandbox.md, "Processes").
        time_left_s: The time the calls of one ``run`` have left in the slot, all together
            (``SlotCall.time_left_s``: a slot runs them one after another), or ``None``.
    """

    lease: Lease
    dispatcher: ToolDispatcher
    tool_server: ToolServer | None
    offered: frozenset[str]
    tool_timeout_s: float
    trajectory_id: str
    hook: bool = attrs.field(default=False, kw_only=True)
    time_left_s: float | None = attrs.field(default=None, kw_only=True)
    # shared by every router evolved from this one (the hooks', a fork's): see ``run``
    _sent: itertools.count[int] = attrs.field(
        factory=lambda: itertools.count(1), kw_only=True, eq=False, repr=False
    )
    # (when, what): the hooks' calls a cancellation ended unanswered (``calls_cut_since``)
    _cut: list[tuple[float, str]] = attrs.field(factory=list, kw_only=True, eq=False, repr=False)

    def calls_cut_since(self, since: float) -> list[str]:
        """The hooks' calls (through this router or one evolved from it) that a cancellation
        ended, by the dispatcher's clock at ``since`` or later, before they were answered:
        ``bash 'sleep 9'``, ``read_file {"path": "a.txt"}``; in the order they were cut."""
        return [what for when, what in self._cut if when >= since]

    async def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One result per call, in order; failures are results (see ``ToolOutcome``).

        A slot remembers a lease's results by call id (a repeated id is a retry, answered
        without running again), but a model's ids need only be unique within one turn: servers
        that number each turn's calls from ``call_0`` exist. So each call goes to the slot
        under an id of its own in this lease (the model's id, then ``#`` and a count), and its
        result comes back under the model's id. The count is shared with the routers evolved
        from this one (the hooks' ``SlotTools``), so no hook's call has a model's call's id,
        whatever ids the model writes: its result is never the model's.

        A hook's call (``hook``) that a cancellation ends before it is answered is remembered
        (``calls_cut_since``): the trajectory runner names it when a hook meets its deadline.
        """
        if not self.hook:
            return await self._run(calls)
        try:
            return await self._run(calls)
        except anyio.get_cancelled_exc_class():
            now = self.dispatcher.clock()
            self._cut.extend((now, _described(call)) for call in calls)
            raise

    async def run_turn(
        self, calls: Sequence[ToolCall], time_left_s: float, turns: anyio.CancelScope | None,
        wait_s: float,
    ) -> list[ToolResult]:  # fmt: skip
        """``run`` for a model's turn with ``time_left_s`` before the turns' deadline, which
        ``turns`` (when given) enforces: its slot calls get that time all together
        (``SlotCall.time_left_s``, each timeout cut to it too), so they end by then in the slot
        however many they are, and ``turns`` waits up to ``wait_s`` past its deadline for their
        results (the slot is busy with them until then anyway) before it ends the turns; its
        deadline is put back after. Results as ``run``'s (none for no calls)."""
        if time_left_s <= 0:  # the model answered past the turns' deadline: nothing starts
            return self.unanswered(
                calls, "not run: its turn's time had run out when the model asked for it"
            )
        time_left_s = max(time_left_s, _LEAST_CALL_S)
        router = attrs.evolve(
            self, tool_timeout_s=min(self.tool_timeout_s, time_left_s), time_left_s=time_left_s
        )
        if turns is None:
            return await router.run(calls)
        deadline = turns.deadline
        turns.deadline = max(deadline, anyio.current_time() + time_left_s + wait_s)
        try:
            return await router.run(calls)
        finally:
            turns.deadline = deadline

    def unanswered(self, calls: Sequence[ToolCall], why: str) -> list[ToolResult]:
        """A model's ``calls`` that time ended unrun or unfinished, answered as such: each
        offered one ``TIMEOUT`` saying ``why``, any other an unknown tool (as ``run`` does)."""
        return [
            ToolResult.failure(c, ToolOutcome.TIMEOUT, why)
            if c.name in self.offered
            else ToolResult.unknown_tool(c)
            for c in calls
        ]

    async def _run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """``run``'s work."""
        results: list[ToolResult | None] = [None] * len(calls)
        at: list[int] = []  # where each slot call's result goes
        sent: list[SlotCall] = []
        external: list[tuple[int, ToolCall]] = []
        for i, call in enumerate(calls):
            if call.name not in self.offered:
                results[i] = ToolResult.unknown_tool(call)
            elif call.name in SLOT_TOOLS:
                # Built directly rather than by attrs.evolve, which costs about as much again.
                slot_call = ToolCall(
                    id=f"{call.id}#{next(self._sent)}", name=call.name, arguments=call.arguments
                )
                at.append(i)
                timeout_s, hook, left = self.tool_timeout_s, self.hook, self.time_left_s
                bound = SlotCall(
                    lease=self.lease, call=slot_call, timeout_s=timeout_s, hook=hook,
                    time_left_s=left,
                )  # fmt: skip
                sent.append(bound)
            else:
                external.append((i, call))

        async def slot_calls() -> None:
            for i, answer in zip(at, await self.dispatcher.run(sent), strict=True):
                results[i] = answer.answering(calls[i].id)

        async def external_calls() -> None:
            for (i, _), answer in zip(external, await self._external(external), strict=True):
                results[i] = answer

        if sent and external:  # side by side: neither kind waits out the other's time
            async with anyio.create_task_group() as group:
                group.start_soon(slot_calls)
                group.start_soon(external_calls)
        elif sent:
            await slot_calls()
        elif external:
            await external_calls()
        # every place is filled; no comprehension: on this path each is a call of its own
        return list(filter(None, results))

    async def _external(self, calls: Sequence[tuple[int, ToolCall]]) -> list[ToolResult]:
        """The tool server's results for ``calls``; within ``time_left_s`` when it is set (a
        model's turn): past it, each is ``TIMEOUT``, the policy's time."""
        plain = [call for _, call in calls]
        if self.tool_server is None:
            return [
                ToolResult.failure(c, ToolOutcome.REJECTED, f"no tool server serves {c.name!r}")
                for c in plain
            ]
        context = ToolContext(trajectory_id=self.trajectory_id, slot=str(self.lease.slot))
        left = math.inf if self.time_left_s is None else self.time_left_s
        try:
            with anyio.move_on_after(left):
                return await self.tool_server.execute(plain, context=context)
        except ToolServerError as exc:
            return ToolResult.infra_errors(plain, str(exc))
        why = f"its turn's time ({left:.3g} s) ran out before the tool server answered"
        return [ToolResult.failure(c, ToolOutcome.TIMEOUT, why) for c in plain]


def _described(call: ToolCall) -> str:
    """``call`` in a few words: ``bash 'sleep 9'``, else its name and JSON arguments (cut)."""
    command = call.arguments.get("command")
    if call.name == "bash" and isinstance(command, str):
        text = f"bash {command!r}"
    else:
        text = f"{call.name} {call.arguments_json()}"
    return text if len(text) <= 200 else f"{text[:197]}..."


def _never_ran(result: ToolResult, report: ExecReport) -> bool:
    """Whether ``report`` says its command never started: no exit code, no timeout, and no
    kill by a signal (the slot server's ``killed by signal N``, the command's own answer)."""
    if report.exit_code is not None or report.timed_out or result.outcome is ToolOutcome.OK:
        return False
    return not (result.error or "").startswith("killed by signal")


def _checked_path(tool: str, path: str) -> None:
    """Raise ``InvalidInput`` (field ``path``) when a hook's ``path`` can name nothing in the
    workspace, whatever the model left there: not text, empty, absolute, with ``..`` (``~``
    is the workspace, and ``~//x`` is its ``x``, as in a shell). The hook's own mistake, so an
    ``env_error``, never the model's ``SlotFileError`` nor the slot's ``SlotInfraError``."""
    if not isinstance(path, str):
        raise InvalidInput("path", f"{tool}: must be a string, got {type(path).__name__}")
    problem = workspace_path_problem(home_relative(path))
    if problem is not None:
        raise InvalidInput("path", f"{tool}: {problem}")


def _checked_text(tool: str, field: str, text: str) -> None:
    """Raise ``InvalidInput`` (``field``) when a hook's ``text`` holds a lone surrogate (a
    model's ``\\udcff`` read from its tool call's JSON): no UTF-8 carries it, so every pool
    refuses the call (``file_calls.text_problem``), which reads as the slot's failure
    (``SlotInfraError``, an infra error) where it is the hook's text (``escape_lone_surrogates``
    writes it as text)."""
    problem = text_problem(text)
    if problem is not None:
        raise InvalidInput(field, f"{tool}: {problem}")


@attrs.define
class SlotTools:
    """The hooks' toolbox, bound to one trajectory's slot (the ToolContext of env authors).

    Every method runs through the same router as the model's calls, so the work happens in the
    very slot the model used, under the same isolation.

    Attributes:
        router: The trajectory's router (its lease).
        pool: The pool the lease is of (``fork`` needs it), or ``None``.
        environment: The task environment the lease runs over (``fork`` needs it), or ``None``.
        call_log: The coroutines its methods made, so a hook's forgotten ``await`` is found
            (``trajcore.rollout.awaited``).
    """

    router: ToolRouter
    _ids: itertools.count[int] = attrs.field(factory=itertools.count, init=False)
    pool: SandboxPool | None = attrs.field(default=None, kw_only=True)
    environment: str | None = attrs.field(default=None, kw_only=True)
    call_log: CallLog = attrs.field(factory=CallLog, init=False, repr=False, eq=False)

    @property
    def lease(self) -> Lease:
        return self.router.lease

    @remembered("tools")
    async def call(self, name: str, arguments: JSONObject | None = None) -> ToolResult:
        """Run any tool (slot or external) and return its result.

        ``bash_stateful`` and ``tmux`` run in the model's own persistent shell, which the model
        may have rewired to report what it likes: score from ``run``/``check`` instead.
        """
        call = ToolCall(id=f"ctx_{next(self._ids)}", name=name, arguments=dict(arguments or {}))
        router = attrs.evolve(self.router, offered=self.router.offered | {name}, hook=True)
        (result,) = await router.run([call])
        return result

    @asynccontextmanager
    async def fork(
        self, n: int, *, timeout_s: float | None = None
    ) -> AsyncIterator[list[SlotTools]]:
        """``n`` leases started from this lease's current state, as ``n`` toolboxes: for
        tree-shaped rollouts and for retrying a turn.

        The lease is frozen (``EnvironmentPool.snapshot``: what it wrote over the image and its
        workspace) and ``n`` leases of the same pool start from that snapshot copy-on-write,
        each on the snapshot's slot server; each toolbox is bound to its own lease and writes
        to its own copy. Leaving the block releases them (reset as any lease) and drops the
        snapshot. This lease goes on as it was, over its own snapshot, with one exception:
        **a snapshot holds files, not processes**, so taking it ends every process this lease
        was running (a ``bash_stateful`` shell, a ``tmux`` session, a background job); the
        forks start with none either.

        ``timeout_s`` bounds the wait for the ``n`` slots on that server, all together (``None``:
        the pool's ``fork_wait_s``): the ``n`` leases are asked at once, so that the pool's
        client starts them in one request to the slot server; leases already opened are
        released when the rest cannot be.

        Raises:
            InvalidInput: ``n`` is not a positive integer, or ``timeout_s`` is negative or NaN.
            ForkRefused: ``reason`` ``no_environment`` (this lease runs over no task
                environment), ``no_snapshots`` (its pool takes none), ``snapshot_refused`` (the
                pool or the server would not freeze it; this lease goes on as it was) or
                ``no_slots`` (the snapshot's server had not ``n`` slots free in time).
            EnvironmentUnavailable: a fork's server refused the image itself.
        """
        validators.check_argument(validators.positive_int, "n", n)
        if timeout_s is not None and not timeout_s >= 0:
            raise InvalidInput("timeout_s", f"must be seconds >= 0, got {timeout_s!r}")
        lease, pool, environment = self.lease, self.pool, self.environment
        if environment is None:
            raise ForkRefused("no_environment", f"lease {lease.slot} runs over no task environment")
        if pool is None or not isinstance(pool, EnvironmentPool):
            raise ForkRefused(
                "no_snapshots", f"the pool of lease {lease.slot} ({type(pool).__name__}) takes none"
            )
        try:
            snapshot = await pool.snapshot(lease, environment)
        except EnvironmentUnavailable as error:
            raise ForkRefused("snapshot_refused", str(error)) from None
        batch = next(self._ids)
        try:
            async with self._forks(pool, snapshot, batch, n, timeout_s) as opened:
                forks: list[SlotTools] = []
                for index, (got, forked) in enumerate(opened):
                    if not forked:
                        raise ForkRefused(
                            "no_slots",
                            f"fork {index + 1} of {n} from {lease.slot}: no slot of "
                            f"{snapshot.container} came free in time (got {got.slot})",
                        )
                    holder = f"{self.router.trajectory_id}/fork{batch}-{index}"
                    router = attrs.evolve(self.router, lease=got, trajectory_id=holder)
                    child = SlotTools(router, pool=pool, environment=environment)
                    child.call_log = self.call_log  # a child's forgotten await is the hook's
                    forks.append(child)
                yield forks
        finally:
            with anyio.CancelScope(shield=True):
                await pool.drop_snapshot(snapshot)

    @asynccontextmanager
    async def _forks(
        self, pool: EnvironmentPool, snapshot: Snapshot, batch: int, n: int,
        timeout_s: float | None,
    ) -> AsyncIterator[list[tuple[Lease, bool]]]:  # fmt: skip
        """The ``n`` leases from ``snapshot``, asked all at once (so that the pool's client
        sends them to the slot server in one request), held until the block ends; all of them
        are released when one cannot be had (``ForkRefused`` ``no_slots`` for a wait that ran
        out, else what the pool raised)."""
        opened: list[tuple[Lease, bool] | None] = [None] * n
        failures: list[tuple[int, Exception]] = []
        settled, release = anyio.Event(), anyio.Event()
        left = [n]

        def done() -> None:
            left[0] -= 1
            if left[0] == 0:
                settled.set()

        async def hold(index: int) -> None:
            holder = f"{self.router.trajectory_id}/fork{batch}-{index}"
            leasing = pool.lease_from(holder, snapshot, timeout_s=timeout_s, fork_wait_s=timeout_s)
            entered = False
            try:
                async with leasing as got:
                    entered, opened[index] = True, got
                    done()
                    await release.wait()
            except Exception as error:
                if entered:
                    raise
                failures.append((index, error))
                done()

        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            try:
                for index in range(n):
                    group.start_soon(hold, index)
                await settled.wait()
                failure = self._fork_failure(failures, n)
                if failure is None:
                    try:
                        yield [got for got in opened if got is not None]
                    except Exception as error:  # noqa: BLE001 - raised once the leases are released
                        failure = error
            finally:
                release.set()
        if failure is not None:
            raise failure

    def _fork_failure(self, failures: list[tuple[int, Exception]], n: int) -> Exception | None:
        """What ``fork`` raises for the forks that could not be opened (the first one's)."""
        if not failures:
            return None
        index, error = min(failures, key=lambda failed: failed[0])
        if isinstance(error, AcquireTimeout):
            return ForkRefused(
                "no_slots", f"fork {index + 1} of {n} from {self.lease.slot}: {error}"
            )
        return error

    @remembered("tools")
    async def bash(self, command: str) -> ToolResult:
        """Run ``command`` with ``/bin/sh`` in the slot's workspace and return the raw result.

        For verification use ``check`` or ``run``: they raise when the slot failed, where this
        returns the failure as a result that is easy to misread as the command's own.
        """
        return await self.call("bash", {"command": command})

    @remembered("tools")
    async def run(self, command: str, *, timeout_s: float | None = None) -> ExecReport:
        """Run ``command`` with ``/bin/sh`` in the slot's workspace and report what it did.

        A non-zero exit code, a kill by signal and a timeout are the command's answers:
        ``exit_code``, and ``timed_out`` set for a timeout. A report with none of them (the
        slot could not start the command: no ``/bin/sh``, a failed spawn) is no answer.
        ``timeout_s`` may only shorten the env's limit for one tool call.

        Raises:
            SlotInfraError: the slot could not run it: ``INFRA_ERROR``, ``REJECTED`` (also a lost
                or stale lease), a result without a report, or one that says the command never
                started (no exit code, no timeout, no signal); ``SlotBudgetSpent`` when the
                lease was ended for a budget the model spent (the rollout scores that member
                ``sandbox_budget_score``).
            InvalidInput: ``command`` holds a lone surrogate (no UTF-8 carries it): the hook's
                text; nothing is sent.
        """
        _checked_text("bash", "command", command)
        arguments: JSONObject = {"command": command}
        if timeout_s is not None:
            arguments["timeout"] = timeout_s
        result = await self.call("bash", arguments)
        self._budget_spent(f"bash {command!r}", result)
        if result.outcome in (ToolOutcome.INFRA_ERROR, ToolOutcome.REJECTED):
            raise SlotInfraError(
                f"bash {command!r} in slot {self.lease.slot}: {result.outcome.value}: "
                f"{result.error}"
            )
        report = result.exec
        if report is None:
            # the reason is the slot's answer (a lease ended for its disk budget says so)
            raise SlotInfraError(
                f"bash {command!r} in slot {self.lease.slot}: {result.outcome.value} "
                f"without an exec report: {result.error}"
            )
        if result.outcome is ToolOutcome.TIMEOUT and not report.timed_out:
            report = attrs.evolve(report, timed_out=True)
        if _never_ran(result, report):
            # no exit code, no timeout, no signal: the command never started (the slot could
            # not spawn its shell), so there is no answer of the command's to give
            raise SlotInfraError(
                f"bash {command!r} in slot {self.lease.slot}: the command never ran: {result.error}"
            )
        return report

    @remembered("tools")
    async def check(self, command: str, *, timeout_s: float | None = None) -> bool:
        """Whether ``command`` exits with code 0 in the slot's workspace (a timeout is False).

        Raises:
            SlotInfraError: as ``run``: the slot could not run it, so there is no answer.
        """
        report = await self.run(command, timeout_s=timeout_s)
        return report.exit_code == 0 and not report.timed_out

    @remembered("tools")
    async def read_file(self, path: str) -> str:
        """The text of ``path`` (relative to the workspace).

        Raises:
            SlotFileError: the slot read it and failed (``TOOL_ERROR``): missing, too large, or
                not a regular file (a directory, a FIFO, a socket, a device, a symlink leading
                out of the workspace).
            SlotInfraError: the slot could not run the read (infra error, refusal, lost lease).
            InvalidInput: ``path`` can name no file in the workspace (absolute once ``~`` is
                the workspace, ``..``, empty): the hook's mistake; nothing is sent.
        """
        _checked_path("read_file", path)
        result = await self.call("read_file", {"path": path})
        self._file_outcome("read_file", path, result)
        return result.content

    @remembered("tools")
    async def write_file(self, path: str, content: str) -> None:
        """Write ``content`` to ``path`` (relative to the workspace), creating parent folders.

        Raises:
            SlotFileError: the slot tried and the write failed (``TOOL_ERROR``), also for what
                it found there (a directory, a FIFO, a socket, a device, a symlink leading out).
            SlotInfraError: the slot could not run the write (infra error, refusal, lost lease).
            InvalidInput: as ``read_file``, for a path that names no file in the workspace;
                ``content`` that holds a lone surrogate (no UTF-8 carries it).
        """
        _checked_path("write_file", path)
        _checked_text("write_file", "content", content)
        result = await self.call("write_file", {"path": path, "content": content})
        self._file_outcome("write_file", path, result)

    def _budget_spent(self, what: str, result: ToolResult) -> None:
        """Raise ``SlotBudgetSpent`` when ``result`` says its lease was ended for a budget."""
        if result.sandbox_budget is not None:
            raise SlotBudgetSpent(
                f"{what} in slot {self.lease.slot}: the lease was ended for its "
                f"{result.sandbox_budget.value} budget: {result.error}"
            )

    def _file_outcome(self, tool: str, path: str, result: ToolResult) -> None:
        """Raise for a file call's failed ``result``, by its outcome: ``TOOL_ERROR`` is the
        file's (``SlotFileError``), the rest the slot's (``SlotInfraError``).

        One exception, for slot servers that predate ``TOOL_ERROR`` for what a path finds:
        they refused a FIFO, a device or a symlink leading out as ``REJECTED`` at ``$.path``.
        ``path`` passed ``_checked_path``, so no server refuses it as malformed, and that
        refusal is read as the file's; a current server never answers so.
        """
        self._budget_spent(f"{tool} {path!r}", result)
        if result.outcome is ToolOutcome.REJECTED and (result.error or "").endswith("@ $.path"):
            raise SlotFileError(path, f"{tool}: {result.error}")
        if result.outcome in (ToolOutcome.INFRA_ERROR, ToolOutcome.REJECTED):
            raise SlotInfraError(
                f"{tool} {path!r} in slot {self.lease.slot}: {result.outcome.value}: {result.error}"
            )
        if not result.ok:
            raise SlotFileError(path, f"{tool}: {result.error}")

    @remembered("tools")
    async def upload(self, files: Mapping[str, str]) -> None:
        """Write several files into the workspace."""
        for path, content in files.items():
            await self.write_file(path, content)

    @remembered("tools")
    async def download(self, paths: Sequence[str]) -> dict[str, str]:
        """Read several files from the workspace."""
        return {path: await self.read_file(path) for path in paths}

    @remembered("tools")
    async def pytest(
        self,
        files: Mapping[str, str] | None = None,
        *,
        args: Sequence[str] = (),
        python: str = "python3",
        cwd: str = ".",
        timeout_s: float | None = None,
    ) -> PytestOutcome:
        """Upload ``files``, run pytest in the slot, and read what it came to.

        ``files`` (workspace-relative path to text: the tests as shipped, a conftest, data) are
        written first, replacing what the model left under those names. Then
        ``{python} -m pytest -q -rfE -p no:cacheprovider {args}`` runs in ``cwd`` (relative to
        the workspace), with bytecode neither read from nor written to the workspace (a stale
        ``.pyc`` the model left cannot stand in for an edited module). ``python`` is a shell
        fragment that starts a Python able to import pytest in the slot (``python3``, or
        ``PYTHONPATH=.verify /usr/bin/python3``); ``args`` are quoted, one word each.

        Returns a ``PytestOutcome``: counts, failing test ids, the exit's meaning (``NOT_RUN``
        when pytest never reported, say because it is not installed in the slot) and the output;
        ``outcome.passed_all`` is the usual verdict.

        Raises:
            SlotFileError, SlotInfraError: as ``upload`` and ``run``: the slot could not write
                the files or run the command, so there is no outcome.
        """
        if files:
            await self.upload(files)
        words = " ".join(shlex.quote(arg) for arg in args)
        # Bytecode is read from a fresh, empty folder no one else could have filled (a stale or
        # planted .pyc is never used) and written nowhere; the folder is removed after, so an
        # unsandboxed slot leaves nothing in the host's /tmp.
        command = (
            'cache="$(mktemp -d)" || exit 125; '
            f"cd {shlex.quote(cwd)} && PYTHONDONTWRITEBYTECODE=1 "
            f'PYTHONPYCACHEPREFIX="$cache" {python} -m pytest -q -rfE -p no:cacheprovider '
            f"--color=no {words}"
        ).rstrip() + '; status=$?; rm -rf "$cache"; exit "$status"'
        report = await self.run(command, timeout_s=timeout_s)
        output = report.stdout
        if report.stderr:
            output += ("\n" if output and not output.endswith("\n") else "") + report.stderr
        return read_pytest_outcome(output, report.exit_code, timed_out=report.timed_out)


def capped(result: ToolResult, limit: int) -> ToolResult:
    """``result`` with its text (``content``) cut to about ``limit`` characters when longer:
    its head and tail kept around a line saying how many characters were cut."""
    text = result.content
    if len(text) <= limit:
        return result
    note_room = 120
    keep = limit - note_room
    head, tail = text[: keep // 2], text[len(text) - (keep - keep // 2) :]
    cut = len(text) - len(head) - len(tail)
    note = (
        f"\n[... {cut} of {len(text)} characters cut here: a tool result is capped at "
        f"{limit} characters ...]\n"
    )
    return attrs.evolve(result, content=f"{head}{note}{tail}")
