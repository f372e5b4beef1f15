"""Mode ``auto`` follows the server type (vLLM/SGLang: managed, parser hermes) and says so."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from atroposlib.envs.server_handling.server_baseline import (  # type: ignore[import-untyped]
    APIServerConfig,
)

from tests.unit.test_agent_env import QWEN, FileEnv, _alternating_chat, _config
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.errors import ConfigError
from trajcore.rollout.policy import ChatPolicy, TokenPolicy

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _server(server_type: str) -> Any:
    return APIServerConfig(
        server_type=server_type,
        base_url="http://127.0.0.1:9/v1",
        model_name="m",
        api_key="x",
        tokenizer_name=QWEN,
    )


@pytest.mark.parametrize(
    ("fields", "types", "mode", "parser"),
    [
        ({}, ["vllm"], "managed", "hermes"),
        ({}, ["sglang"], "managed", "hermes"),
        ({"tool_call_parser": "qwen3_coder"}, ["vllm"], "managed", "qwen3_coder"),
        ({}, ["openai"], "openai", None),
        ({"tool_call_parser": "hermes"}, ["openai"], "openai", None),
        ({"tool_call_parser": "hermes", "mode": "managed"}, ["openai"], "managed", "hermes"),
        ({}, [], "openai", None),
        ({"mode": "openai"}, ["vllm"], "openai", None),
        ({"mode": "managed"}, ["sglang"], "managed", "hermes"),
    ],
)
def test_auto_follows_the_server_type(
    fields: dict[str, Any], types: list[str], mode: str, parser: str | None
) -> None:
    choice = _config(**fields).mode_for(types)
    assert (choice.mode, choice.parser) == (mode, parser)


def test_managed_mode_without_a_token_server_or_parser_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        FileEnv(_config(mode="managed"), [_server("openai")])
    assert caught.value.field == "tool_call_parser"


@pytest.mark.parametrize(
    ("field", "value"), [("reasoning_effort", "high"), ("max_reasoning_tokens", 2048)]
)
def test_atropos_reasoning_settings_are_refused_in_managed_mode_and_kept_in_openai_mode(
    field: str, value: object
) -> None:
    """Atropos adds them to OpenAI mode's chat requests (its ``ServerManager``); managed mode
    sends token ids rendered with the chat template, which carry none, so a managed run that
    sets one is refused at start, never run without it."""
    with pytest.raises(ConfigError) as caught:
        FileEnv(_config(mode="managed", **{field: value}), [_server("vllm")])
    assert caught.value.field == field
    assert "managed mode" in caught.value.reason
    env = FileEnv(_config(mode="openai", **{field: value}), [_server("openai")])
    assert getattr(env.config, field) == value


def test_a_vllm_server_makes_the_env_managed_with_the_hermes_parser() -> None:
    env = FileEnv(_config(), [_server("vllm")])
    assert env.settings.mode == "managed"
    assert env.settings.parser == "hermes"
    assert isinstance(env.make_policy(), TokenPolicy)
    assert env.mode_line() == (
        "model mode managed (auto: server_type vllm), parser hermes: tokens are exact "
        "(the sampled ids and their logprobs)"
    )
    openai_env = FileEnv(_config(), [_server("openai")])
    assert isinstance(openai_env.make_policy(chat=_alternating_chat()), ChatPolicy)
    assert "tokens are NOT exact" in openai_env.mode_line()


async def test_the_start_up_log_says_the_mode_and_exactness(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = FileEnv(_config(group_size=2))
    caplog.set_level(logging.INFO, logger="trajcore.env")
    async with (
        FakeSandboxPool() as pool,
        env.rollout_services(pool=pool, policy=env.make_policy(chat=_alternating_chat())),
    ):
        pass
    lines = [r.getMessage() for r in caplog.records if "model mode" in r.getMessage()]
    assert lines == ["model mode openai (auto: no token server type): tokens are NOT exact "
                     "(re-rendered from the conversation): fit for SFT and evaluation, not for "
                     "on-policy RL"]  # fmt: skip


class _ServeOnly(FileEnv):
    """Runs ``serve``'s start without Atropos's loop (which needs a trainer API)."""

    async def _run_with_services(self, run: Any) -> None:
        return None


@pytest.mark.parametrize(("types", "warned"), [(["openai"], 1), (["vllm"], 0)])
async def test_serve_warns_once_about_inexact_tokens(
    caplog: pytest.LogCaptureFixture, types: list[str], warned: int
) -> None:
    env = _ServeOnly(_config(), [_server(t) for t in types])
    caplog.set_level(logging.INFO, logger="trajcore.env")
    await env.env_manager()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == warned
    if warned:
        assert "inexact tokens" in warnings[0].getMessage()
        assert "vllm or sglang" in warnings[0].getMessage()


def _keyless(server_type: str) -> Any:
    return APIServerConfig(
        server_type=server_type, base_url="http://127.0.0.1:9/v1", model_name="m", api_key="",
        tokenizer_name=QWEN,
    )  # fmt: skip


@pytest.mark.parametrize("server_type", ["openai", "vllm"])
def test_a_server_given_no_api_key_gets_a_placeholder_so_the_client_starts(
    server_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--openai.base_url`` without ``--openai.api_key`` (a local vLLM or SGLang server takes
    none): the ``openai`` client Atropos makes refuses to start with an empty key, so such a
    server is given ``OPENAI_API_KEY``, else ``EMPTY``."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    env = FileEnv(_config(), [_keyless(server_type)])
    servers: Any = env.server_configs
    assert [server.api_key for server in servers] == ["EMPTY"]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    env = FileEnv(_config(), [_keyless(server_type)])
    servers = env.server_configs
    assert [server.api_key for server in servers] == ["sk-from-the-environment"]
