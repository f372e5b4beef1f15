"""The Atropos entrypoint: ``AgentEnv``, an Atropos ``BaseEnv`` whose groups are agent trajectories.

An env author subclasses ``AgentEnv[Item]`` (``Item`` is whatever the dataset yields), writes a
few typed hooks, and runs ``python my_env.py serve|process|evaluate`` as with any Atropos env::

    class FixEnv(AgentEnv[Task]):
        name = "fix"

        async def get_next_item(self) -> Task: ...
        def build_task(self, item: Task) -> str: ...                    # or a list of Messages
        async def prepare_workspace(self, item: Task, tools: SlotTools) -> JSONObject | None: ...
        async def verify_and_score(
            self, item: Task, tools: SlotTools, messages: Transcript
        ) -> float | tuple[float, JSONObject]: ...
        def item_limits(self, item: Task) -> ItemLimits | None: ...   # turns, tokens, deadline

    if __name__ == "__main__":
        FixEnv.cli()

What the env does for each item: it draws the group's tools once (``enabled_toolsets`` or a
``toolset_distribution``, minus ``disabled_toolsets``), runs ``group_size`` trajectories
concurrently (``trajcore.rollout``: each leases a sandbox slot, prepares it, loops the agent,
verifies and scores in the same slot, releases the slot whatever happens), lets the domain
``GroupPolicy`` judge the group, and hands Atropos a ``ScoredDataGroup``.

Rules this module keeps:

- **Fail at start, naming the field.** ``AgentEnvConfig`` turns pydantic's errors into one
  ``ConfigError`` (``reason @ field``); ``AgentEnv.__init__`` checks the whole setting (limits,
  parser name, toolset names, the sandbox and its Nomad settings) before Atropos loads the
  tokenizer. A bad Nomad setting is named by its env field (``nomad_driver``, ``privileged``, ...);
  whether the Nomad agent answers is checked when the pool starts (``NomadUnavailable``, naming
  ``address`` or ``token``).
- **Two model modes, one switch.** ``mode`` is ``"openai"``, ``"managed"`` or ``"auto"`` (the
  default). ``auto`` means managed when an ``--openai.*`` server's ``server_type`` is ``vllm`` or
  ``sglang`` (as hermes-agent chose; the parser defaults to ``hermes`` there) or when
  ``tool_call_parser`` is set, and OpenAI mode otherwise. Managed: trajcore renders the chat
  template with the env's tokenizer, samples token ids through the server's token endpoint,
  keeps the sampled ids and logprobs verbatim and parses tool calls itself. OpenAI mode: the
  server templates and parses; tokens are re-rendered from the conversation and are not the
  sampled ones. The start-up log says the mode, why, and whether tokens are exact; ``serve``
  (which feeds a trainer) warns once when they are not.
- **What the trainer gets.** ``tokens`` and ``masks`` of equal length per member (``-100``
  outside the model's completions), ``scores``, ``messages`` (OpenAI chat dicts, tool calls and
  results included), and in managed mode ``inference_logprobs``. Every group says whether its
  tokens are exact: ``group_overrides["token_exact"]`` and ``overrides[i]["token_exact"]``; an
  OpenAI-mode group carries ``False`` there and no ``inference_logprobs`` (it is fit for SFT and
  evaluation, not for on-policy RL). Each member's ``overrides[i]["trajcore"]`` holds its id, stop
  reason, turns, tool calls and tool errors, and the metadata its prepare and score hooks
  returned (``prepare_metadata``, ``score_metadata``), which the log shows too.
- **Failures are not zeros.** Members that failed for infrastructure reasons (sandbox, slot
  server, tool server, model server) are never scored; ``on_failure`` drops such a group or keeps
  its healthy members (when at least ``min_healthy`` remain). A kept partial group is sent with
  ``group_overrides["group_size"]`` set to the number of members it holds, because Atropos
  silently discards a group whose size differs from the configured one. A dropped group is
  ``None``, with the reason in the log.
- **Tool errors are counted and logged.** Every group's tool errors, parse errors, failed
  members and token drift go to the log (one line per group); ``wandb_log`` adds them as
  ``trajcore/*`` metrics, hermes-agent's ``train/tool_errors_count`` and
  ``train/tool_error_details``, and the pool's and dispatcher's statistics
  (``trajcore/pool/*``, ``trajcore/dispatcher/*``); the rollout table shows each conversation
  with its tool calls and results as readable text.
- **Services live as long as the run.** The sandbox pool, the batching tool dispatcher, the tool
  server client and the model adapters are built once when ``serve``, ``process`` or
  ``evaluate`` starts (before ``setup``), shared by every group, and closed when the run ends.
  They are anyio services, so they are opened and closed in the run's main task
  (``rollout_services``). A worker that Atropos cancels releases its slots on the way out.

- **Types that hold.** ``AgentEnv`` and ``AgentEnvConfig`` inherit atroposlib's bases through
  typed faces (``atropos_bases``), so mypy --strict sees a misspelt config field or hook, and a
  wrong hook signature; ``AgentEnv[Item, MyConfig]`` types ``self.config`` as ``MyConfig``.
- **Seed settings port.** Every setting name of atropos-agent and hermes-agent is accepted with
  its meaning and one ``SeedSettingWarning`` (``seed_settings``); any other unknown name is a
  ``ConfigError`` with the closest known name (``docs/porting.md``).

Injection points for tests and notebooks: override ``make_pool``, ``make_chat_server``,
``make_token_server`` or ``make_tool_server`` in a subclass (fakes in ``trajcore.adapters.fakes``),
or pass ``policy=``, ``pool=`` and ``tool_server=`` to ``run_task``, which runs one item as one
group without Atropos's API server and returns the ``GroupResult``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import logging
import math
import random
import shutil
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Generic, Literal, TypedDict, cast

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs
from atroposlib.envs.server_handling.server_baseline import (  # type: ignore[import-untyped]
    APIServerConfig,
    ServerBaseline,
)
from pydantic import Field, ValidationError, field_validator, model_validator
from typing_extensions import TypeVar

from trajcore.adapters.generation_config import generation_stop_ids
from trajcore.adapters.llm.atropos import (
    ServerManagerChatServer,
    ServerManagerTokenServer,
    close_server_manager,
    token_server_from_config,
)
from trajcore.adapters.sandbox.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.adapters.sandbox.nomad_pool import NomadPoolConfig, NomadSandboxPool
from trajcore.adapters.tokenizers import TransformersTokenizer
from trajcore.adapters.tool_server import INPROCESS, HTTPToolServer, ToolRegistry
from trajcore.domain.agent_loop import AgentLoopConfig
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import ConfigError, SandboxUnavailable, StateError
from trajcore.domain.groups import GroupPolicy, OnFailure
from trajcore.domain.messages import JSONObject, Message, ToolOutcome, ToolSpec
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.slot_server_flags import SlotServerFlags
from trajcore.domain.token_ledger import ChatTemplate
from trajcore.domain.tool_parsers import PARSER_NAMES, get_parser
from trajcore.domain.toolsets import (
    DistributionRegistry,
    Toolset,
    ToolsetCatalog,
    ToolsetDistribution,
    ToolsetSelection,
    select_specs,
)
from trajcore.entrypoints.atropos_bases import BaseEnv, BaseEnvConfig
from trajcore.entrypoints.dataset_rows import DatasetRows, load_rows
from trajcore.entrypoints.idle_slots import IdleLimitedPolicy
from trajcore.entrypoints.item_limits import ItemLimits
from trajcore.entrypoints.seed_settings import translate_seed_fields
from trajcore.entrypoints.tool_server import make_app
from trajcore.ports.chat_server import ChatServer
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.ports.token_server import TokenServer
from trajcore.ports.tokenizer import Tokenizer
from trajcore.ports.tool_server import ToolServer
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.group import GroupResult, collect_group
from trajcore.rollout.policy import ChatPolicy, Policy, TokenPolicy
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import (
    RolloutConfig,
    ScoreAnswer,
    ToolExchange,
    TrajectoryHooks,
    TrajectoryResult,
    Transcript,
    run_trajectory,
)

__all__ = [
    "AgentEnv",
    "AgentEnvConfig",
    "MemberOverrides",
    "RolloutServices",
    "RolloutSettings",
    "ScoredGroup",
    "render_transcript",
]

log = logging.getLogger("trajcore.env")

ItemT = TypeVar("ItemT")
ConfigT_co = TypeVar("ConfigT_co", bound="AgentEnvConfig", default="AgentEnvConfig", covariant=True)
"""The env's config class: ``AgentEnv[Item, MyConfig]`` types ``self.config`` as ``MyConfig``."""

Mode = Literal["auto", "openai", "managed"]

# Toolsets of the default catalog: the slot tools by kind, and the tool server's tools.
_DEFAULT_TOOLSETS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("terminal", ("bash",), "a fresh shell per command"),
    ("stateful_terminal", ("bash_stateful", "tmux"), "the slot's persistent shell"),
    ("file", ("read_file", "write_file"), "read and write workspace files"),
)
EXTERNAL_TOOLSET = "external"
"""The default catalog's toolset of every tool the tool server offers."""


