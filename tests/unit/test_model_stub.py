"""``trajcore model SCRIPT``'s endpoint (``model_stub.script_server``): trajcore's start-up probe
is answered without the script, and a script that raises is told on stderr and answered 400,
which the env's model call reports at once as a refused request naming the script's line."""

from __future__ import annotations

import io
from collections.abc import Sequence

import anyio
import pytest

from trajcore.adapters.llm.chat import OpenAIChatServer
from trajcore.adapters.llm.chat_wire import chat_request
from trajcore.domain.errors import ModelServerRejected
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.tools import ToolSpec
from trajcore.entrypoints.model_probe import PROBE_PROMPT, PROBE_SAMPLING, is_probe
from trajcore.entrypoints.model_stub import script_server
from trajcore.entrypoints.run import wait_for_endpoint
from trajcore.rollout.scripted import ScriptStep

pytestmark = pytest.mark.anyio

TASK = "Create the file a.txt whose content is exactly 'alpha beta'."


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def solve(messages: Sequence[Message]) -> ScriptStep:
    """A script written for the env's tasks: the probe's "hi" has no file name."""
    asked.append(messages[-1].content)
    return messages[-1].content.split("Create the file ")[1]  # IndexError on anything else


asked: list[str] = []


async def test_the_start_up_probe_is_answered_without_the_script() -> None:
    asked.clear()
    log = io.StringIO()
    async with script_server(solve, name="env.py:solve", model="stub-model", log=log) as stub:
        with anyio.fail_after(30):
            await wait_for_endpoint(f"{stub.url}/v1", model="stub-model", api_key=None, wait_s=2)
    assert asked == []  # the script never saw "hi"
    assert "start-up probe" in log.getvalue()


async def test_a_script_that_raises_is_answered_400_naming_its_line_and_told_on_stderr() -> None:
    asked.clear()
    log = io.StringIO()
    async with script_server(solve, name="env.py:solve", model="stub-model", log=log) as stub:
        chat = OpenAIChatServer(base_url=f"{stub.url}/v1", model="stub-model")
        try:
            with anyio.fail_after(30), pytest.raises(ModelServerRejected) as caught:
                await chat.chat(
                    [Message.user("Write a poem.")], tools=(), sampling=SamplingParams()
                )
        finally:
            await chat.aclose()
    assert caught.value.status == 400  # refused at once: never retried as an outage
    assert "the model script env.py:solve raised IndexError" in caught.value.body
    assert "test_model_stub.py:" in caught.value.body
    assert "in solve" in caught.value.body
    told = log.getvalue()
    assert "IndexError: list index out of range" in told
    assert 'in solve\n    return messages[-1].content.split("Create the file ")[1]' in told
    assert asked == ["Write a poem."]


def test_only_the_probe_is_taken_for_the_probe() -> None:
    def body(messages: list[Message], tools: Sequence[ToolSpec], max_tokens: int) -> bool:
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        return is_probe(chat_request(model="m", messages=messages, tools=tools, sampling=sampling))

    probe = [Message.user(PROBE_PROMPT)]
    tool = ToolSpec(name="bash", description="run", parameters={"type": "object"})
    assert body(probe, (), PROBE_SAMPLING.max_tokens)
    assert not body(probe, (), 512)  # a task whose prompt is "hi"
    assert not body(probe, (tool,), 1)
    assert not body([Message.system("s"), *probe], (), 1)
    assert not body([Message.user(TASK)], (), 1)
