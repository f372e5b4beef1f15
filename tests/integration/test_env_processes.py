"""Two env processes of one env against one real Atropos ``run-api`` (docs/deploy.md, "Several
env processes of one env").

The test starts atroposlib's ``run-api``, registers as a trainer, serves a scripted
OpenAI-compatible model on loopback (``trajcore.testing.llm_stubs``, in this process), and starts
this very file twice as an env in ``serve`` mode (the command an env author runs), over one
four-row ``.jsonl`` dataset with ``--env.dataset_shard 0/2`` and ``1/2``, each on its own local
pool of real slot servers. The model runs ``id -u | tee uid.txt`` in its slot; the score hook
reads ``uid.txt`` and returns it, with its process id, as the member's score metadata, which
reaches the trainer in the group's overrides.

From outside it checks: each process registered as an env of its own (two env ids); each
row's prompt came only from the process of its shard, and every row came; the slots of the two
processes ran as different uids (the second pool moved to a free range and said so in a
warning, and its slots ran inside it); and SIGTERM ends each process with status 128 + 15,
leaving no process it started (slot servers, bubblewrap, tmux: checked by pid and start time)
and no pool directory.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest

from tests.processes import (
    Proc,
    alive,
    child_environment,
    descendants,
    names,
    run_api,
    wait_until,
    wait_until_gone,
)
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.errors import SlotFileError
from trajcore.domain.json_values import JSON
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason
from trajcore.domain.tools import ToolCall
from trajcore.env import AgentEnv, AgentEnvConfig, SlotTools, Transcript
from trajcore.testing.llm_stubs import LoopbackLLMServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
]

GROUP_SIZE = 2
ROWS = 4
SHARDS = 2
START_S = 150.0
"""Generous bound on both envs' start and first groups on a loaded 2-core machine."""
MOVED = re.compile(r"this pool's slots run as uids (\d+)-(\d+)")

T = TypeVar("T")


class ShardEnv(AgentEnv[dict[str, JSON]]):
    """The built-in dataset items and task; the score is 1 when the slot's ``uid.txt`` holds a
    uid, which the member's score metadata carries, with this process's id."""

    name = "shard_env"

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        config, servers = super().config_init()
        update = {
            "tokenizer_name": str(qwen3_tokenizer_path()),
            "group_size": GROUP_SIZE,
            "ensure_scores_are_not_same": False,
            "max_turns": 3,
        }
        return config.model_copy(update=update), servers

    async def verify_and_score(
        self, item: dict[str, JSON], tools: SlotTools, messages: Transcript
    ) -> tuple[float, dict[str, JSON]]:
        try:
            uid = (await tools.read_file("uid.txt")).strip()
        except SlotFileError:
            return 0.0, {"pid": os.getpid()}
        if not uid.isdigit():
            return 0.0, {"pid": os.getpid()}
        return 1.0, {"pid": os.getpid(), "uid": int(uid)}


def model_turn(messages: Sequence[Message]) -> ChatTurn:
    """The model's script: run ``id -u`` into ``uid.txt``, then (when tmux is installed) one
    ``bash_stateful`` call, which starts a tmux server in the slot, then stop."""
    calls = [ToolCall(id="c0", name="bash", arguments={"command": "id -u | tee uid.txt"})]
    if shutil.which("tmux") is not None:
        calls.append(ToolCall(id="c1", name="bash_stateful", arguments={"command": "echo hi"}))
    turn = sum(1 for m in messages if m.role == "assistant")
    if turn < len(calls):
        return ChatTurn(
            message=Message.assistant("working", tool_calls=[calls[turn]]),
            finish_reason=FinishReason.TOOL_CALLS,
        )
    return ChatTurn(message=Message.assistant("Done."), finish_reason=FinishReason.STOP)


