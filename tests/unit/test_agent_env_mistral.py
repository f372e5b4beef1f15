"""AgentEnv with ``tokenizer_mode="mistral"``: managed mode renders and tokenizes with Mistral's
own encoder (``mistral_common``), the ``mistral`` parser reads the sampled calls, and a file that
is missing or is not a Mistral tokenizer is refused naming the setting."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

pytest.importorskip("mistral_common", reason="the mistral extra is not installed")

from tests.unit.test_agent_env import FileEnv, _config
from trajcore.adapters.fakes.llm import FakeTokenServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.mistral import MistralCommonTokenizer
from trajcore.domain.errors import ConfigError
from trajcore.domain.sampling import FinishReason, TokenCompletion

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _tekken_file() -> Path:
    import mistral_common

    found = sorted(Path(mistral_common.__file__).parent.rglob("tekken_240718.json"))
    assert found, "mistral_common ships tekken_240718.json"
    return found[0]


async def test_managed_mode_runs_on_mistrals_own_encoder() -> None:
    env = FileEnv(
        _config(
            group_size=2,
            mode="managed",
            tool_call_parser="mistral",
            tokenizer_mode="mistral",
            mistral_tokenizer_file=str(_tekken_file()),
        )
    )
    tokenizer = env.tokenizer_port()
    assert isinstance(tokenizer, MistralCommonTokenizer)
    eos = tokenizer.eos_token_id
    assert eos is not None
    tool_calls = tokenizer.special_id("[TOOL_CALLS]")
    counter = itertools.count()

    def respond(prompt: Sequence[int]) -> TokenCompletion:
        n = next(counter)
        if tool_calls in prompt:  # the model has called its tool: it is done
            ids = [*tokenizer.encode("Done."), eos]
        else:
            text = "ok" if n % 2 else "no"
            call = [{"name": "write_file", "arguments": {"path": "done.txt", "content": text}}]
            ids = [tool_calls, *tokenizer.encode(json.dumps(call)), eos]
        return TokenCompletion.of(ids, [-0.5] * len(ids), FinishReason.STOP)

    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        result = await env.run_task(
            "ok", pool=pool, policy=env.make_policy(token=FakeTokenServer(policy=respond))
        )
    assert sorted(member.outcome.score or 0.0 for member in result.members) == [0.0, 1.0]
    for member in result.members:
        assert member.tokens is not None
        assert [exchange.call.name for exchange in member.exchanges] == ["write_file"]


def test_a_missing_mistral_tokenizer_file_is_refused_naming_the_setting(tmp_path: Path) -> None:
    env = FileEnv(
        _config(tokenizer_mode="mistral", mistral_tokenizer_file=str(tmp_path / "none.json"))
    )
    with pytest.raises(ConfigError) as caught:
        env.tokenizer_port()
    assert caught.value.field == "mistral_tokenizer_file"


def test_a_tokenizer_folder_without_mistral_files_is_refused_naming_the_setting() -> None:
    env = FileEnv(_config(tokenizer_mode="mistral"))  # Qwen3's folder: no Mistral file in it
    with pytest.raises(ConfigError) as caught:
        env.tokenizer_port()
    assert caught.value.field == "mistral_tokenizer_file"
    assert "tekken.json" in caught.value.reason
