"""Settings of one pool: the container pool's run options, name prefix and engine timeout as env
settings; the Nomad agent from ``$NOMAD_ADDR`` and the other Nomad variables; and a setting the
chosen pool never reads refused by name, for every pool and every setting.

Each is driven through the real ways in: ``AgentEnvConfig`` construction, atroposlib's command
line (its parser and its merge of ``--env.*`` flags), and ``trajcore run --set``.
"""

from __future__ import annotations

import logging
import math
import shlex
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

import pytest
from atroposlib.utils.cli import (  # type: ignore[import-untyped]
    extract_namespace,
    get_double_dash_flags,
    merge_dicts,
)
from pydantic_cli import pydantic_class_to_parser

from tests.nomad_testbed import OPENAPI, SLOT_SERVER
from tests.unit.test_agent_env import QWEN, FileEnv
from tests.unit.test_agent_env_nomad import DoneEnv
from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.pools.container_pool import ContainerPoolConfig
from trajcore.adapters.pools.nomad_pool import NomadPoolConfig, NomadSandboxPool
from trajcore.domain.errors import ConfigError
from trajcore.domain.groups import GroupStatus
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints import run
from trajcore.entrypoints.atropos import pools
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.entrypoints.atropos.sandbox_settings import SandboxSettings
from trajcore.testing.fake_nomad.agent import FakeNomadAPI

ROOT = Path(__file__).resolve().parents[2]
SHELL_TASKS = f"{ROOT / 'examples' / 'shell_tasks.py'}:ShellTasksEnv"
NOMAD_VARIABLES = ("NOMAD_ADDR", "NOMAD_TOKEN", "NOMAD_NAMESPACE", "NOMAD_REGION")


@pytest.fixture(autouse=True)
def _no_nomad_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts without the operator's Nomad variables."""
    for variable in NOMAD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def _config(**fields: Any) -> AgentEnvConfig:
    return AgentEnvConfig(tokenizer_name=QWEN, use_wandb=False, **fields)


def _from_atropos_command_line(monkeypatch: pytest.MonkeyPatch, *flags: str) -> AgentEnvConfig:
    """The env's config as atroposlib's ``process`` command builds it from ``flags``: its
    command-line model (pydantic_cli's parser over the ``env.``-prefixed config) reads them,
    then the env's defaults merged with the ``--env.*`` flags as atroposlib reads them from
    ``sys.argv`` build the config."""
    monkeypatch.setattr(sys, "argv", ["env.py", "process", *flags])
    command: Any = FileEnv.get_cli_process_config_cls()
    parsed = vars(
        pydantic_class_to_parser(command, default_value_override={}).parse_args(list(flags))
    )
    command(**{key: value for key, value in parsed.items() if key in command.model_fields})
    defaults, _ = FileEnv.config_init()
    given = extract_namespace(get_double_dash_flags(), "env.")
    return AgentEnvConfig(**merge_dicts(defaults.model_dump(), given))


# ================================================================ the container pool's settings


