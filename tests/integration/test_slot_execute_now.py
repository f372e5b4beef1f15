"""A batch request is submitted inside the read that completed it (``SlotRuntime.execute_now``
through ``server.make_handler``): its agents are written to before the handler returns, with no
task and no event-loop iteration before them, and its results come back through one future set
from the last call's answer (no ``asyncio.wait``). What the old path promised still holds: one
result per call in order, a repeated ``call_id`` run once, a cancelled wait cancelling nothing,
the token checked first and a malformed body refused with its field.

The runtime runs in this process with bubblewrap and the compiled helper, as the slot servers do.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest

from tests.slot_runtime_testbed import call, searchable_root
from trajcore.adapters.http1.values import Headers, Reply, Request
from trajcore.adapters.slot_server.codec import encode
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.server import make_handler
from trajcore.domain.slot_protocol import ExecuteCall, ExecuteRequest
from trajcore.domain.tools import ToolOutcome

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
TOKEN = "execute-now-token-0123456789abcdef"


@pytest.fixture
def root() -> Iterator[Path]:
    with searchable_root("trajcore-execute-now-") as path:
        yield path


def post(body: bytes, token: str | None = TOKEN, path: str = "/v1/execute") -> Request:
    headers = Headers([("authorization", f"Bearer {token}")] if token is not None else [])
    return Request(method="POST", target=path, path=path, headers=headers, body=body)


def batch(*calls: ExecuteCall) -> bytes:
    return encode(ExecuteRequest(calls=list(calls)))


async def reply_of(answer: Reply | Awaitable[Reply]) -> Reply:
    return answer if isinstance(answer, Reply) else await answer


def results_of(reply: Reply) -> list[dict[str, object]]:
    assert reply.status == 200, reply.body
    results = json.loads(reply.body)["results"]
    assert isinstance(results, list)
    return results


def test_a_batch_reaches_its_agent_before_the_handler_returns(root: Path) -> None:
    async def main() -> tuple[bool, bool, list[dict[str, object]]]:
        runtime = SlotRuntime(RuntimeConfig(slots=1, root=root, use_cgroups=False))
        await runtime.start()
        try:
            handle = make_handler(runtime, TOKEN)
            await reply_of(handle(post(batch(call(1, "true")))))  # the lease's agent is up
            answer = handle(post(batch(call(1, "sleep 0.3; echo sent"))))
            # no await between: the call is with the agent already (its slot busy, its
            # request under way), not waiting for a task to start it
            busy = runtime.listing().slots[0].busy
            agent = runtime.slot(0).agent
            underway = agent is not None and not agent.idle()
            return busy, underway, results_of(await reply_of(answer))
        finally:
            await runtime.aclose()

    busy, underway, results = asyncio.run(main())
    assert busy
    assert underway
    assert [result["content"] for result in results] == ["sent\n"]


def test_a_batch_answers_every_call_in_order_and_a_repeat_once(root: Path) -> None:
    async def main() -> list[dict[str, object]]:
        runtime = SlotRuntime(RuntimeConfig(slots=2, root=root, use_cgroups=False))
        await runtime.start()
        try:
            handle = make_handler(runtime, None)
            await reply_of(handle(post(batch(call(1, "true")), token=None)))
            first = call(1, "echo $$ >> count; echo one")
            other_slot = ExecuteCall(
                slot=1, epoch=1, call_id="s1", tool="bash", arguments={"command": "echo two"},
                timeout_s=10.0,
            )  # fmt: skip
            unknown = ExecuteCall(slot=0, epoch=1, call_id="u", tool="nope", timeout_s=10.0)
            missing = ExecuteCall(slot=7, epoch=1, call_id="m", tool="bash", timeout_s=10.0)
            body = batch(first, unknown, other_slot, first, missing)
            results = results_of(await reply_of(handle(post(body, token=None))))
            count = results_of(
                await reply_of(handle(post(batch(call(1, "wc -l < count")), token=None)))
            )
            return [*results, *count]
        finally:
            await runtime.aclose()

    one, unknown, two, again, missing, count = asyncio.run(main())
    assert (one["content"], two["content"]) == ("one\n", "two\n")
    assert again == one  # the same call_id twice: one run, one result, both places
    assert count["content"] == "1\n"
    assert unknown["outcome"] == ToolOutcome.REJECTED.value
    assert missing["outcome"] == ToolOutcome.REJECTED.value
    assert "slot 7 does not exist" in str(missing["content"])


def test_a_cancelled_wait_leaves_its_call_running_for_a_repeat(root: Path) -> None:
    async def main() -> tuple[str, int]:
        runtime = SlotRuntime(RuntimeConfig(slots=1, root=root, use_cgroups=False))
        await runtime.start()
        try:
            await runtime.execute([call(1, "true")])
            slow = call(1, "sleep 0.3; echo $$ >> ran; echo done")
            waiting = asyncio.ensure_future(runtime.execute([slow]))
            await asyncio.sleep(0.1)
            waiting.cancel()
            (repeat,) = await runtime.execute([slow])
            (ran,) = await runtime.execute([call(1, "wc -l < ran")])
            return repeat.content, int(ran.content)
        finally:
            await runtime.aclose()

    content, runs = asyncio.run(main())
    assert content == "done\n"
    assert runs == 1


def test_the_fast_path_checks_the_token_and_the_body_first(root: Path) -> None:
    async def main() -> tuple[Reply, Reply, Reply, bool]:
        runtime = SlotRuntime(RuntimeConfig(slots=1, root=root, use_cgroups=False))
        await runtime.start()
        try:
            handle = make_handler(runtime, TOKEN)
            wrong = await reply_of(handle(post(batch(call(1, "touch x")), token="wrong")))
            missing = await reply_of(handle(post(batch(call(1, "touch x")), token=None)))
            bad = await reply_of(handle(post(b'{"calls": [{"slot": "0"}]}')))
            ran = runtime.listing().slots[0].calls_run > 0
            return wrong, missing, bad, ran
        finally:
            await runtime.aclose()

    wrong, missing, bad, ran = asyncio.run(main())
    assert (wrong.status, missing.status) == (401, 401)
    assert json.loads(wrong.body)["field"] == "$.headers.Authorization"
    assert bad.status == 400
    assert json.loads(bad.body)["field"].startswith("$.calls[0]")
    assert not ran