@contextmanager
def _model_server() -> Iterator[LoopbackLLMServer]:
    """The scripted model on loopback, served from a thread of its own."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = LoopbackLLMServer(chat_policy=model_turn, record=False)
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=10)
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.aclose(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@attrs.frozen
class EnvProcess:
    process: subprocess.Popen[bytes]
    log: Path


@contextmanager
def _serve(
    shard: int, *, url: str, model: str, dataset: Path, tmp_path: Path, environment: dict[str, str]
) -> Iterator[EnvProcess]:
    """``python test_env_processes.py serve`` on shard ``shard``/2; killed, with every process it
    started, on the way out when still running."""
    log = tmp_path / f"env-{shard}.log"
    argv = [
        sys.executable, __file__, "serve",
        "--env.rollout_server_url", url,
        "--openai.base_url", model,
        "--openai.model_name", "stub-model",
        "--openai.api_key", "x",
        "--env.dataset", str(dataset),
        "--env.dataset_shard", f"{shard}/{SHARDS}",
        "--env.use_wandb", "false",
        "--env.wandb_name", "shard_env",
        "--env.include_messages", "true",
        "--env.total_steps", "100",
        "--env.max_token_length", "4096",
        "--env.max_tokens", "64",
        "--env.enabled_toolsets", "file,terminal,stateful_terminal",
        "--env.slot_lifetime_s", "30",
        "--env.local_containers", "1",
        "--env.slots_per_container", str(GROUP_SIZE),
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=environment, cwd=tmp_path
        )
    try:
        yield EnvProcess(process, log)
    finally:
        started = descendants(process.pid)
        if process.poll() is None:
            process.kill()
            process.wait()
        for proc in alive(started):  # what a failing test left: never outlive the test
            os.kill(proc.pid, signal.SIGKILL)


def _all_kinds(seen: set[str]) -> bool:
    """Whether the names ``seen`` hold a slot server, bubblewrap and (when installed) tmux."""
    tmux = shutil.which("tmux") is None or any(name.startswith("tmux") for name in seen)
    return {"slot-server", "bwrap"} <= seen and tmux


def _prompt(conversation: Sequence[dict[str, Any]]) -> str:
    return next(str(m["content"]) for m in conversation if m["role"] == "user")


def _tool_output(conversation: Sequence[dict[str, Any]]) -> str:
    return next(str(m["content"]) for m in conversation if m["role"] == "tool")


def test_two_env_processes_of_one_env_share_the_run_api_but_no_row_nor_slot_uid(
    tmp_path: Path,
) -> None:
    dataset = tmp_path / "rows.jsonl"
    prompts = [f"Task of row {i}: say who you are." for i in range(ROWS)]
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    scratch = Path(tempfile.mkdtemp(prefix="trajcore-env-processes-"))
    scratch.chmod(0o711)
    environment = child_environment(scratch)
    deadline = time.monotonic() + START_S
    try:
        with (
            _model_server() as model,
            run_api(tmp_path, environment, batch_size=2 * GROUP_SIZE) as trainer,
        ):
            serve = functools.partial(
                _serve,
                url=str(trainer.base_url),
                model=f"{model.url}/v1",
                dataset=dataset,
                tmp_path=tmp_path,
                environment=environment,
            )
            with serve(0) as first:
                logs = [first.log, tmp_path / "run-api.log"]
                groups: list[dict[str, Any]] = []

                def groups_of(pid: int) -> list[dict[str, Any]]:
                    return [
                        g for g in groups
                        if g["overrides"][0]["trajcore"]["score_metadata"]["pid"] == pid
                    ]  # fmt: skip

                def collect() -> bool | None:
                    batch = trainer.get("/batch").json()["batch"]
                    groups.extend(batch or [])
                    return True if batch else None

                # The first process's pool holds its slot uids before its first group.
                while not groups_of(first.process.pid):
                    assert first.process.poll() is None, first.log.read_text()[-3000:]
                    wait_until(deadline, "the first env's groups", logs, collect)
                with serve(1) as second:
                    logs.append(second.log)

                    # Every process each one starts, recorded while it runs (a lease's tmux
                    # server and bubblewrap come and go with the lease).
                    started: dict[int, set[Proc]] = {
                        first.process.pid: set(),
                        second.process.pid: set(),
                    }

                    def every_row_and_process_seen() -> bool | None:
                        assert second.process.poll() is None, second.log.read_text()[-3000:]
                        collect()
                        for pid, procs in started.items():
                            procs.update(descendants(pid))
                        rows = {_prompt(c) for g in groups for c in g["messages"]}
                        kinds = [{p.name for p in procs} for procs in started.values()]
                        both = all(groups_of(env.process.pid) for env in (first, second))
                        done = both and rows == set(prompts) and all(map(_all_kinds, kinds))
                        return True if done else None

                    wait_until(deadline, "every row's groups", logs, every_row_and_process_seen)
                    for env in (first, second):
                        env.process.send_signal(signal.SIGTERM)
                    statuses = {
                        env.process.pid: env.process.wait(timeout=60) for env in (first, second)
                    }
                    outputs = {
                        env.process.pid: env.log.read_text(errors="replace")
                        for env in (first, second)
                    }
    finally:
        leftover_pools = sorted(p.name for p in scratch.glob("trajcore-pool-*"))
        shutil.rmtree(scratch, ignore_errors=True)

    # Each process registered as an env of its own, and sent the rows of its shard only.
    pids = (first.process.pid, second.process.pid)
    env_ids = {pid: {g["env_id"] for g in groups_of(pid)} for pid in pids}
    assert all(len(ids) == 1 for ids in env_ids.values()), env_ids
    assert env_ids[pids[0]] != env_ids[pids[1]], env_ids
    for shard, pid in enumerate(pids):
        rows = {_prompt(c) for g in groups_of(pid) for c in g["messages"]}
        assert rows == set(prompts[shard::SHARDS]), (shard, rows)
    assert len(groups) == sum(len(groups_of(pid)) for pid in pids)  # no group of another pid

    # Every member ran ``id -u`` in its slot; the score hook read what it wrote.
    uids: dict[int, set[int]] = {}
    for pid in pids:
        for group in groups_of(pid):
            assert group["scores"] == [1.0] * GROUP_SIZE, group["scores"]
            for conversation, override in zip(group["messages"], group["overrides"], strict=True):
                assert override["trajcore"]["score_metadata"]["pid"] == pid
                uid = override["trajcore"]["score_metadata"]["uid"]
                assert _tool_output(conversation).strip().endswith(str(uid)), conversation
                uids.setdefault(pid, set()).add(uid)
    assert not uids[pids[0]] & uids[pids[1]], uids
    assert all(uid != 0 for pid in pids for uid in uids[pid])

    # Each pool's slots ran in the range it held: its base, or the free range it moved to (and
    # said so). The host's other slot servers may hold ranges too: the first pool may move
    # itself, and the second need not when the base was free again; but a second pool that
    # asked for the range the first one holds always moves.
    base = ShardEnv.config_init()[0].local_pool_config().server.isolation.slot_uid_base
    held: dict[int, range] = {}
    for pid in pids:
        moved = MOVED.search(outputs[pid])
        low, high = (base, base + GROUP_SIZE - 1) if moved is None else map(int, moved.groups())
        held[pid] = range(low, high + 1)
        assert len(held[pid]) == GROUP_SIZE, outputs[pid][-3000:]
        assert uids[pid] <= set(held[pid]), (uids, held)
    assert not set(held[pids[0]]) & set(held[pids[1]]), held
    if held[pids[0]].start == base:
        assert MOVED.search(outputs[pids[1]]) is not None, outputs[pids[1]][-3000:]

    # SIGTERM ended both, each with its pool closed and nothing it started left.
    for pid in pids:
        assert statuses[pid] == 128 + signal.SIGTERM, outputs[pid][-3000:]
        assert "stopping and closing the sandbox pool" in outputs[pid], outputs[pid][-3000:]
        procs = sorted(started[pid], key=lambda p: p.pid)
        left = wait_until_gone(procs, 5.0)
        assert not left, f"left running: {names(left)}"
    assert not leftover_pools


if __name__ == "__main__":
    ShardEnv.cli()