# ================================================================================== config


def _field_of(location: Sequence[object]) -> str:
    return ".".join(str(part) for part in location) or "config"


def _config_error(exc: ValidationError) -> ConfigError:
    problems = tuple(
        f"{error['msg']} @ {_field_of(error['loc'])}" for error in exc.errors(include_url=False)
    )
    first = exc.errors(include_url=False)[0]
    return ConfigError(_field_of(first["loc"]), str(first["msg"]), problems=problems)


def _split_names(value: object) -> object:
    """CLI values arrive as text: ``"a,b"`` or ``["a,b", "c"]`` become ``["a", "b", "c"]``."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple):
        out: list[object] = []
        for part in value:
            if isinstance(part, str):
                out.extend(name.strip() for name in part.split(",") if name.strip())
            else:
                out.append(part)
        return out
    return value


def _json_or_pairs(field: str, value: object) -> object:
    """A mapping given as text on the CLI: JSON (``{"a": 0.5}``) or pairs (``a=0.5,b=1``)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text or text == "None":
        return None
    if text.startswith("{"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ConfigError(field, f"not valid JSON: {exc}") from None
    pairs: dict[str, object] = {}
    for part in text.split(","):
        name, sep, number = part.partition("=")
        if not sep or not name.strip():
            raise ConfigError(field, f"expected JSON or name=value pairs, got {value!r}")
        try:
            pairs[name.strip()] = float(number)
        except ValueError:
            raise ConfigError(field, f"{number.strip()!r} is not a number (in {part!r})") from None
    return pairs


# NomadPoolConfig's field names -> the env fields they come from.
_NOMAD_FIELDS: dict[str, str] = {
    name: f"nomad_{name}"
    for name in (
        "address", "job_id", "driver", "image", "command", "token", "namespace", "region",
        "datacenters",
    )
}  # fmt: skip


def _mistral_tokenizer(config: AgentEnvConfig) -> Tokenizer:
    """``MistralCommonTokenizer`` over ``mistral_tokenizer_file``, or the one Mistral file in the
    ``tokenizer_name`` folder (``tekken.json``, else the newest ``tokenizer.model.v*``)."""
    field = "mistral_tokenizer_file"
    try:
        from trajcore.adapters.mistral import MistralCommonTokenizer
    except ImportError as exc:
        raise ConfigError(
            "tokenizer_mode", f"'mistral' needs pip install 'trajcore[mistral]' ({exc})"
        ) from None
    if config.mistral_tokenizer_file is not None:
        file = Path(config.mistral_tokenizer_file)
    else:
        folder = Path(str(config.tokenizer_name))
        found = sorted(folder.glob("tokenizer.model.v*")) if folder.is_dir() else []
        tekken = folder / "tekken.json"
        if tekken.is_file():
            found = [tekken]
        if not found:
            raise ConfigError(
                field, f"no tekken.json or tokenizer.model.v* in {str(folder)!r}: name the file"
            )
        file = found[-1]
    try:
        return MistralCommonTokenizer.from_file(file)
    except ConfigError as exc:
        raise ConfigError(field, exc.reason) from None


class AgentEnvConfig(BaseEnvConfig):
    """An agent env's settings: Atropos's ``BaseEnvConfig`` plus trajcore's (section 7).

    Every field can be given as ``--env.<field>`` on the command line or under ``env:`` in the
    YAML config. Lists accept comma-separated text (``--env.enabled_toolsets terminal,file``);
    ``toolset_distribution`` and ``extra_body`` accept JSON text, and the distribution also
    ``name=p`` pairs (``terminal=1,file=0.5``).

    Raises (when built):
        ConfigError: a field of the wrong type or out of range, naming it (``reason @ field``;
            ``problems`` lists every fault pydantic found).
    """

    # -- model mode
    mode: Mode = Field(
        default="auto",
        description="openai: the server templates and parses (tokens not exact); managed: "
        "trajcore renders, samples token ids, parses calls (exact tokens and logprobs); "
        "auto: managed for a vllm/sglang server type or when tool_call_parser is set, "
        "else openai.",
    )
    tool_call_parser: str | None = Field(
        default=None,
        description=f"Tool-call parser for managed mode, one of {', '.join(PARSER_NAMES)}.",
    )
    tokenizer_mode: Literal["hf", "mistral"] = Field(
        default="hf",
        description="How managed mode renders and tokenizes: 'hf' (tokenizer_name's chat "
        "template) or 'mistral' (Mistral's own encoder, mistral_common; as vLLM's "
        "--tokenizer-mode mistral).",
    )
    mistral_tokenizer_file: str | None = Field(
        default=None,
        description="With tokenizer_mode 'mistral': the tekken.json or tokenizer.model.v* file "
        "(default: the one in the tokenizer_name folder).",
    )
    # -- sandbox
    sandbox: Literal["local", "nomad"] = Field(
        default="local", description="Where slots run: local slot servers, or a Nomad cluster."
    )
    local_containers: int = Field(default=2, ge=1, description="Local pool: slot servers (K).")
    slots_per_container: int = Field(default=8, ge=1, description="Slots per container (N).")
    nomad_address: str = Field(default="http://127.0.0.1:4646", description="Nomad API URL.")
    nomad_job_id: str = Field(default="trajcore-slots", description="Nomad job of the slots.")
    nomad_image: str = Field(default="trajcore/slot-server:latest", description="Slot image.")
    nomad_driver: str = Field(
        default="docker", description="Nomad task driver: docker, exec or raw_exec."
    )
    nomad_command: str = Field(
        default="trajcore slot-server",
        description="Nomad: the slot server command as the task runs it (words).",
    )
    nomad_token: str | None = Field(
        default=None, description="Nomad ACL token (default: $NOMAD_TOKEN)."
    )
    nomad_namespace: str | None = Field(default=None, description="Nomad namespace.")
    nomad_region: str | None = Field(default=None, description="Nomad region.")
    nomad_datacenters: str = Field(
        default="dc1", description="Nomad datacenters for the slots, comma-separated."
    )
    min_containers: int = Field(default=1, ge=1, description="Nomad: fewest containers.")
    max_containers: int = Field(default=10, ge=1, description="Nomad: most containers.")
    privileged: bool = Field(default=False, description="Nomad: run containers privileged.")
    purge_on_start: bool = Field(default=False, description="Nomad: purge the job on start.")
    purge_on_shutdown: bool = Field(default=True, description="Nomad: purge it on shutdown.")
    acquire_timeout_s: float = Field(default=600.0, gt=0, description="Longest wait for a slot.")
    allow_network: bool = Field(default=False, description="Slots may reach the network.")
    require_sandbox: bool = Field(
        default=False, description="Refuse to start when commands cannot run isolated."
    )
    require_stateful_sandbox: bool = Field(
        default=False,
        description="Refuse to start when slots cannot keep a persistent shell "
        "(bash_stateful, tmux; the local pool needs tmux on the host).",
    )
    # -- batching
    batch_window_ms: float = Field(
        default=5.0, ge=0, description="Longest a tool call waits for others to share a request."
    )
    max_batch_size: int = Field(default=64, ge=1, description="Most calls in one request.")
    # -- agent
    max_turns: int = Field(default=30, ge=1, description="Most assistant turns per trajectory.")
    agent_temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")
    max_tokens: int | None = Field(
        default=4096,
        ge=1,
        description="Most tokens sampled per turn; None: no cap of its own, each turn may use "
        "what is left of max_token_length.",
    )
    tool_delay_s: float = Field(default=0.0, ge=0, description="Pause before each tool batch.")
    system_prompt: str | None = Field(default=None, description="Prepended to every task.")
    terminal_timeout_s: float = Field(
        default=120.0, gt=0, description="Limit of one slot tool call (the env's, not the model's)."
    )
    slot_lifetime_s: float = Field(
        default=540.0,
        gt=0,
        description="The trajectory's single deadline: slot wait, model, tools and scoring; "
        "below worker_timeout, after which Atropos cancels the whole group.",
    )
    slot_idle_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Idle lifetime of a slot: a trajectory whose slot waits longer than this for "
        "one model turn ends (model_error, unscored). None: only slot_lifetime_s bounds it.",
    )
    tool_threads: int = Field(
        default=40,
        ge=1,
        description="Worker threads for synchronous tool_registry() tools (calls beyond this "
        "wait for a thread).",
    )
    # -- dataset (the built-in get_next_item and build_task)
    dataset: str | None = Field(
        default=None,
        description="Rows for the built-in get_next_item: a local .jsonl or .parquet file, a "
        "folder saved by datasets, or a Hugging Face dataset name (loaded offline).",
    )
    dataset_split: str = Field(default="train", description="The dataset's split.")
    prompt_field: str = Field(
        default="prompt", description="The row field the built-in build_task sends as the task."
    )
    extra_body: dict[str, Any] | str | None = Field(
        default=None, description="Passed verbatim in every model request body (JSON)."
    )
    # -- toolsets and external tools
    enabled_toolsets: list[str] | str | None = Field(
        default=None, description="Toolsets offered to every group (default: all)."
    )
    disabled_toolsets: list[str] = Field(
        default_factory=list, description="Toolsets never offered."
    )
    toolset_distribution: dict[str, float] | str | None = Field(
        default=None,
        description="Per-group random toolsets: each included with its probability, or the "
        "name of one of the env's toolset_distributions().",
    )
    toolset_seed: int | None = Field(default=None, description="Seed of the toolset draws.")
    tool_server_url: str | None = Field(
        default=None,
        description="External tools: a tool server's http(s) URL, or 'inprocess' to serve "
        "the env's tool_registry() inside this process.",
    )
    tool_server_token: str | None = Field(default=None, description="Its bearer token.")
    tool_servers: dict[str, dict[str, Any]] | str | None = Field(
        default=None,
        description="MCP servers whose tools the model may call: {name: {command | url, ...}} "
        "(JSON text on the command line); each server's tools form a toolset named after it.",
    )
    # -- groups
    on_failure: Literal["drop", "keep_healthy"] = Field(
        default="keep_healthy",
        description="A group with failed members: drop it, or keep its healthy members.",
    )
    min_healthy: int | None = Field(
        default=None, ge=1, description="Fewest members a group is sent with (default 2)."
    )

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _config_error(exc) from None

    @model_validator(mode="before")
    @classmethod
    def _seed_names_and_unknown_fields(cls, data: object) -> object:
        """Seed names become their fields (one warning each); unknown names are refused."""
        if not isinstance(data, Mapping):
            return data
        known = {*cls.model_fields}
        known.update(f.alias for f in cls.model_fields.values() if f.alias)
        return translate_seed_fields({str(k): v for k, v in data.items()}, known)

    @field_validator("enabled_toolsets", "disabled_toolsets", mode="before")
    @classmethod
    def _names_from_text(cls, value: object) -> object:
        return None if value is None or value == "None" else _split_names(value)

    @field_validator("toolset_distribution", mode="before")
    @classmethod
    def _distribution_from_text(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().isidentifier():
            return value.strip()  # the name of one of the env's toolset_distributions()
        return _json_or_pairs("toolset_distribution", value)

    @field_validator("extra_body", mode="before")
    @classmethod
    def _body_from_text(cls, value: object) -> object:
        if isinstance(value, str) and value.strip() and not value.strip().startswith("{"):
            raise ConfigError("extra_body", f"expected a JSON object, got {value!r}")
        return _json_or_pairs("extra_body", value)

    @field_validator("tool_call_parser")
    @classmethod
    def _known_parser(cls, value: str | None) -> str | None:
        if value is not None:
            get_parser(value)  # ConfigError at tool_call_parser, listing the known names
        return value

    @field_validator("tool_servers")
    @classmethod
    def _tool_servers(
        cls, value: dict[str, dict[str, Any]] | str | None
    ) -> dict[str, dict[str, Any]] | str | None:
        if value is None:
            return None
        try:
            from trajcore.adapters.mcp import parse_tool_servers
        except ImportError as exc:
            raise ConfigError(
                "tool_servers", f"needs the MCP SDK: pip install 'trajcore[mcp]' ({exc})"
            ) from None
        taken = {name for name, _, _ in _DEFAULT_TOOLSETS} | {EXTERNAL_TOOLSET, "tool_server"}
        for setting in parse_tool_servers(value):  # ConfigError at tool_servers.<name>.<field>
            if setting.name in taken:
                raise ConfigError(
                    f"tool_servers.{setting.name}", f"{setting.name!r} names a built-in toolset"
                )
        return value

    @field_validator("tool_server_url")
    @classmethod
    def _tool_server_url(cls, value: str | None) -> str | None:
        if (
            value is not None
            and value != INPROCESS
            and not value.startswith(("http://", "https://"))
        ):
            raise ConfigError(
                "tool_server_url", f"expected http(s)://... or 'inprocess': {value!r}"
            )
        return value

    def slot_server_flags(self) -> SlotServerFlags:
        """The sandbox policy every slot server gets: network, sandbox requirement, timeouts.

        ``require_stateful_sandbox`` requires the sandbox too: the persistent shell lives in it.
        """
        timeout = self.terminal_timeout_s
        try:
            return SlotServerFlags(
                allow_network=self.allow_network,
                require_sandbox=self.require_sandbox or self.require_stateful_sandbox,
                min_timeout_s=min(1.0, timeout),
                default_timeout_s=timeout,
                max_timeout_s=max(3600.0, timeout),
            )
        except ConfigError as error:
            raise ConfigError("terminal_timeout_s", error.reason) from None

    def nomad_pool_config(self) -> NomadPoolConfig:
        """The Nomad pool's settings from the ``nomad_*`` fields and the sandbox policy.

        Raises:
            ConfigError: a Nomad setting that cannot work, named by its env field.
        """
        try:
            return NomadPoolConfig(
                address=self.nomad_address,
                job_id=self.nomad_job_id,
                driver=self.nomad_driver,  # type: ignore[arg-type]  # checked by the config
                image=self.nomad_image,
                command=self.nomad_command,
                token=self.nomad_token,
                namespace=self.nomad_namespace,
                region=self.nomad_region,
                datacenters=self.nomad_datacenters,
                slots_per_container=self.slots_per_container,
                min_containers=self.min_containers,
                max_containers=self.max_containers,
                privileged=self.privileged,
                acquire_timeout_s=self.acquire_timeout_s,
                purge_on_start=self.purge_on_start,
                purge_on_shutdown=self.purge_on_shutdown,
                flags=self.slot_server_flags(),
                require_tmux=self.require_stateful_sandbox,
            )
        except ConfigError as error:
            field = _NOMAD_FIELDS.get(error.field, error.field)
            raise ConfigError(field, error.reason) from None

    @property
    def resolved_mode(self) -> Literal["openai", "managed"]:
        """The mode in effect with no server type known (see ``mode_for``)."""
        return self.mode_for(()).mode

    def mode_for(self, server_types: Sequence[str]) -> ModeChoice:
        """The mode, parser and reason for servers of ``server_types`` (``--openai.*``).

        ``auto``: managed when a server type is ``vllm`` or ``sglang`` (parser ``hermes``
        unless ``tool_call_parser`` names another) or when ``tool_call_parser`` is set; OpenAI
        mode otherwise.
        """
        token_servers = sorted({t for t in server_types if t in _TOKEN_SERVER_TYPES})
        parser = self.tool_call_parser
        if self.mode == "auto":
            if token_servers:
                return ModeChoice(
                    mode="managed",
                    parser=parser or DEFAULT_PARSER,
                    reason=f"auto: server_type {'/'.join(token_servers)}",
                )
            if parser:
                return ModeChoice(mode="managed", parser=parser, reason="auto: tool_call_parser")
            return ModeChoice(mode="openai", parser=None, reason="auto: no token server type")
        if self.mode == "managed":
            return ModeChoice(
                mode="managed",
                parser=parser or (DEFAULT_PARSER if token_servers else None),
                reason="mode",
            )
        return ModeChoice(mode="openai", parser=None, reason="mode")

    def settings(
        self,
        distributions: DistributionRegistry | None = None,
        *,
        server_types: Sequence[str] = (),
    ) -> RolloutSettings:
        """The checked domain values behind these settings.

        ``distributions`` are the env's named toolset distributions, for a
        ``toolset_distribution`` given by name; ``server_types`` the ``--openai.*`` servers'
        types, for the mode (``mode_for``).

        Raises:
            ConfigError: a setting that cannot work, naming its field (a ``nomad_*`` field,
                ``tool_call_parser`` for managed mode without one, ``min_healthy`` above
                ``group_size``, a malformed toolset distribution, ...).
        """
        if self.sandbox == "nomad":
            self.nomad_pool_config()
        choice = self.mode_for(server_types)
        if choice.mode == "managed" and not choice.parser:
            raise ConfigError(
                "tool_call_parser", f"managed mode parses tool calls itself: set one of "
                f"{', '.join(PARSER_NAMES)}"
            )  # fmt: skip
        if self.max_containers < self.min_containers:
            raise ConfigError("max_containers", f"must be >= min_containers={self.min_containers}")
        if self.worker_timeout > 0 and self.slot_lifetime_s >= self.worker_timeout:
            raise ConfigError(
                "slot_lifetime_s",
                f"must be below worker_timeout={self.worker_timeout}s, after which Atropos "
                f"cancels the group, got {self.slot_lifetime_s}s",
            )
        if self.max_token_length < 2:
            raise ConfigError(
                "max_token_length", f"must be at least 2, got {self.max_token_length}"
            )
        distribution = None
        if isinstance(self.toolset_distribution, str):
            if distributions is None:
                raise ConfigError(
                    "toolset_distribution",
                    f"{self.toolset_distribution!r} names a distribution, and only an env's "
                    "toolset_distributions() has names",
                )
            distribution = distributions.get(self.toolset_distribution)
        elif self.toolset_distribution is not None:
            distribution = ToolsetDistribution(probabilities=dict(self.toolset_distribution))
        enabled = self.enabled_toolsets
        selection = ToolsetSelection(
            enabled=[enabled] if isinstance(enabled, str) else enabled,
            disabled=tuple(self.disabled_toolsets),
            distribution=distribution,
        )
        extra_body: JSONObject = dict(self.extra_body) if isinstance(self.extra_body, dict) else {}
        rollout = RolloutConfig(
            agent=AgentLoopConfig(
                max_turns=self.max_turns, max_context_tokens=self.max_token_length
            ),
            sampling=SamplingParams(
                # None: no cap of its own; the loop caps each turn by the context left.
                max_tokens=self.max_tokens
                if self.max_tokens is not None
                else self.max_token_length,
                temperature=self.agent_temperature,
                extra_body=extra_body,
            ),
            tool_timeout_s=self.terminal_timeout_s,
            deadline_s=self.slot_lifetime_s,
            acquire_timeout_s=self.acquire_timeout_s,
            tool_delay_s=self.tool_delay_s,
            # Atropos drops a group with any sequence of max_token_length tokens or more.
            max_token_length=self.max_token_length - 1,
        )
        settings = RolloutSettings(
            mode=choice.mode,
            parser=choice.parser,
            mode_reason=choice.reason,
            rollout=rollout,
            batching=BatchConfig(
                window_ms=self.batch_window_ms, max_batch_size=self.max_batch_size
            ),
            toolsets=selection,
            on_failure=OnFailure(self.on_failure),
            min_healthy=self.min_healthy,
            drop_equal_scores=self.ensure_scores_are_not_same,
        )
        settings.group_policy(self.group_size)  # min_healthy against group_size
        return settings


_TOKEN_SERVER_TYPES = frozenset({"vllm", "sglang"})
DEFAULT_PARSER = "hermes"
"""Managed mode's parser when a vLLM or SGLang server is configured and none is named."""


@attrs.frozen(kw_only=True)
class ModeChoice:
    """The model mode in effect, its parser, and why (``AgentEnvConfig.mode_for``)."""

    mode: Literal["openai", "managed"]
    parser: str | None
    reason: str


@attrs.frozen(kw_only=True)
class RolloutSettings:
    """What ``AgentEnvConfig.settings`` checked, as domain values.

    Attributes:
        mode: ``openai`` or ``managed``.
        parser: Managed mode's tool-call parser (``None`` in OpenAI mode).
        mode_reason: Why this mode (for the start-up log).
        rollout: How each trajectory runs (limits, sampling, timeouts, the deadline).
        batching: The tool dispatcher's batch window and size.
        toolsets: Which toolsets each group draws.
        on_failure, min_healthy, drop_equal_scores: The group policy, whose ``group_size``
            comes from the config at each group (process mode changes it).
    """

    mode: Literal["openai", "managed"]
    rollout: RolloutConfig
    batching: BatchConfig
    parser: str | None = None
    mode_reason: str = "mode"
    toolsets: ToolsetSelection
    on_failure: OnFailure
    min_healthy: int | None
    drop_equal_scores: bool

    def group_policy(self, group_size: int) -> GroupPolicy:
        """The group policy for training groups of ``group_size``.

        Raises:
            ConfigError: ``min_healthy`` outside ``[1, group_size]``.
        """
        if self.min_healthy is None:
            return GroupPolicy(
                group_size=group_size,
                on_failure=self.on_failure,
                drop_equal_scores=self.drop_equal_scores,
            )
        return GroupPolicy(
            group_size=group_size,
            on_failure=self.on_failure,
            min_healthy=self.min_healthy,
            drop_equal_scores=self.drop_equal_scores,
        )

    @staticmethod
    def eval_policy(group_size: int) -> GroupPolicy:
        """Evaluation keeps every healthy member and never drops for equal scores."""
        return GroupPolicy(
            group_size=group_size,
            on_failure=OnFailure.KEEP_HEALTHY,
            min_healthy=1,
            drop_equal_scores=False,
        )


# ============================================================================ scored data


class MemberOverrides(TypedDict):
    """``overrides[i]`` of a group trajcore sends: exactness and the member's story."""

    token_exact: bool
    trajcore: dict[str, Any]


class ScoredGroup(TypedDict):
    """The ``ScoredDataGroup`` trajcore hands Atropos (a plain dict on the wire).

    ``tokens[i]`` and ``masks[i]`` have equal lengths; ``masks[i][j]`` is ``-100`` outside the
    model's completions. ``inference_logprobs`` is ``None`` unless the tokens are exact.
    """

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: None
    ref_logprobs: None
    messages: list[list[dict[str, Any]]]
    generation_params: dict[str, Any]
    inference_logprobs: list[list[float]] | None
    group_overrides: dict[str, Any]
    overrides: list[MemberOverrides]
    images: None


def _drift_words(group: GroupResult) -> str:
    """The group's token drift for its log line (``docs/tokens.md``)."""
    drifts = [m.drift for m in group.members if m.drift is not None]
    if not drifts:
        return "drift not measured (tokens not exact)"
    drifted = sum(not d.exact for d in drifts)
    tokens = sum(d.ledger_only_tokens + d.rendered_only_tokens for d in drifts)
    return f"drift {drifted}/{len(drifts)} members, {tokens} tokens"


def _server_types(configs: object) -> tuple[str, ...]:
    """The ``server_type`` of each ``--openai.*`` server (``APIServerConfig`` s or a baseline)."""
    items = configs if isinstance(configs, list | tuple) else [configs]
    return tuple(str(t) for c in items if (t := getattr(c, "server_type", None)) is not None)


def _chat_dicts(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return [dict(m.to_chat_dict(arguments_as_json=True)) for m in messages]


def _member_story(member: TrajectoryResult) -> dict[str, Any]:
    stats = member.stats
    errors = stats.tool_errors
    return {
        "trajectory_id": member.trajectory_id,
        "status": member.outcome.status.value,
        "stop_reason": stats.stop_reason.value if stats.stop_reason else None,
        "turns": stats.turns,
        "tool_calls": stats.tool_calls,
        "tool_errors": errors.total,
        "tool_errors_by_outcome": {o.value: errors.of(o) for o in ToolOutcome if errors.of(o)},
        "parse_errors": stats.parse_errors,
        "duration_s": round(member.duration_s, 3),
        "slot": member.slot,
        "drift_tokens": None
        if member.drift is None
        else member.drift.ledger_only_tokens + member.drift.rendered_only_tokens,
        "prepare_metadata": member.prepare_metadata,
        "score_metadata": member.score_metadata,
    }


def render_transcript(messages: Sequence[Mapping[str, Any]]) -> str:
    """A conversation as readable text: each turn, each tool call with its arguments, each result.

    Takes OpenAI chat dicts (what ``ScoredGroup["messages"]`` holds) and returns plain text for
    logs and wandb tables.
    """
    lines: list[str] = []
    for message in messages:
        role = str(message.get("role", "?"))
        if role == "tool":
            lines.append(f"--- tool result [{message.get('name', '?')}]")
        else:
            lines.append(f"--- {role}")
        reasoning = message.get("reasoning_content")
        if reasoning:
            lines.append(f"(thinking) {reasoning}")
        content = message.get("content")
        if content:
            lines.append(str(content))
        for call in message.get("tool_calls") or ():
            function = call.get("function", {}) if isinstance(call, Mapping) else {}
            lines.append(f">>> {function.get('name', '?')}({function.get('arguments', '')})")
    return "\n".join(lines)


# =============================================================================== services


@attrs.frozen(kw_only=True)
class RolloutServices:
    """What every group of a run shares.

    Attributes:
        pool: The sandbox pool slots are leased from.
        dispatcher: The batching tool dispatcher over ``pool``.
        policy: The model side (``ChatPolicy`` or ``TokenPolicy``).
        tool_server: External tools, or ``None``.
        specs: Every tool the model may be offered.
        catalog: The toolsets over ``specs``.
    """

    pool: SandboxPool
    dispatcher: ToolDispatcher
    policy: Policy
    tool_server: ToolServer | None
    specs: tuple[ToolSpec, ...]
    catalog: ToolsetCatalog


_MAX_ERROR_DETAILS = 200


def _error_summary(exchange: ToolExchange) -> str:
    """One failed call as hermes summarised it: ``[turn N] tool(args) -> error``."""
    error = f"{exchange.result.outcome.value}: {exchange.result.error or ''}"
    return (
        f"[turn {exchange.turn}] {exchange.call.name}({exchange.call.arguments_json()[:80]}) "
        f"-> {error[:150]}"
    )


def _statistics_metrics(prefix: str, statistics: object) -> dict[str, float]:
    """The numeric fields of a ``statistics()`` snapshot (an attrs class) as ``prefix/<field>``."""
    if not attrs.has(type(statistics)):
        return {}
    values = attrs.asdict(statistics, recurse=False)  # type: ignore[arg-type]  # checked above
    return {
        f"{prefix}/{name}": float(value)
        for name, value in values.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


@attrs.define
class _Counters:
    """Counts since the last ``wandb_log``."""

    groups: int = 0
    groups_sent: int = 0
    groups_partial: int = 0
    groups_dropped: dict[str, int] = attrs.field(factory=dict)
    trajectories: int = 0
    statuses: dict[str, int] = attrs.field(factory=dict)
    tool_calls: int = 0
    tool_errors: dict[str, int] = attrs.field(factory=dict)
    parse_errors: int = 0
    turns: int = 0
    drifted: int = 0
    drift_tokens: int = 0
    measured: int = 0
    error_details: list[str] = attrs.field(factory=list)

    def record(self, group: GroupResult) -> None:
        self.groups += 1
        for member in group.members:
            for exchange in member.exchanges:
                if not exchange.result.ok:
                    self.error_details.append(_error_summary(exchange))
            stats = member.stats
            self.trajectories += 1
            status = member.outcome.status.value
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.tool_calls += stats.tool_calls
            self.turns += stats.turns
            self.parse_errors += stats.parse_errors
            for outcome in ToolOutcome:
                count = stats.tool_errors.of(outcome)
                if count:
                    self.tool_errors[outcome.value] = self.tool_errors.get(outcome.value, 0) + count
            if member.drift is not None:
                self.measured += 1
                self.drifted += not member.drift.exact
                self.drift_tokens += (
                    member.drift.ledger_only_tokens + member.drift.rendered_only_tokens
                )

    def details(self) -> str:
        """hermes's ``train/tool_error_details``: one line per failed call (the first
        ``_MAX_ERROR_DETAILS``, then how many more)."""
        lines = self.error_details[:_MAX_ERROR_DETAILS]
        more = len(self.error_details) - len(lines)
        return "\n".join([*lines, f"... and {more} more"] if more else lines)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {
            "train/tool_errors_count": len(self.error_details),
            "trajcore/groups": self.groups,
            "trajcore/groups_sent": self.groups_sent,
            "trajcore/groups_partial": self.groups_partial,
            "trajcore/trajectories": self.trajectories,
            "trajcore/tool_calls": self.tool_calls,
            "trajcore/tool_errors": sum(self.tool_errors.values()),
            "trajcore/parse_errors": self.parse_errors,
        }
        for reason, count in self.groups_dropped.items():
            out[f"trajcore/groups_dropped/{reason}"] = count
        for status, count in self.statuses.items():
            out[f"trajcore/trajectories/{status}"] = count
        for outcome, count in self.tool_errors.items():
            out[f"trajcore/tool_errors/{outcome}"] = count
        if self.trajectories:
            out["trajcore/turns_mean"] = self.turns / self.trajectories
        if self.tool_calls:
            out["trajcore/tool_error_rate"] = sum(self.tool_errors.values()) / self.tool_calls
        if self.measured:
            out["trajcore/token_drift_rate"] = self.drifted / self.measured
            out["trajcore/token_drift_tokens_mean"] = self.drift_tokens / self.measured
        return out


# ================================================================================== the env


class AgentEnv(BaseEnv, Generic[ItemT, ConfigT_co]):
    """An Atropos env whose groups are agent trajectories in sandbox slots; see the module doc.

    Hooks to write: ``get_next_item``, ``build_task``, ``verify_and_score``; optionally
    ``setup``, ``prepare_workspace``, ``eval_items`` (or ``evaluate`` itself), ``tools``,
    ``toolsets`` and ``tool_registry``. Construct it as Atropos does,
    ``Env(config, server_configs)``; ``server_configs`` defaults to Atropos's ``ServerBaseline``.

    Raises (when built):
        ConfigError: an invalid setting, naming its field, before the tokenizer is loaded.
    """

    env_config_cls: type[AgentEnvConfig] = AgentEnvConfig
    config: ConfigT_co

    def __init__(
        self,
        config: ConfigT_co,
        server_configs: object = None,
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        if not isinstance(config, AgentEnvConfig):
            raise ConfigError("config", f"expected an AgentEnvConfig, got {type(config).__name__}")
        self.config = config  # for toolset_distributions() and the dataset, before Atropos's
        self.server_configs: object = ServerBaseline() if server_configs is None else server_configs
        self.settings: RolloutSettings = config.settings(
            self.toolset_distributions(), server_types=_server_types(self.server_configs)
        )
        self._dataset: DatasetRows | None = self._load_dataset(config)
        super().__init__(config, self.server_configs, slurm=slurm, testing=testing)
        self._services: RolloutServices | None = None
        self._server_toolsets: list[Toolset] = []
        self._template: ChatTemplate | None = None
        self._tokenizer_port: Tokenizer | None = None
        self._rng = random.Random(config.toolset_seed)  # noqa: S311 - toolset draws, not secrets
        self._counters = _Counters()
        self._table_rows: list[list[object]] = []

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        """The defaults the CLI starts from: the env's config and its ``--openai.*`` server
        settings (``APIServerConfig`` s, or Atropos's ``ServerBaseline``). Override it to set
        ``tokenizer_name``, ``group_size`` and the rest for your env."""
        config: AgentEnvConfig = cls.env_config_cls()
        return config, ServerBaseline()

    # --------------------------------------------------------------- hooks for env authors

    async def setup(self) -> None:
        """Load data and anything else the env needs; runs once, after the services start."""

    async def get_next_item(self) -> ItemT:
        """The next dataset item to run a group on.

        Built in when ``dataset`` is set: the dataset's rows (``dict[str, JSON]``, so such an
        env is an ``AgentEnv[dict[str, JSON]]``), in order, cycling. Without ``dataset`` an env
        must override it (``AgentEnv`` refuses to start otherwise).
        """
        if self._dataset is None:
            raise ConfigError("dataset", "set dataset or override get_next_item")
        return cast("ItemT", self._dataset.next_row())

    def build_task(self, item: ItemT) -> str | Sequence[Message]:
        """The task: the user's text, or the whole opening conversation.

        A string becomes one user message; ``system_prompt`` is put first when set and the task
        has no system message of its own. Built in when ``dataset`` is set: the row's
        ``prompt_field``. Without ``dataset`` an env must override it.
        """
        if self._dataset is None or not isinstance(item, dict):
            raise ConfigError("dataset", "set dataset or override build_task")
        return self._dataset.prompt(item)

    def _load_dataset(self, config: AgentEnvConfig) -> DatasetRows | None:
        builtin = [
            name
            for name in ("get_next_item", "build_task")
            if getattr(type(self), name) is getattr(AgentEnv, name)
        ]
        if config.dataset is None:
            if builtin:
                raise ConfigError(
                    "dataset",
                    f"{type(self).__name__} does not define {' or '.join(builtin)}: set "
                    "dataset (a .jsonl/.parquet file or a Hugging Face dataset) or write them",
                )
            return None
        rows = load_rows(
            config.dataset, split=config.dataset_split, prompt_field=config.prompt_field
        )
        return DatasetRows(rows=rows, prompt_field=config.prompt_field)

    async def prepare_workspace(self, item: ItemT, tools: SlotTools) -> JSONObject | None:
        """Set up the slot before the first turn (write files, clone a repository).

        May return metadata (a JSON object): the score hook sees it
        (``messages.prepare_metadata``), and the member's overrides and the log keep it.
        """
        return None

    def item_limits(self, item: ItemT) -> ItemLimits | None:
        """Limits for ``item``'s trajectories (turns, tokens per turn, deadline), or ``None``
        for the config's. Called once per group."""
        return None

    @abc.abstractmethod
    async def verify_and_score(
        self, item: ItemT, tools: SlotTools, messages: Transcript
    ) -> ScoreAnswer:
        """Check the work in the very slot the model used, and return a finite score, or
        ``(score, metadata)`` with a JSON object the member's overrides and the log keep.

        ``messages`` is the conversation (a ``Sequence[Message]``, so an override may take
        that) and the trajectory's story: ``trajectory_id``, ``stats`` (turns, stop reason,
        tool calls and errors), ``exchanges`` (each tool call with its result),
        ``final_response``, ``reasoning``, ``tool_errors`` and ``prepare_metadata``.

        Runs only when the trajectory ended healthy and the model produced something. Verify
        with ``tools.check``/``tools.run``, which raise ``SlotInfraError`` when the slot cannot
        answer. A ``TrajcoreError`` raised here (``SlotInfraError``, or ``SlotFileError`` from
        ``tools.read_file``) marks the member as an infrastructure failure, never as a zero:
        catch what you mean as 0 (a ``SlotFileError`` for a file the model did not write).
        """

    async def eval_items(self) -> Sequence[ItemT]:
        """Items the default ``evaluate`` runs, one trajectory each (default: none)."""
        return ()

    def tools(self, external: Sequence[ToolSpec]) -> Sequence[ToolSpec]:
        """Every tool the model may be offered: by default the slot tools and ``external``
        (what the tool server lists)."""
        return (*SLOT_TOOL_SPECS, *external)

    def toolsets(self, tools: Sequence[ToolSpec]) -> ToolsetCatalog:
        """The toolsets over ``tools``: by default ``terminal`` (bash), ``stateful_terminal``
        (bash_stateful, tmux), ``file`` (read_file, write_file) and ``external`` (every tool
        that is not a slot tool), each only when it has a tool."""
        names = [spec.name for spec in tools]
        slot_names = {name for _, members, _ in _DEFAULT_TOOLSETS for name in members}
        toolsets = [
            Toolset(name=name, tools=[t for t in members if t in names], description=about)
            for name, members, about in _DEFAULT_TOOLSETS
            if any(t in names for t in members)
        ]
        external = [name for name in names if name not in slot_names]
        if external:
            toolsets.append(
                Toolset(name=EXTERNAL_TOOLSET, tools=external, description="the tool server's")
            )
        toolsets.extend(t for t in self._server_toolsets if all(n in names for n in t.tools))
        return ToolsetCatalog(toolsets=toolsets)

    def tool_registry(self) -> ToolRegistry | None:
        """Python tools served in this process (default: none).

        When it returns a registry they are offered with no further setting
        (``tool_server_url`` unset or ``inprocess``); a synchronous tool runs in one of
        ``tool_threads`` worker threads. A registry together with a remote ``tool_server_url``
        is refused when the services start.
        """
        return None

    def toolset_distributions(self) -> DistributionRegistry:
        """Named toolset distributions, for ``toolset_distribution`` given by name (hermes's
        ``distribution``). Default: none. Called once, when the env is built."""
        return DistributionRegistry(distributions=())

    @classmethod
    def cli(cls) -> None:
        """``python my_env.py serve|process|evaluate ...``, as with any Atropos env.

        When the program has configured no logging, trajcore's log (groups, failures, tool
        errors, metrics) goes to stderr at INFO level.
        """
        trajcore_log = logging.getLogger("trajcore")
        if not logging.getLogger().handlers and not trajcore_log.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            trajcore_log.addHandler(handler)
            trajcore_log.setLevel(logging.INFO)
        super().cli()

    # --------------------------------------------------------------------- injection points

    def make_pool(self) -> AbstractAsyncContextManager[SandboxPool]:
        """The sandbox pool of a run, as an async context manager (entered once, at start).

        ``sandbox="local"``: ``local_containers`` slot servers on this machine.
        ``sandbox="nomad"``: a ``NomadSandboxPool`` from the ``nomad_*`` fields, scaled between
        ``min_containers`` and ``max_containers`` (see ``docs/nomad.md``).

        Raises:
            ConfigError: a Nomad setting that cannot work, named by its env field.
            SandboxUnavailable: ``require_stateful_sandbox`` and tmux is missing (on this host
                for the local pool, in the slot servers for Nomad), or ``require_sandbox`` /
                ``require_stateful_sandbox`` and bubblewrap is unusable (raised when the pool
                starts); ``NomadUnavailable``, a ``SandboxUnavailable``, when the Nomad agent
                cannot be used (raised when the pool starts). The persistent shell shares its
                slot's sandbox, so requiring it sandboxed requires the slot sandboxed.
        """
        config = self.config
        if config.sandbox == "nomad":
            return NomadSandboxPool(config.nomad_pool_config())
        if config.require_stateful_sandbox and shutil.which("tmux") is None:
            raise SandboxUnavailable(
                "require_stateful_sandbox: the local pool keeps a persistent shell with tmux, "
                "which is not installed on this host"
            )
        timeout = config.terminal_timeout_s
        return LocalSandboxPool(
            LocalPoolConfig(
                containers=config.local_containers,
                slots_per_container=config.slots_per_container,
                allow_network=config.allow_network,
                require_sandbox=config.require_sandbox or config.require_stateful_sandbox,
                acquire_timeout_s=config.acquire_timeout_s,
                min_timeout_s=min(1.0, timeout),
                default_timeout_s=timeout,
                max_timeout_s=max(3600.0, timeout),
            )
        )

    def make_chat_server(self) -> ChatServer:
        """OpenAI mode's server: Atropos's ``ServerManager`` built from ``--openai.*``."""
        return ServerManagerChatServer(self.server)

    def make_token_server(self) -> TokenServer:
        """Managed mode's server: trajcore's fast token client for a single ``--openai.*``
        server with a ``base_url``, else Atropos's ``ServerManager`` (load-balanced).

        Raises:
            ConfigError: the server type has no token endpoint (``openai.server_type``).
        """
        configs = self.server_configs
        if isinstance(configs, APIServerConfig):
            configs = [configs]
        if (
            isinstance(configs, list)
            and len(configs) == 1
            and getattr(configs[0], "base_url", None)
        ):
            return token_server_from_config(configs[0])
        return ServerManagerTokenServer(self.server)

    def make_tool_server(self) -> ToolServer | None:
        """The external tool server: ``tool_registry()`` served in this process when it returns
        a registry, else the one at ``tool_server_url``, else ``None``.

        Raises:
            ConfigError: ``inprocess`` without a ``tool_registry()``, or a registry and a
                remote ``tool_server_url`` both (``tool_server_url``).
        """
        url = self.config.tool_server_url
        registry = self.tool_registry()
        if registry is not None and url not in (None, INPROCESS):
            raise ConfigError(
                "tool_server_url",
                f"{type(self).__name__}.tool_registry() serves tools in this process and "
                f"tool_server_url={url!r} names a remote tool server: keep one of them",
            )
        if url == INPROCESS and registry is None:
            raise ConfigError(
                "tool_server_url", "'inprocess' serves tool_registry(), which returned None"
            )
        if registry is not None:
            return HTTPToolServer(
                INPROCESS, app=make_app(registry), timeout_s=self.config.terminal_timeout_s
            )
        if url is None:
            return None
        return HTTPToolServer(
            url, token=self.config.tool_server_token, timeout_s=self.config.terminal_timeout_s
        )

    @contextlib.asynccontextmanager
    async def open_tool_server(self) -> AsyncIterator[ToolServer | None]:
        """``make_tool_server()`` joined with the ``tool_servers`` (MCP), listed once; closed on
        exit. Open and close in the same task.

        Raises:
            ConfigError: a tool name offered twice, naming both owners; a bad setting.
            ToolServerError, WireError: a server cannot be started, reached or listed.
        """
        single = self.make_tool_server()
        try:
            if not self.config.tool_servers:
                yield single
                return
            from trajcore.adapters.mcp import JoinedMember, open_tool_servers, parse_tool_servers

            before = [JoinedMember(name="tool_server", server=single)] if single else []
            async with open_tool_servers(
                parse_tool_servers(self.config.tool_servers),
                default_call_timeout_s=self.config.terminal_timeout_s,
                reserved={spec.name: "the slot tools" for spec in SLOT_TOOL_SPECS},
                before=before,
            ) as joined:
                await joined.list_tools()  # clashes fail here, at start
                self._server_toolsets = joined.toolsets()
                try:
                    yield joined
                finally:
                    self._server_toolsets = []
        finally:
            if single is not None:
                await single.aclose()

    def tokenizer_port(self) -> Tokenizer:
        """The env's tokenizer as trajcore's ``Tokenizer``: Atropos's ``tokenizer_name`` with its
        chat template, or Mistral's own encoder with ``tokenizer_mode="mistral"``.

        Raises:
            ConfigError: ``mistral_tokenizer_file`` is missing or cannot be loaded, or the
                ``mistral`` extra is not installed.
        """
        if self._tokenizer_port is None:
            if self.config.tokenizer_mode == "mistral":
                self._tokenizer_port = _mistral_tokenizer(self.config)
            else:
                self._tokenizer_port = TransformersTokenizer(
                    tokenizer=self.tokenizer, path=Path(str(self.config.tokenizer_name))
                )
        return self._tokenizer_port

    def chat_template(self) -> ChatTemplate:
        """The tokenizer's chat template as the token ledger uses it (learnt once).

        Raises:
            ConfigError: the template cannot be used for agent turns (``chat_template``).
        """
        if self._template is None:
            tokenizer = self.tokenizer_port()
            eos = tokenizer.eos_token_id
            # Every id that ends generation: the tokenizer's and the generation config's list.
            stops = generation_stop_ids(Path(str(self.config.tokenizer_name)))
            self._template = ChatTemplate.learn(
                tokenizer, turn_stops=stops if eos is None else {eos, *stops}
            )
        return self._template

    def make_policy(
        self, *, chat: ChatServer | None = None, token: TokenServer | None = None
    ) -> Policy:
        """The model side for ``mode``: ``ChatPolicy`` (with the template, for inexact tokens)
        or ``TokenPolicy`` (exact tokens, the configured parser)."""
        if self.settings.mode == "managed":
            parser_name = self.settings.parser
            assert parser_name is not None  # settings() checked it
            return TokenPolicy(
                server=token if token is not None else self.make_token_server(),
                tokenizer=self.tokenizer_port(),
                template=self.chat_template(),
                parser=get_parser(parser_name),
            )
        return ChatPolicy(
            server=chat if chat is not None else self.make_chat_server(),
            template=self.chat_template(),
        )

    # ------------------------------------------------------------------------------ services

    @property
    def services(self) -> RolloutServices:
        """The running services.

        Raises:
            StateError: none are open (use ``rollout_services`` or a CLI command).
        """
        if self._services is None:
            raise StateError("the env's rollout services are not open: use rollout_services()")
        return self._services

    @contextlib.asynccontextmanager
    async def rollout_services(
        self,
        *,
        policy: Policy | None = None,
        pool: SandboxPool | None = None,
        tool_server: ToolServer | None = None,
    ) -> AsyncIterator[RolloutServices]:
        """Open the services every group shares, and close them on exit.

        What is passed in is used as is and left open; what is not is built with the
        ``make_*`` methods and closed here. Inside an already open block it yields the open
        services (and ignores the arguments). Open and close in the same task.

        Raises:
            ConfigError: a toolset or tool name that does not fit the catalog, or a setting the
                ``make_*`` methods refuse.
            SandboxUnavailable, SlotServerError: the pool cannot start.
            ToolServerError, WireError: the tool server cannot list its tools.
        """
        if self._services is not None:
            yield self._services
            return
        log.info("%s", self.mode_line())
        # Synchronous tool_registry() tools run in anyio's default worker threads.
        anyio.to_thread.current_default_thread_limiter().total_tokens = self.config.tool_threads
        async with contextlib.AsyncExitStack() as stack:
            if tool_server is None:
                tool_server = await stack.enter_async_context(self.open_tool_server())
            external = await tool_server.list_tools() if tool_server is not None else []
            specs = tuple(self.tools(external))
            catalog = self.toolsets(specs)
            select_specs(catalog.all_tools(), specs)  # every toolset tool has a spec
            self.settings.toolsets.check_against(catalog)
            if policy is None:
                chat = token = None
                if self.settings.mode == "managed":
                    token = self.make_token_server()
                    stack.push_async_callback(token.aclose)
                else:
                    chat = self.make_chat_server()
                    stack.push_async_callback(chat.aclose)
                policy = self.make_policy(chat=chat, token=token)
            if pool is None:
                pool = await stack.enter_async_context(self.make_pool())
            dispatcher = await stack.enter_async_context(
                ToolDispatcher(pool, self.settings.batching)
            )
            await anyio.lowlevel.checkpoint()  # the dispatcher's loop starts before any exit
            self._services = RolloutServices(
                pool=pool,
                dispatcher=dispatcher,
                policy=policy,
                tool_server=tool_server,
                specs=specs,
                catalog=catalog,
            )
            try:
                yield self._services
            finally:
                self._services = None

    async def _run_with_services(self, run: Any) -> None:
        try:
            async with self.rollout_services():
                try:
                    await run()
                finally:
                    await self._stop_workers()
        finally:
            await close_server_manager(self.server)

    async def _stop_workers(self) -> None:
        runner = [self.eval_runner] if self.eval_runner is not None else []
        workers = [w for w in (*self.workers, *self.eval_workers, *runner) if not w.done()]
        for worker in workers:
            worker.cancel()
        if workers:
            with anyio.move_on_after(30, shield=True):
                await asyncio.gather(*workers, return_exceptions=True)

    def mode_line(self) -> str:
        """One line for the start-up log: the mode, why, and whether tokens are exact."""
        settings = self.settings
        if settings.mode == "managed":
            return (
                f"model mode managed ({settings.mode_reason}), parser {settings.parser}: "
                "tokens are exact (the sampled ids and their logprobs)"
            )
        return (
            f"model mode openai ({settings.mode_reason}): tokens are NOT exact (re-rendered "
            "from the conversation): fit for SFT and evaluation, not for on-policy RL"
        )

    async def env_manager(self) -> None:
        """``serve``: Atropos's loop, inside the rollout services.

        ``serve`` feeds a trainer, so OpenAI mode's inexact tokens are warned about here, once.
        """
        if self.settings.mode == "openai":
            log.warning(
                "serve sends inexact tokens to the trainer: %s. For RL set an --openai.server_type "
                "of vllm or sglang (or tool_call_parser) so that mode auto picks managed mode",
                self.mode_line(),
            )
        await self._run_with_services(super().env_manager)

    async def process_manager(self) -> None:
        """``process``: Atropos's loop, inside the rollout services."""
        await self._run_with_services(super().process_manager)

    async def _run_evaluate(self) -> None:
        """``evaluate``: setup and evaluate, inside the rollout services."""
        await self._run_with_services(super()._run_evaluate)

    # -------------------------------------------------------------------------- rollouts

    def task_messages(self, item: ItemT) -> list[Message]:
        """The opening conversation of ``item``'s trajectories (``build_task`` and the system
        prompt).

        Raises:
            ConfigError: ``build_task`` gave something that is not text or messages.
        """
        task = self.build_task(item)
        if isinstance(task, str):
            messages = [Message.user(task)]
        else:
            messages = list(task)
            for i, message in enumerate(messages):
                if not isinstance(message, Message):
                    raise ConfigError(f"build_task[{i}]", "expected a Message")
        if not messages:
            raise ConfigError("build_task", "the task has no messages")
        prompt = self.config.system_prompt
        if prompt and not any(m.role == "system" for m in messages):
            messages.insert(0, Message.system(prompt))
        return messages

    async def run_group(
        self, item: ItemT, *, group_size: int | None = None, for_eval: bool = False
    ) -> GroupResult:
        """Run one group of ``item`` on the open services and judge it.

        Raises:
            StateError: no services are open.
            ConfigError: ``build_task`` or the toolset draw failed.
        """
        services = self.services
        size = self.config.group_size if group_size is None else group_size
        policy = self.settings.eval_policy(size) if for_eval else self.settings.group_policy(size)
        messages = self.task_messages(item)
        drawn = self.settings.toolsets.draw(services.catalog, self._rng)
        specs = select_specs(drawn.tools, services.specs)
        rollout = self.settings.rollout
        limits = self.item_limits(item)
        if limits is not None:
            rollout = limits.apply(rollout)

        async def prepare(tools: SlotTools) -> JSONObject | None:
            return await self.prepare_workspace(item, tools)

        async def score(tools: SlotTools, transcript: Transcript) -> ScoreAnswer:
            return await self.verify_and_score(item, tools, transcript)

        hooks = TrajectoryHooks(prepare=prepare, score=score)
        idle_s = self.config.slot_idle_timeout_s
        agent_policy = (
            services.policy if idle_s is None else IdleLimitedPolicy(services.policy, idle_s)
        )

        async def member(trajectory_id: str) -> TrajectoryResult:
            try:
                return await run_trajectory(
                    trajectory_id=trajectory_id,
                    messages=messages,
                    tools=specs,
                    hooks=hooks,
                    policy=agent_policy,
                    pool=services.pool,
                    dispatcher=services.dispatcher,
                    tool_server=services.tool_server,
                    config=rollout,
                )
            finally:
                # Tool servers that keep state per trajectory (MCP sessions) end it here.
                release = getattr(services.tool_server, "release", None)
                if release is not None:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(10) as waited:
                        try:
                            await release(trajectory_id)
                        except Exception as exc:  # noqa: BLE001 - the trajectory's result stands
                            log.warning("releasing %s's tool sessions: %s", trajectory_id, exc)
                    if waited.cancelled_caught:
                        log.warning("releasing %s's tool sessions took over 10 s", trajectory_id)

        group_id = f"{type(self).__name__}-{uuid.uuid4().hex[:10]}"
        result = await collect_group(group_id=group_id, policy=policy, run_member=member)
        self._counters.record(result)
        self._log_group(result, drawn.toolsets)
        return result

    def scored_group(self, group: GroupResult) -> ScoredGroup | None:
        """The Atropos ``ScoredDataGroup`` of a judged group, or ``None`` when it is not sent
        (its verdict dropped it, or too few kept members have tokens); the reason is logged."""
        counters = self._counters
        if group.verdict.dropped:
            reason = group.verdict.drop_reason.value if group.verdict.drop_reason else "dropped"
            counters.groups_dropped[reason] = counters.groups_dropped.get(reason, 0) + 1
            log.info("group %s dropped: %s", group.group_id, group.verdict.detail)
            return None
        kept: list[tuple[TrajectoryResult, float]] = []
        for member, score in zip(group.kept, group.verdict.scores, strict=True):
            if member.tokens is None:
                log.warning(
                    "group %s: member %s has no tokens (no model turn); left out",
                    group.group_id,
                    member.trajectory_id,
                )
                continue
            kept.append((member, score))
        policy_min = self.settings.group_policy(len(group.members)).min_healthy
        if len(kept) < policy_min or (
            self.settings.drop_equal_scores
            and len(group.kept) != len(kept)
            and len({s for _, s in kept}) <= 1
        ):
            counters.groups_dropped["no_tokens"] = counters.groups_dropped.get("no_tokens", 0) + 1
            log.info("group %s dropped: %d members with tokens", group.group_id, len(kept))
            return None
        exact = all(m.tokens is not None and m.tokens.token_exact for m, _ in kept)
        tokens = [m.tokens for m, _ in kept if m.tokens is not None]
        logprobs: list[list[float]] | None = None
        if exact and all(t.inference_logprobs is not None for t in tokens):
            logprobs = [list(t.inference_logprobs or ()) for t in tokens]
        group_overrides: dict[str, Any] = {"token_exact": exact, "trajcore_group": group.group_id}
        if len(kept) != len(group.members):
            group_overrides["group_size"] = len(kept)
            counters.groups_partial += 1
        counters.groups_sent += 1
        sampling = self.settings.rollout.sampling
        return ScoredGroup(
            tokens=[list(t.tokens) for t in tokens],
            masks=[list(t.masks) for t in tokens],
            scores=[float(s) for _, s in kept],
            advantages=None,
            ref_logprobs=None,
            messages=[_chat_dicts(m.messages) for m, _ in kept],
            generation_params={
                "temperature": sampling.temperature,
                "max_tokens": sampling.max_tokens,
                "mode": self.settings.mode,
            },
            inference_logprobs=logprobs,
            group_overrides=group_overrides,
            overrides=[
                MemberOverrides(token_exact=exact, trajcore=_member_story(m)) for m, _ in kept
            ],
            images=None,
        )

    async def collect_trajectories(self, item: ItemT) -> tuple[ScoredGroup | None, list[ItemT]]:
        """Atropos's hook: one group of ``item``, scored, or ``None`` when it is not sent."""
        return self.scored_group(await self.run_group(item)), []

    async def run_task(
        self,
        item: ItemT,
        *,
        policy: Policy | None = None,
        pool: SandboxPool | None = None,
        tool_server: ToolServer | None = None,
        group_size: int | None = None,
    ) -> GroupResult:
        """Run one item as one group without Atropos's API server, for tests and notebooks.

        ``policy``, ``pool`` and ``tool_server`` replace the configured ones (pass fakes); the
        services are opened for this call unless they are already open. Returns the judged
        ``GroupResult``; ``scored_group(result)`` gives what Atropos would be sent.

        Raises:
            ConfigError, SandboxUnavailable, SlotServerError: as ``rollout_services``.
        """
        async with self.rollout_services(policy=policy, pool=pool, tool_server=tool_server):
            return await self.run_group(item, group_size=group_size)

    # -------------------------------------------------------------------------- evaluate

    async def evaluate(self, *args: object, **kwargs: object) -> None:
        """Run each of ``eval_items()`` once (one trajectory each, at most ``max_eval_workers``
        at a time) and log the mean score, the share solved (score > 0), and the failures, to
        wandb when enabled, to ``data_dir_to_save_evals`` when set, and to the log always."""
        items = list(await self.eval_items())
        if not items:
            log.info("evaluate: eval_items() is empty; nothing to evaluate")
            return
        started = anyio.current_time()
        results: list[GroupResult | None] = [None] * len(items)
        limiter = anyio.CapacityLimiter(max(1, int(self.config.max_eval_workers)))

        async def one(index: int) -> None:
            async with limiter:
                results[index] = await self.run_group(items[index], group_size=1, for_eval=True)

        async with anyio.create_task_group() as group:
            for index in range(len(items)):
                group.start_soon(one, index)
        done = [r for r in results if r is not None]
        scores = [s for r in done for s in r.verdict.member_scores if s is not None]
        failed = sum(len(r.verdict.failed) for r in done)
        metrics: dict[str, float] = {
            "eval/items": len(items),
            "eval/scored": len(scores),
            "eval/failed": failed,
            "eval/mean_score": sum(scores) / len(scores) if scores else math.nan,
            "eval/solved_rate": sum(s > 0 for s in scores) / len(scores) if scores else math.nan,
        }
        log.info("evaluate: %s", json.dumps(metrics))
        samples = [
            {
                "score": r.verdict.member_scores[0],
                "status": r.members[0].outcome.status.value,
                "detail": r.members[0].outcome.detail,
                "messages": _chat_dicts(r.members[0].messages),
            }
            for r in done
        ]
        if self.config.data_dir_to_save_evals is not None:
            await self.evaluate_log(
                metrics=metrics,
                start_time=started,
                end_time=anyio.current_time(),
                samples=samples,
                verbose=False,
            )
        if self.config.use_wandb:
            await super().wandb_log(dict(metrics))

    # ------------------------------------------------------------------------ logging

    def _log_group(self, group: GroupResult, toolsets: Sequence[str]) -> None:
        verdict = group.verdict
        calls = sum(m.stats.tool_calls for m in group.members)
        errors = sum(m.stats.tool_errors.total for m in group.members)
        log.info(
            "group %s (%s): %s, scores %s, %d tool calls, %d tool errors, %s, toolsets %s, %.1fs",
            group.group_id,
            verdict.status.value,
            verdict.detail,
            list(verdict.member_scores),
            calls,
            errors,
            _drift_words(group),
            list(toolsets),
            group.duration_s,
        )
        for member in group.members:
            if member.prepare_metadata is not None or member.score_metadata is not None:
                log.info(
                    "trajectory %s metadata: prepare %s, score %s",
                    member.trajectory_id,
                    json.dumps(member.prepare_metadata, sort_keys=True),
                    json.dumps(member.score_metadata, sort_keys=True),
                )
            if not member.outcome.status.healthy:
                log.warning(
                    "trajectory %s failed (%s): %s",
                    member.trajectory_id,
                    member.outcome.status.value,
                    member.outcome.detail,
                )
            for exchange in member.exchanges:
                result = exchange.result
                if not result.ok:
                    log.info(
                        "trajectory %s turn %d: %s(%s) -> %s: %s",
                        member.trajectory_id,
                        exchange.turn,
                        exchange.call.name,
                        exchange.call.arguments_json()[:200],
                        result.outcome.value,
                        result.error,
                    )

    def tool_error_metrics(self) -> dict[str, float]:
        """The ``trajcore/*`` counters since the last ``wandb_log`` (groups, trajectories by
        status, tool calls, tool errors by outcome, parse errors, token drift), and hermes's
        ``train/tool_errors_count``."""
        return self._counters.metrics()

    def service_metrics(self) -> dict[str, float]:
        """The pool's and the dispatcher's statistics now, as ``trajcore/pool/*`` (slots free,
        leased, resetting, quarantined, draining, waiting, leases granted and expired,
        containers) and ``trajcore/dispatcher/*`` (batches, calls, failed batches, withdrawn
        calls, largest batch, calls per batch); empty while no services are open."""
        services = self._services
        if services is None:
            return {}
        out = _statistics_metrics("trajcore/pool", services.pool.statistics())
        dispatcher = _statistics_metrics("trajcore/dispatcher", services.dispatcher.statistics())
        if dispatcher.get("trajcore/dispatcher/batches"):
            dispatcher["trajcore/dispatcher/calls_per_batch"] = (
                dispatcher["trajcore/dispatcher/calls"] / dispatcher["trajcore/dispatcher/batches"]
            )
        out.update(dispatcher)
        return out

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        """Atropos's metrics plus the ``trajcore/*`` counters (which then start again), the
        pool's and dispatcher's statistics, and hermes's ``train/tool_errors_count`` and
        ``train/tool_error_details`` (one line per failed call since the last log)."""
        metrics = dict(wandb_metrics or {})
        counted = {**self._counters.metrics(), **self.service_metrics()}
        metrics.update(counted)
        details = self._counters.details()
        if details:
            metrics["train/tool_error_details"] = details
        log.info("trajcore metrics: %s", json.dumps(counted, sort_keys=True))
        self._counters = _Counters()
        await super().wandb_log(metrics)

    async def add_rollouts_for_wandb(self, scored_data: Any, item: Any = None) -> None:
        """Keep the group's conversations, as readable text, for the rollout table."""
        keep = int(self.config.num_rollouts_per_group_for_logging)
        group = cast("ScoredGroup", scored_data)
        count = len(group["scores"]) if keep == -1 else min(keep, len(group["scores"]))
        for i in range(count):
            story = group["overrides"][i]["trajcore"] if group.get("overrides") else {}
            self._table_rows.append(
                [
                    story.get("trajectory_id", ""),
                    group["scores"][i],
                    story.get("turns", 0),
                    story.get("tool_calls", 0),
                    story.get("tool_errors", 0),
                    story.get("stop_reason", ""),
                    render_transcript(group["messages"][i]),
                ]
            )
        keep_rows = int(self.config.num_rollouts_to_keep)
        del self._table_rows[: max(0, len(self._table_rows) - keep_rows)]

    async def create_rollout_table(self, wandb_metrics: dict[str, Any]) -> dict[str, Any]:
        """The rollout table: id, score, turns, tool calls, tool errors, stop, conversation."""
        if self._table_rows and self.config.use_wandb:
            import wandb

            table = wandb.Table(
                columns=[
                    "trajectory",
                    "score",
                    "turns",
                    "tool_calls",
                    "tool_errors",
                    "stop_reason",
                    "conversation",
                ]
            )
            for row in self._table_rows:
                table.add_data(*row)
            wandb_metrics["train/rollouts"] = table
        self._table_rows = []
        return wandb_metrics
