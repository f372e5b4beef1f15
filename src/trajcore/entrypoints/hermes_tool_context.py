"""hermes-agent's ``ToolContext`` on trajcore: ``HermesToolContext``, and the env's own tool calls.

``compute_reward`` got hermes's ``ToolContext`` to verify in the task's sandbox; here it gets
``HermesToolContext``, bound to the trajectory's slot, with the same calls and answers. Rules it
keeps:

- Every call is a coroutine, as trajcore's tools run on the event loop: ``await
  ctx.terminal(...)``. A call made without ``await`` never runs; the context remembers each call
  it made, so the env can fail the member naming the call (``unawaited``) instead of scoring what
  the unawaited coroutine turned into.
- Nothing it answers is silently cut: the terminal's answer says when the command could not
  start, was killed or timed out; files move whole and binary-safe in pieces that each fit under
  the slot's output cap and argument limit, and a piece that came back short is an error, never
  a spliced success. An upload lands whole or not at all (it is written beside the target and
  moved into place), and a failed download writes nothing.
- Paths are read as the file tools read them: ``~`` and ``~/x`` are the slot's workspace (its
  ``HOME``), and a path starting with ``-`` is a path, never an option.
- ``run_env_tool`` is the env's own call in the slot (hermes's and atropos-agent's tool names,
  the env's timeout honoured even past the model's ``terminal_timeout_s``).
- What the slot could not answer is never an answer: a call the slot (or a tool server) could
  not run (``INFRA_ERROR``), a slot tool's refusal for its lease (lost or stale; a refusal of
  the call's own arguments, a path outside the workspace say, is answered), and a lease ended
  for the disk budget the model spent raise, as ``SlotTools.run`` does (``SlotInfraError``,
  ``SlotBudgetSpent``): the member is then an infrastructure failure (or
  ``sandbox_budget_score``), never a reward computed from an ``exit_code`` of -1 or a
  ``success`` of False that the command never gave.
"""

from __future__ import annotations

import base64
import itertools
import json
import secrets
import shlex
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import anyio
import attrs

from trajcore.domain.errors import SlotBudgetSpent, SlotInfraError
from trajcore.domain.isolation import positive_seconds
from trajcore.domain.json_values import JSONObject
from trajcore.domain.slot_protocol import SLOT_TOOLS, home_relative
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult
from trajcore.rollout.awaited import CallLog, remembered
from trajcore.rollout.tools import SlotTools

__all__ = ["SEED_TOOL_NAMES", "HermesToolContext", "answered", "run_env_tool"]

SEED_TOOL_NAMES: Mapping[str, str] = {"terminal": "bash"}
"""The seeds' names of trajcore's tools, as the env's own code may call them."""

# A file crosses the terminal in pieces: a download piece's base64 (4/3 of it, plus line breaks)
# stays well under the slot's default 64 KiB stdout cap (under a smaller cap, a piece whose
# output was cut is asked again at half the size, and the smaller size is kept), an upload
# piece's under the kernel's 128 KiB limit on one argument (the command is one ``sh -c``
# argument).
DOWNLOAD_PIECE_BYTES = 36 * 1024
UPLOAD_PIECE_BYTES = 48 * 1024

_call_ids = itertools.count()

P = ParamSpec("P")
R = TypeVar("R")


def _shell_path(path: str) -> str:
    """``path`` as the slot's file tools read it (``~`` and ``~/x`` are the workspace;
    ``home_relative``), with ``./`` before a leading ``-`` so that no command reads it as an
    option; unquoted."""
    relative = home_relative(path)
    return f"./{relative}" if relative.startswith("-") else relative


def _timeout_of(arguments: Mapping[str, Any]) -> float | None:
    """The ``timeout`` argument as seconds, when it is a positive finite number (one past a
    float's range is not)."""
    return positive_seconds(arguments.get("timeout"))


