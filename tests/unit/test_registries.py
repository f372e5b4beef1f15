"""Open registries: a parser, a pool source and a tokenizer mode defined here, outside trajcore,
are registered by name and selected from the config as a user would (``AgentEnvConfig``,
``make_pool``, ``make_policy``), end to end; unknown names are refused listing them too; and
packages that name them as entry points are found without being imported."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from tests.unit.test_agent_env import FileEnv, _config
from trajcore.adapters.fakes.llm import FakeTokenServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.errors import ConfigError
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.domain.tool_parsers import PARSER_NAMES, get_parser, parser_names, register_parser
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.domain.turns import ParsedTurn
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.pools import POOLS, make_pool, register_pool, unread_settings
from trajcore.entrypoints.atropos.registries import discover
from trajcore.entrypoints.atropos.tokenizer_modes import (
    TOKENIZER_MODES,
    hf_tokenizer,
    register_tokenizer_mode,
)
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.ports.tokenizer import Tokenizer
from trajcore.rollout.policy import TokenPolicy

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ------------------------------------------------------------ what a package outside trajcore has


class ArrowParser:
    """A made-up family: each call is a line ``>>> NAME {json arguments}``."""

    name = "test_arrow"

    def parse(
        self, text: str, *, tools: Sequence[ToolSpec] | None = None, id_prefix: str = "call"
    ) -> ParsedTurn:
        content: list[str] = []
        calls: list[ToolCall] = []
        for line in text.splitlines():
            if line.startswith(">>> "):
                name, _, arguments = line[4:].partition(" ")
                calls.append(
                    ToolCall(
                        id=f"{id_prefix}_{len(calls)}", name=name, arguments=json.loads(arguments)
                    )
                )
            else:
                content.append(line)
        return ParsedTurn(content="\n".join(content).strip(), calls=calls)

    def render(self, calls: Sequence[ToolCall], *, content: str = "") -> str:
        lines = [f">>> {c.name} {json.dumps(dict(c.arguments))}" for c in calls]
        return "\n".join([content, *lines] if content else lines)


made_pools: list[AgentEnvConfig] = []
made_tokenizers: list[Tokenizer] = []


def recording_pool(config: AgentEnvConfig) -> AbstractAsyncContextManager[SandboxPool]:
    made_pools.append(config)
    return FakeSandboxPool(containers=1, slots_per_container=config.slots_per_container)


def one_container_only(config: AgentEnvConfig) -> None:
    if config.local_containers != 1:
        raise ConfigError("local_containers", "the recording pool has one container")


def recording_tokenizer(config: AgentEnvConfig, atropos_tokenizer: object) -> Tokenizer:
    tokenizer = hf_tokenizer(config, atropos_tokenizer)
    made_tokenizers.append(tokenizer)
    return tokenizer


register_parser("test_arrow", ArrowParser)
register_pool("test_recording", recording_pool, check=one_container_only)
register_tokenizer_mode("test_recording", recording_tokenizer)


# --------------------------------------------------------------------------------------- tests


async def test_an_out_of_tree_parser_pool_and_tokenizer_mode_run_a_group_from_config() -> None:
    made_pools.clear()
    made_tokenizers.clear()
    env = FileEnv(
        _config(
            group_size=2,
            mode="managed",
            tool_call_parser="test_arrow",
            sandbox="test_recording",
            tokenizer_mode="test_recording",
            local_containers=1,
        )
    )
    tokenizer = env.tokenizer_port()  # built by the registered mode
    counter = itertools.count()

    def respond(prompt: Sequence[int]) -> TokenCompletion:
        n = next(counter)
        if tokenizer.decode(prompt).count("<|im_start|>assistant") > 1:
            text = "All done."
        else:
            call = ToolCall(
                id="x",
                name="write_file",
                arguments={"path": "done.txt", "content": "ok" if n % 2 else "no"},
            )
            text = ArrowParser().render([call], content="Writing.")
        ids = [*tokenizer.encode(text), *tokenizer.encode("<|im_end|>")]
        return TokenCompletion.of(ids, [-0.5] * len(ids), FinishReason.STOP)

    policy = env.make_policy(token=FakeTokenServer(policy=respond))
    assert isinstance(policy, TokenPolicy)
    assert isinstance(policy.parser, ArrowParser)
    assert made_tokenizers == [policy.tokenizer]
    result = await env.run_task("ok", policy=policy)  # the pool is the configured one
    assert [c.sandbox for c in made_pools] == ["test_recording"]
    assert sorted(m.outcome.score or 0.0 for m in result.members) == [0.0, 1.0]
    for member in result.members:
        assert [e.call.name for e in member.exchanges] == ["write_file"]
    assert env.scored_group(result) is not None


def test_the_pool_factory_is_what_make_pool_returns() -> None:
    made_pools.clear()
    config = _config(sandbox="test_recording", local_containers=1)
    assert isinstance(make_pool(config), FakeSandboxPool)
    assert made_pools == [config]


def test_a_registered_sources_check_runs_when_the_settings_are_checked() -> None:
    config = _config(sandbox="test_recording", local_containers=2)
    with pytest.raises(ConfigError) as caught:
        config.settings()
    assert caught.value.field == "local_containers"


@pytest.mark.parametrize(
    ("sandbox", "given", "unread"),
    [
        ("local", {"nomad_address": "http://nomad.internal:4646"}, ["nomad_address"]),
        ("local", {"min_containers": 2, "container_image": "mine"}, ["container_image",
                                                                     "min_containers"]),
        ("container", {"container_image": "mine", "local_containers": 3}, []),
        ("ssh", {"ssh_host": "h", "image_cache_dir": "/cache"}, ["image_cache_dir"]),
        ("nomad", {"local_containers": 3, "image_cache_dir": "/cache"}, ["local_containers"]),
    ],
)  # fmt: skip
def test_a_setting_the_chosen_pool_never_reads_is_refused_by_name(
    sandbox: str, given: dict[str, object], unread: list[str]
) -> None:
    config = _config(sandbox=sandbox, **given)
    assert sorted(unread_settings(config)) == unread
    if not unread:
        config.settings()
        return
    with pytest.raises(ConfigError) as caught:
        config.settings()
    assert caught.value.field in unread
    assert sorted(problem.rpartition(" @ ")[2] for problem in caught.value.problems) == unread
    for problem in caught.value.problems:
        assert f"sandbox {sandbox!r} never reads it" in problem


def test_a_source_that_names_no_settings_builder_is_not_second_guessed() -> None:
    config = _config(sandbox="test_recording", local_containers=1, nomad_address="http://n:1")
    assert unread_settings(config) == []


@pytest.mark.parametrize(
    ("field", "builtins", "registered"),
    [
        ("tool_call_parser", PARSER_NAMES, "test_arrow"),
        ("sandbox", ("local", "container", "nomad", "ssh", "slurm"), "test_recording"),
        ("tokenizer_mode", ("hf", "mistral"), "test_recording"),
    ],
)
def test_an_unknown_name_is_refused_naming_the_field_and_every_known_name(
    field: str, builtins: tuple[str, ...], registered: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _config(**{field: "no_such_name"})
    assert caught.value.field == field
    assert "'no_such_name'" in caught.value.reason
    for name in (*builtins, registered):
        assert name in caught.value.reason


def test_trajcores_own_names_are_registered_the_same_way() -> None:
    assert parser_names()[: len(PARSER_NAMES)] == PARSER_NAMES
    assert POOLS.names()[:5] == ("local", "container", "nomad", "ssh", "slurm")
    assert TOKENIZER_MODES.names()[:2] == ("hf", "mistral")


def test_a_name_is_registered_once_unless_replaced() -> None:
    with pytest.raises(ConfigError, match=r"'hermes' is already registered") as parser:
        register_parser("hermes", ArrowParser)
    assert parser.value.field == "tool_call_parser"
    with pytest.raises(ConfigError, match=r"'local' is already registered") as pool:
        register_pool("local", recording_pool)
    assert pool.value.field == "sandbox"
    with pytest.raises(ConfigError, match=r"'hf' is already registered") as mode:
        register_tokenizer_mode("hf", recording_tokenizer)
    assert mode.value.field == "tokenizer_mode"
    register_parser("test_arrow", ArrowParser, replace=True)
    assert isinstance(get_parser("test_arrow"), ArrowParser)
    with pytest.raises(ConfigError, match=r"not a plain name"):
        register_pool("two words", recording_pool)


def _install_plugin(root: Path, *, module: str, entry_points: str) -> None:
    """A package installed on ``root`` (a ``.dist-info`` with its entry points), never imported."""
    (root / f"{module}.py").write_text(
        "from trajcore.adapters.fakes.sandbox import FakeSandboxPool\n"
        "from trajcore.domain.tool_parsers.hermes import HermesParser\n"
        "def parser():\n"
        "    return HermesParser(family='qwen')\n"
        "def pool(config):\n"
        "    return FakeSandboxPool(containers=1, slots_per_container=1)\n",
        encoding="utf-8",
    )
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")


def test_entry_points_of_an_installed_package_are_selectable_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "trajcore_test_plugin"
    _install_plugin(
        tmp_path,
        module=module,
        entry_points=(
            f"[trajcore.tool_parsers]\ntest_plugin_parser = {module}:parser\n"
            f"[trajcore.sandboxes]\ntest_plugin_pool = {module}:pool\n"
        ),
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    discover(again=True)
    config = _config(
        mode="managed", tool_call_parser="test_plugin_parser", sandbox="test_plugin_pool"
    )
    assert get_parser("test_plugin_parser").name == "qwen"
    assert isinstance(make_pool(config), FakeSandboxPool)


def test_an_entry_point_that_cannot_load_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "trajcore_test_broken_plugin"
    _install_plugin(
        tmp_path,
        module=module,
        entry_points=f"[trajcore.tokenizer_modes]\ntest_broken = {module}:missing\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        discover(again=True)
    assert caught.value.field == "trajcore.tokenizer_modes.test_broken"
    assert "cannot load" in caught.value.reason
