"""A vLLM or SGLang server's tokenizer that cannot load is named as the server's setting.

Atropos's vLLM and SGLang server classes load a tokenizer of their own, ``--openai.tokenizer_name``
or else ``--openai.model_name`` (often a served alias, not a Hugging Face name). That failure was
reported at the env's ``tokenizer_name``, which had loaded, with that very path as the fix.
"""

from __future__ import annotations

import pytest
from atroposlib.envs.server_handling.server_baseline import (  # type: ignore[import-untyped]
    APIServerConfig,
)

from tests.unit.test_agent_env import QWEN, FileEnv, _config
from trajcore.domain.errors import ConfigError


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _vllm(**fields: str) -> list[APIServerConfig]:
    return [
        APIServerConfig(
            server_type="vllm",
            base_url="http://127.0.0.1:9/v1",
            model_name="served-alias",
            **fields,
        )
    ]


def test_the_servers_own_tokenizer_is_named_at_openai_tokenizer_name() -> None:
    with pytest.raises(ConfigError) as caught:
        FileEnv(_config(), _vllm())
    assert caught.value.field == "openai.tokenizer_name"
    assert "'served-alias' could not be loaded" in caught.value.reason
    assert "--openai.tokenizer_name" in caught.value.reason


def test_the_envs_tokenizer_is_still_named_at_tokenizer_name() -> None:
    with pytest.raises(ConfigError) as caught:
        FileEnv(_config(tokenizer_name="no-such-org/no-such-tokenizer"), _vllm(tokenizer_name=QWEN))
    assert caught.value.field == "tokenizer_name"
    assert "'no-such-org/no-such-tokenizer' could not be loaded" in caught.value.reason


def test_a_server_given_a_loadable_tokenizer_starts() -> None:
    env = FileEnv(_config(), _vllm(tokenizer_name=QWEN))
    assert env.config.tokenizer_name == QWEN