async def run_env_tool(
    tools: SlotTools,
    name: str,
    arguments: Mapping[str, Any],
    *,
    timeout_s: float | None = None,
) -> ToolResult:
    """One call from the env's own code in the trajectory's slot: a seed tool name
    (``terminal``) is its trajcore tool, and ``timeout_s`` (or a ``timeout`` argument) is
    honoured even past ``terminal_timeout_s`` (it is the env's, not the model's)."""
    name = SEED_TOOL_NAMES.get(name, name)
    limit = timeout_s if timeout_s is not None else _timeout_of(arguments)
    router = tools.router
    router = attrs.evolve(
        router,
        offered=router.offered | {name},
        tool_timeout_s=router.tool_timeout_s if limit is None else limit,
        hook=True,  # the env's own call: it may use the hooks' process reserve
    )
    call = ToolCall(id=f"compat_{next(_call_ids)}", name=name, arguments=dict(arguments))
    (result,) = await router.run([call])
    return answered(tools, name, result)


def answered(tools: SlotTools, name: str, result: ToolResult) -> ToolResult:
    """``result`` of the env's own call of ``name``, when it is an answer to read: the
    command's, the file's, the tool's.

    Raises:
        SlotBudgetSpent: the lease was ended for a budget the model spent.
        SlotInfraError: the call did not run: ``INFRA_ERROR`` (the slot server or tool server
            failed), or a slot tool's ``REJECTED`` for its lease (lost or stale: the result's
            ``lease_refused``); a refusal of the call's own arguments (``... @ $.path``) is
            the call's answer.
    """
    what = f"{name} in slot {tools.lease.slot}: {result.outcome.value}: {result.error}"
    if result.sandbox_budget is not None:
        raise SlotBudgetSpent(f"{what} (the lease was ended for its disk budget)")
    if result.outcome is ToolOutcome.INFRA_ERROR or (
        result.outcome is ToolOutcome.REJECTED and name in SLOT_TOOLS and result.lease_refused
    ):
        raise SlotInfraError(what)
    return result