def test_the_container_pools_options_prefix_and_timeout_are_env_settings() -> None:
    defaults = _config(sandbox="container").container_pool_config()
    pool = ContainerPoolConfig()
    assert (defaults.engine_options, defaults.engine_timeout_s) == (None, pool.engine_timeout_s)
    assert defaults.name_prefix is None  # the pool's: trajcore-<random>
    for options in ("--memory 8g --pids-limit 512", '["--memory", "8g", "--pids-limit", "512"]',
                    ["--memory", "8g", "--pids-limit", "512"]):  # fmt: skip
        config = _config(
            sandbox="container",
            container_engine_options=options,
            container_name_prefix="rl-run.1",
            container_engine_timeout_s=90,
        )
        built = config.container_pool_config()
        assert built.engine_options == ("--memory", "8g", "--pids-limit", "512")
        assert (built.name_prefix, built.engine_timeout_s) == ("rl-run.1", 90.0)
        config.settings()
    quoted = _config(sandbox="container", container_engine_options="--label 'a b'")
    assert quoted.container_pool_config().engine_options == ("--label", "a b")
    assert _config(container_engine_options="None").container_engine_options is None


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("container_engine_options", [1, "8g"], "[0]: expected a non-empty string"),
        ("container_engine_options", ["--memory", ""], "[1]: expected a non-empty string"),
        ("container_engine_options", '["--memory", 8]', "[1]: expected a non-empty string"),
        ("container_engine_options", '["--memory"', "not a JSON list of strings"),
        ("container_engine_options", '{"a": 1}', "expected a list of strings"),
        ("container_engine_options", "--label 'a b", "cannot split"),
        ("container_engine_options", True, '--env.container_engine_options="--memory 8g"'),
        ("container_engine_options", 8, "expected a list of strings"),
        ("container_name_prefix", "two words", "container name prefix"),
        ("container_name_prefix", "-dash", "container name prefix"),
        ("container_name_prefix", "x" * 42, "at most 41 characters"),
        ("container_engine_timeout_s", 0, "seconds"),
        ("container_engine_timeout_s", -1.0, "seconds"),
        ("container_engine_timeout_s", math.inf, "finite"),
        ("container_engine_timeout_s", math.nan, "finite"),
        ("container_engine_timeout_s", "soon", "valid number"),
    ],
)
def test_a_bad_container_setting_is_refused_naming_it(field: str, value: object, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _config(sandbox="container", **{field: value}).settings()
    assert caught.value.field == field
    assert says in caught.value.reason


def test_the_container_settings_are_atropos_command_line_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _from_atropos_command_line(
        monkeypatch,
        "--env.sandbox", "container",
        "--env.container_engine_options=--memory 8g --pids-limit 512",
        "--env.container_name_prefix", "rl-run",
        "--env.container_engine_timeout_s", "90",
    )  # fmt: skip
    built = config.container_pool_config()
    assert built.engine_options == ("--memory", "8g", "--pids-limit", "512")
    assert (built.name_prefix, built.engine_timeout_s) == ("rl-run", 90.0)
    json_list = _from_atropos_command_line(
        monkeypatch, "--env.sandbox", "container",
        '--env.container_engine_options=["--cpus", "2"]',
    )  # fmt: skip
    assert json_list.container_pool_config().engine_options == ("--cpus", "2")
    with pytest.raises(ConfigError) as caught:
        _from_atropos_command_line(
            monkeypatch, "--env.sandbox", "container", "--env.container_name_prefix", "a/b"
        ).settings()
    assert caught.value.field == "container_name_prefix"


def test_the_container_settings_are_trajcore_run_settings() -> None:
    env_class = run.load_object(SHELL_TASKS)
    assert isinstance(env_class, type)
    assert issubclass(env_class, AgentEnv)
    config, _ = run._config(
        env_class,
        [
            "sandbox=container",
            'container_engine_options=["--memory", "8g"]',
            "container_name_prefix=rl-run",
            "container_engine_timeout_s=45",
        ],
    )
    built = config.container_pool_config()
    assert (built.engine_options, built.name_prefix, built.engine_timeout_s) == (
        ("--memory", "8g"), "rl-run", 45.0,
    )  # fmt: skip
    words, _ = run._config(env_class, ["sandbox=container", "container_engine_options=--cpus 2"])
    assert words.container_pool_config().engine_options == ("--cpus", "2")
    with pytest.raises(ConfigError) as caught:
        run._config(env_class, ["container_engine_options=[1]"])
    assert caught.value.field == "container_engine_options"


# ================================================================ the Nomad agent from $NOMAD_*


def test_the_nomad_agent_comes_from_the_nomad_variables_when_not_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _config(sandbox="nomad").nomad_pool_config().address == NomadPoolConfig().address
    monkeypatch.setenv("NOMAD_ADDR", "https://nomad.internal:4646")
    monkeypatch.setenv("NOMAD_TOKEN", "acl-from-the-shell")
    monkeypatch.setenv("NOMAD_NAMESPACE", "rl")
    monkeypatch.setenv("NOMAD_REGION", "eu")
    pool = _config(sandbox="nomad").nomad_pool_config()
    assert (pool.address, pool.token) == ("https://nomad.internal:4646", "acl-from-the-shell")
    assert (pool.job.namespace, pool.job.region) == ("rl", "eu")
    # A setting given wins over its variable.
    given = _config(
        sandbox="nomad",
        nomad_address="http://10.0.0.5:4646",
        nomad_token="acl-given",
        nomad_namespace="ml",
        nomad_region="us",
    ).nomad_pool_config()
    assert (given.address, given.token) == ("http://10.0.0.5:4646", "acl-given")
    assert (given.job.namespace, given.job.region) == ("ml", "us")


def test_an_empty_nomad_variable_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in NOMAD_VARIABLES:
        monkeypatch.setenv(variable, " ")
    pool = _config(sandbox="nomad").nomad_pool_config()
    assert (pool.address, pool.token) == (NomadPoolConfig().address, None)
    assert (pool.job.namespace, pool.job.region) == (None, None)


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        ("NOMAD_ADDR", "nomad.internal:4646", "nomad_address"),
        ("NOMAD_NAMESPACE", "two words", "nomad_namespace"),
        ("NOMAD_REGION", "eu/west", "nomad_region"),
    ],
)
def test_a_bad_nomad_variable_is_refused_naming_the_setting_and_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, field: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        _config(sandbox="nomad").settings()
    assert caught.value.field == field
    assert f"read from ${variable}, as {field} is not set" in caught.value.reason