class _Done:
    """An answer that is already there: awaiting it gives ``None``, and so does not awaiting it."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that ends at once


@attrs.frozen
class HermesToolContext:
    """hermes-agent's ``ToolContext``: its calls, bound to the trajectory's slot.

    Every method but ``cleanup`` is a coroutine (``await ctx.terminal("pytest -q")``) and
    answers as hermes's did: a dict (``{"exit_code", "output"}`` from the terminal,
    ``{"content"}`` or ``{"error"}`` from files), or the raw text from ``call_tool``.

    Attributes:
        tools: The slot's toolbox (trajcore's ``SlotTools``).
    """

    tools: SlotTools
    call_log: CallLog = attrs.field(factory=CallLog, init=False, repr=False, eq=False)

    @property
    def task_id(self) -> str:
        """The trajectory's id (hermes's ``task_id``)."""
        return self.tools.router.trajectory_id

    def unawaited(self) -> list[str]:
        """The calls made on this context whose coroutine never started (a forgotten
        ``await``), each as ``ctx.<method>() at <file>:<line>``; each is closed, so it never
        runs later."""
        return self.call_log.unawaited()

    def check_awaited(self, hook: str) -> None:
        """Raise when a call on this context was made without ``await`` in ``hook``.

        Raises:
            StateError: naming the calls; the member fails as ``env_error``, never a score.
        """
        self.call_log.check_awaited(hook, "await ctx.<method>(...)")

    def cleanup(self) -> _Done:
        """hermes's ``cleanup()``: nothing to do here, as trajcore releases and resets the slot
        (its files, processes and persistent shell) after scoring. Call it with or without
        ``await``."""
        return _Done()

    @remembered("ctx")
    async def terminal(
        self,
        command: str,
        timeout: int = 180,  # noqa: ASYNC109 - hermes's signature; the slot server enforces it
    ) -> dict[str, Any]:
        """Run ``command`` in the slot: ``{"exit_code", "output"}`` (stdout then stderr).

        ``timeout`` is the command's limit in seconds (hermes's default 180), honoured as given:
        ``terminal_timeout_s`` bounds the model's calls, not the env's verification. A command
        that could not start, was killed or timed out has ``exit_code`` -1 (as hermes's) and
        its output ends with why, in brackets (``[timed out after 1 s; ...]``).
        """
        result = await run_env_tool(self.tools, "bash", {"command": command}, timeout_s=timeout)
        report = result.exec
        if report is None:
            return {"exit_code": -1, "output": result.error or result.content}
        output = report.stdout + report.stderr
        if report.exit_code is not None and not report.timed_out:
            return {"exit_code": report.exit_code, "output": output}
        why = result.error or ("timed out" if report.timed_out else "killed")
        return {"exit_code": -1, "output": f"{output}\n[{why}]" if output else f"[{why}]"}

    @remembered("ctx")
    async def read_file(self, path: str) -> dict[str, Any]:
        """``{"content": text}``, or ``{"error": why}``."""
        read = await self.tools.call("read_file", {"path": path})
        result = answered(self.tools, "read_file", read)
        return {"content": result.content} if result.ok else {"error": result.error}

    @remembered("ctx")
    async def write_file(self, path: str, content: str) -> dict[str, Any]:
        """``{"success": True}``, or ``{"error": why}``."""
        arguments: JSONObject = {"path": path, "content": content}
        result = answered(self.tools, "write_file", await self.tools.call("write_file", arguments))
        return {"success": True} if result.ok else {"error": result.error}

    @remembered("ctx")
    async def upload_file(self, local_path: str, remote_path: str) -> dict[str, Any]:
        """Copy a host file into the slot, binary-safe and whole (in pieces of
        ``UPLOAD_PIECE_BYTES``): ``{"exit_code", "output"}``; on success the output is empty,
        otherwise it says which piece failed and why."""
        local = anyio.Path(local_path)
        if not await local.is_file():
            return {"exit_code": -1, "output": f"Local file not found: {local_path}"}
        data = await local.read_bytes()
        path = _shell_path(remote_path)
        target = shlex.quote(path)
        parent = shlex.quote(str(Path(path).parent))
        # written beside the target and moved into place whole: a failed upload leaves the
        # target as it was
        partial = shlex.quote(f"{path}.upload-{secrets.token_hex(4)}")
        start = await self.terminal(f"mkdir -p -- {parent} && : > {partial}")
        if start["exit_code"] != 0:
            return start
        answer = await self._upload_pieces(data, partial, remote_path)
        if answer["exit_code"] == 0:
            moved = await self.terminal(f"mv -f -- {partial} {target}")
            if moved["exit_code"] == 0:
                return answer
            answer = {
                "exit_code": moved["exit_code"],
                "output": f"moving the upload into {remote_path}: {moved['output']}",
            }
        await self.terminal(f"rm -f -- {partial}")
        return answer

    async def _upload_pieces(self, data: bytes, partial: str, remote_path: str) -> dict[str, Any]:
        """Append ``data`` to the quoted ``partial`` in pieces and check its size: ``{"exit_code":
        0, "output": ""}``, or the failure naming ``remote_path``."""
        for offset in range(0, len(data), UPLOAD_PIECE_BYTES):
            piece = base64.b64encode(data[offset : offset + UPLOAD_PIECE_BYTES]).decode("ascii")
            answer = await self.terminal(f"printf '%s' {piece} | base64 -d >> {partial}")
            if answer["exit_code"] != 0:
                where = f"writing bytes {offset}.. of {len(data)} to {remote_path}"
                return {"exit_code": answer["exit_code"], "output": f"{where}: {answer['output']}"}
        size = await self.terminal(f"wc -c < {partial}")
        if size["exit_code"] != 0 or size["output"].strip() != str(len(data)):
            return {
                "exit_code": -1,
                "output": f"{remote_path} got {size['output'].strip()!r} bytes, not {len(data)}",
            }
        return {"exit_code": 0, "output": ""}

    @remembered("ctx")
    async def upload_dir(self, local_dir: str, remote_dir: str) -> list[dict[str, Any]]:
        """``upload_file`` for every file under ``local_dir``, keeping the layout."""
        local = anyio.Path(local_dir)
        if not await local.is_dir():
            return [{"exit_code": -1, "output": f"Local directory not found: {local_dir}"}]
        files = sorted([path async for path in local.rglob("*") if await path.is_file()])
        return [
            await self.upload_file(str(path), f"{remote_dir}/{path.relative_to(local)}")
            for path in files
        ]

    @remembered("ctx")
    async def download_file(self, remote_path: str, local_path: str) -> dict[str, Any]:
        """Copy a slot file to the host, binary-safe and whole (in pieces of
        ``DOWNLOAD_PIECE_BYTES``, halved while a piece's output is cut by a smaller output
        cap): ``{"success": True, "bytes"}``, or ``{"success": False, "error"}`` (the local
        file is then not written)."""
        quoted = shlex.quote(_shell_path(remote_path))
        size = await self.terminal(f"wc -c < {quoted}")
        if size["exit_code"] != 0 or not size["output"].strip().isdigit():
            return {"success": False, "error": f"Failed to read remote file: {size['output']}"}
        total = int(size["output"].strip())
        raw = bytearray()
        piece_bytes = DOWNLOAD_PIECE_BYTES
        while len(raw) < total:
            want = min(piece_bytes, total - len(raw))
            result = await run_env_tool(
                self.tools,
                "bash",
                {"command": f"tail -c +{len(raw) + 1} {quoted} | head -c {want} | base64"},
            )
            report = result.exec
            cut = report is not None and report.exit_code == 0 and report.stdout_dropped > 0
            if cut and want > 1:  # the slot's output cap is under the piece's base64: ask less
                piece_bytes = want // 2
                continue
            piece = b""
            if report is not None and report.exit_code == 0 and not report.stdout_dropped:
                piece = base64.b64decode(report.stdout)
            if len(piece) != want:
                why = result.error or (report.stderr if report else "") or "a short read"
                return {
                    "success": False,
                    "error": f"Failed to read bytes {len(raw)}..{len(raw) + want} of "
                    f"{total} from {remote_path}: {why.strip()}",
                }
            raw += piece
        local = anyio.Path(local_path)
        await local.parent.mkdir(parents=True, exist_ok=True)
        await local.write_bytes(bytes(raw))
        return {"success": True, "bytes": len(raw)}

    @remembered("ctx")
    async def download_dir(self, remote_dir: str, local_dir: str) -> list[dict[str, Any]]:
        """``download_file`` for every file under ``remote_dir``, keeping the layout."""
        listed = _shell_path(remote_dir)
        listing = await self.terminal(f"find {shlex.quote(listed)} -type f")
        if listing["exit_code"] != 0:
            return [{"success": False, "error": f"Failed to list remote dir: {remote_dir}"}]
        out: list[dict[str, Any]] = []
        for remote in str(listing["output"]).split("\n"):
            if remote.strip():
                relative = Path(remote).relative_to(listed)
                out.append(await self.download_file(remote, str(Path(local_dir) / relative)))
        return out

    @remembered("ctx")
    async def search(self, query: str, path: str = ".") -> dict[str, Any]:
        """Lines matching ``query`` under ``path`` (``~`` is the workspace): ``{"matches":
        ["file:line:text", ...]}``."""
        answer = await self.terminal(
            f"grep -rn -- {shlex.quote(query)} {shlex.quote(_shell_path(path))} || test $? -eq 1"
        )
        if answer["exit_code"] != 0:
            return {"error": answer["output"]}
        return {"matches": [line for line in str(answer["output"]).splitlines() if line]}

    @remembered("ctx")
    async def call_tool(self, tool_name: str, arguments: dict[str, Any]) -> str:
        """Any tool by name (slot or tool server; hermes's ``terminal`` is ``bash``); its raw
        text answer (an error as JSON)."""
        result = await run_env_tool(self.tools, tool_name, arguments)
        return result.content if result.ok else json.dumps({"error": result.error})