def test_the_start_up_log_says_where_the_nomad_agent_came_from_never_the_token(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOMAD_ADDR", "http://nomad.internal:4646")
    monkeypatch.setenv("NOMAD_TOKEN", "acl-secret-text")
    with caplog.at_level(logging.INFO, logger="trajcore.entrypoints.atropos.pools"):
        assert isinstance(pools.make_pool(_config(sandbox="nomad")), NomadSandboxPool)
        pools.make_pool(_config(sandbox="nomad", nomad_namespace="rl"))
        monkeypatch.delenv("NOMAD_ADDR")
        monkeypatch.delenv("NOMAD_TOKEN")
        pools.make_pool(_config(sandbox="nomad", nomad_address="http://10.0.0.5:4646"))
        pools.make_pool(_config(sandbox="nomad"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Nomad agent")]
    assert lines == [
        "Nomad agent http://nomad.internal:4646 (from $NOMAD_ADDR); ACL token from "
        "$NOMAD_TOKEN; namespace: the agent's; region: the agent's",
        "Nomad agent http://nomad.internal:4646 (from $NOMAD_ADDR); ACL token from "
        "$NOMAD_TOKEN; namespace rl (from --env.nomad_namespace); region: the agent's",
        "Nomad agent http://10.0.0.5:4646 (from --env.nomad_address); no ACL token; "
        "namespace: the agent's; region: the agent's",
        "Nomad agent http://127.0.0.1:4646 (from default); no ACL token; "
        "namespace: the agent's; region: the agent's",
    ]
    assert "acl-secret-text" not in caplog.text


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_group_runs_on_the_nomad_agent_that_nomad_addr_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def respond(messages: Sequence[Message]) -> ChatTurn:
        if messages[-1].role == "tool":
            return ChatTurn(message=Message.assistant("done"), finish_reason=FinishReason.STOP)
        call = ToolCall(
            id=f"w{len(messages)}",
            name="write_file",
            arguments={"path": "done.txt", "content": "ok"},
        )
        return ChatTurn(
            message=Message.assistant("writing", tool_calls=[call]),
            finish_reason=FinishReason.TOOL_CALLS,
        )

    async with FakeNomadAPI(openapi=OPENAPI) as fake:
        monkeypatch.setenv("NOMAD_ADDR", fake.address)
        env = DoneEnv(
            _config(
                sandbox="nomad",
                group_size=2,
                max_turns=3,
                max_token_length=8192,
                slot_lifetime_s=30.0,
                acquire_timeout_s=20.0,
                terminal_timeout_s=5.0,
                nomad_driver="raw_exec",
                nomad_command=shlex.join(SLOT_SERVER),
                slots_per_container=2,
                min_containers=1,
                max_containers=1,
            )
        )
        result = await env.run_task(
            "ok", policy=env.make_policy(chat=FakeChatServer(policy=respond))
        )
    assert result.verdict.status is GroupStatus.COMPLETE
    assert any(r.path == "/v1/job/trajcore-slots" and r.method == "POST" for r in fake.requests)


# ================================================================ a setting no pool reads


def _probe(sandbox: str) -> AgentEnvConfig:
    """A config of ``sandbox`` that its settings builder accepts (the SSH pool needs a host)."""
    return (
        _config(sandbox=sandbox, ssh_host="host") if sandbox == "ssh" else _config(sandbox=sandbox)
    )


BUILT_IN = ("local", "container", "nomad", "ssh", "slurm", "modal", "daytona")
SETTINGS = [name for name in SandboxSettings.model_fields if name != "sandbox"]


def _other_value(name: str) -> object:
    """A value of setting ``name`` other than its default, of the type its flag reads."""
    field = AgentEnvConfig.model_fields[name]
    default = field.get_default(call_default_factory=True)
    kinds = set(get_args(field.annotation)) or {field.annotation}
    if isinstance(default, bool):
        return not default
    if isinstance(default, int | float):
        return default + 1
    if isinstance(default, str):
        return f"{default}-other" if default else "other"
    if int in kinds:
        return 2
    if float in kinds:
        return 2.5
    if any(isinstance(kind, types.GenericAlias) for kind in kinds):  # list[str] | str | None
        return ["--other"]
    return "/other"


def test_every_sandbox_setting_is_read_by_some_built_in_pool() -> None:
    """The settings builders are the one table of which pool reads which setting: a setting
    added without a pool that reads it would be refused with every pool."""
    read_by: dict[str, list[str]] = {name: [] for name in SETTINGS}
    for sandbox in BUILT_IN:
        for name in pools.settings_read(_probe(sandbox), sandbox):
            read_by[name].append(sandbox)
    assert [name for name, readers in read_by.items() if not readers] == []
    assert read_by["nomad_address"] == ["nomad"]
    assert read_by["container_name_prefix"] == ["container"]
    assert set(read_by["slots_per_container"]) == set(BUILT_IN)


@pytest.mark.parametrize("sandbox", BUILT_IN)
def test_each_setting_the_chosen_pool_never_reads_is_refused_naming_it_and_the_pool(
    sandbox: str,
) -> None:
    reads = pools.settings_read(_probe(sandbox), sandbox)
    unread = [name for name in SETTINGS if name not in reads]
    assert unread, sandbox  # every pool has settings of others
    for name in unread:
        base = {"ssh_host": "host"} if sandbox == "ssh" and name != "ssh_host" else {}
        config = _config(sandbox=sandbox, **base, **{name: _other_value(name)})
        assert pools.unread_settings(config) == [name], name
        if sandbox in ("modal", "daytona"):
            continue  # their check wants the SDK and credentials first; the list is the same
        with pytest.raises(ConfigError) as caught:
            config.settings()
        assert caught.value.field == name
        assert f"sandbox {sandbox!r} never reads it" in caught.value.reason
        readers = pools.settings_readers(config, name)
        assert readers, name
        assert f"it is a setting of sandbox {readers[0]!r}" in caught.value.reason


def test_a_token_set_for_a_pool_that_never_reads_it_is_not_shown() -> None:
    with pytest.raises(ConfigError) as caught:
        _config(nomad_token="acl-secret-text").settings()
    assert caught.value.field == "nomad_token"
    assert "acl-secret-text" not in str(caught.value)
    assert "sandbox 'nomad'" in caught.value.reason


def test_an_unread_setting_is_refused_from_the_atropos_command_line_and_trajcore_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _from_atropos_command_line(
        monkeypatch, "--env.nomad_address", "http://nomad.internal:4646"
    )
    with pytest.raises(ConfigError) as caught:
        FileEnv(config)  # before Atropos loads the tokenizer
    assert caught.value.field == "nomad_address"
    assert "sandbox 'local' never reads it" in caught.value.reason
    argv = [SHELL_TASKS, "--policy", "solve", "--set", "container_name_prefix=rl-run"]
    assert run.main(argv) == 2
    err = capsys.readouterr().err
    assert "sandbox 'local' never reads it" in err
    assert "container_name_prefix" in err
