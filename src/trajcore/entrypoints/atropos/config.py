"""The env's settings: ``AgentEnvConfig``, the text forms its fields accept, and what it checks.

``AgentEnvConfig`` is Atropos's ``BaseEnvConfig`` plus trajcore's fields; ``settings()`` turns it
into ``RolloutSettings``, the checked domain values a run uses (mode, limits, batching, toolsets,
group rules), and ``mode_for`` decides the model mode (``ModeChoice``).

Rules it keeps:

- A bad field is one ``ConfigError`` (``reason @ field``) when the config is built; a setting
  that cannot work with another (``min_healthy`` above ``group_size``, a Nomad setting) is one
  when ``settings()`` runs, naming the env field.
- Values given as text on the command line (lists, JSON objects, ``name=value`` pairs) are
  parsed here, so the rest of the env sees typed values only.
- Seed names (atropos-agent, hermes-agent) become their fields with one warning each
  (``seed_settings``), and read and write as those fields (``config.agent_max_steps``); any
  other unknown name is refused with the closest known one.
- Values stay checked after the config is built: assigning a field validates it (and refuses an
  unknown name), and ``model_copy(update=...)`` builds the copy through the same checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

import attrs
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from trajcore.adapters.tool_server import INPROCESS
from trajcore.domain.agent_loop import AgentLoopConfig
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import ConfigError
from trajcore.domain.groups import GroupRules, OnFailure
from trajcore.domain.json_values import JSONObject, json_value
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.tool_parsers import PARSER_NAMES, get_parser, parser_names
from trajcore.domain.toolsets import DistributionRegistry, ToolsetDistribution, ToolsetSelection
from trajcore.entrypoints.atropos import pools, registries
from trajcore.entrypoints.atropos.sandbox_settings import SandboxSettings
from trajcore.entrypoints.atropos.tokenizer_modes import TOKENIZER_MODES
from trajcore.entrypoints.atropos_bases import BaseEnvConfig
from trajcore.entrypoints.gc_tuning import DEFAULT_YOUNG_GC_THRESHOLD
from trajcore.entrypoints.seed_settings import (
    SEED_FIELDS,
    SeedFieldsAsTargets,
    SeedNames,
    closest_name,
    translate_seed_fields,
)
from trajcore.rollout.trajectory import RolloutConfig

__all__ = [
    "DEFAULT_PARSER",
    "DEFAULT_TOOLSETS",
    "EXTERNAL_TOOLSET",
    "AgentEnvConfig",
    "Mode",
    "ModeChoice",
    "RolloutSettings",
]

Mode = Literal["auto", "openai", "managed"]

# Toolsets of the default catalog: the slot tools by kind, and the tool server's tools.
DEFAULT_TOOLSETS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("terminal", ("bash",), "a fresh shell per command"),
    ("stateful_terminal", ("bash_stateful", "tmux"), "the slot's persistent shell"),
    ("file", ("read_file", "write_file"), "read and write workspace files"),
)
EXTERNAL_TOOLSET = "external"
"""The default catalog's toolset of every tool the tool server offers."""


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
        return json_value(text, field, error=ConfigError)
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


class AgentEnvConfig(BaseEnvConfig, SeedNames, SandboxSettings, metaclass=SeedFieldsAsTargets):
    """An agent env's settings: Atropos's ``BaseEnvConfig`` plus trajcore's.

    Every field can be given as ``--env.<field>`` on the command line or under ``env:`` in the
    YAML config. Lists accept comma-separated text (``--env.enabled_toolsets terminal,file``);
    ``toolset_distribution`` and ``extra_body`` accept JSON text, and the distribution also
    ``name=p`` pairs (``terminal=1,file=0.5``).

    Raises (when built, assigned to or copied with ``model_copy(update=...)``):
        ConfigError: a field of the wrong type or out of range, naming it (``reason @ field``;
            ``problems`` lists every fault pydantic found), or an unknown name, naming the
            closest known one.
    """

    model_config = ConfigDict(validate_assignment=True)

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
    tokenizer_mode: str = Field(
        default="hf",
        description="How managed mode renders and tokenizes: 'hf' (tokenizer_name's chat "
        "template), 'mistral' (Mistral's own encoder, mistral_common; as vLLM's "
        "--tokenizer-mode mistral), or a registered mode (register_tokenizer_mode).",
    )
    mistral_tokenizer_file: str | None = Field(
        default=None,
        description="With tokenizer_mode 'mistral': the tekken.json or tokenizer.model.v* file "
        "(default: the one in the tokenizer_name folder).",
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
        description="Most tokens sampled per turn; None: no cap of its own. In managed mode a "
        "turn is also capped by what is left of max_token_length.",
    )
    tool_delay_s: float = Field(default=0.0, ge=0, description="Pause before each tool batch.")
    max_tool_result_chars: int | None = Field(
        default=100_000,
        ge=200,
        description="Longest text of one tool result the model sees; a longer one is cut in the "
        "middle, head and tail kept, with a line saying so. None: no cap.",
    )
    system_prompt: str | None = Field(default=None, description="Prepended to every task.")
    slot_lifetime_s: float = Field(
        default=540.0,
        gt=0,
        description="The trajectory's single deadline: slot wait, model, tools and scoring, "
        "from the group's start (a preparation done once spends it too); below "
        "worker_timeout, after which Atropos cancels the whole group.",
    )
    score_reserve_s: float | None = Field(
        default=None,
        description="The last part of slot_lifetime_s kept for scoring: the model's turns end "
        "this much before it (as time_budget, or model_error when the model server held the "
        "call), so a member that ran out of time is still scored. None: a tenth of "
        "slot_lifetime_s, at most 60 s.",
    )
    slot_idle_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Idle lifetime of a slot: a trajectory whose slot waits longer than this for "
        "one model turn ends on this budget (idle_limit, scored as the work stands). None: only "
        "slot_lifetime_s bounds it.",
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
    dataset_shard: str | None = Field(
        default=None,
        pattern=r"^\d+/\d+$",
        description="I/K: the built-in get_next_item takes rows I, I+K, I+2K, ... (from 0), so K "
        "env processes of one env share no row (docs/deploy.md). Null: every row.",
    )
    prompt_field: str = Field(
        default="prompt",
        min_length=1,
        description="The row field the built-in build_task sends as the task.",
    )
    environment_field: str | None = Field(
        default=None,
        min_length=1,
        description="The row field naming each task's environment (an image reference such as "
        "oci:/images/task-1; null in a row: none), for the built-in task_environment. Off by "
        "default (docs/environments.md).",
    )
    prepare_once: bool = Field(
        default=False,
        description="A group that names an environment prepares its workspace once, in a lease "
        "of its own, frozen into a snapshot that the members on the same slot server start "
        "from (the others prepare themselves). Needs a pool that takes snapshots.",
    )
    extra_body: dict[str, Any] | str | None = Field(
        default=None, description="Passed verbatim in every model request body (JSON)."
    )
    # -- toolsets and external tools
    enabled_toolsets: list[str] | str | None = Field(
        default=None, description="Toolsets offered to every group (default: all)."
    )
    disabled_toolsets: list[str] = Field(
        default_factory=list, description="Toolsets never offered (None: none)."
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
    sandbox_budget_score: float | None = Field(
        default=0.0,
        allow_inf_nan=False,
        description="Score of a member whose lease the slot server ended for its disk budget "
        "(stop reason sandbox_budget; the score hook is not called: its check cannot run in "
        "the ended lease). Keep it at or below the lowest score your hook gives (-1.0 for an "
        "env scoring in [-1, 1]), or filling the disk pays better than a wrong answer; a group "
        "where it does logs a warning. None: left out, as an infra_error.",
    )
    max_failed_groups: int | None = Field(
        default=5,
        ge=1,
        description="Training groups in a row that may fail (too few healthy members: the "
        "env's code, the model server or the slots failed) before the run stops, naming the "
        "last group's failures; None: no bound (Atropos retries the next item forever).",
    )
    # -- the env process
    gc_young_threshold: int | None = Field(
        default=DEFAULT_YOUNG_GC_THRESHOLD,
        ge=1,
        description="serve/process/evaluate: the garbage collector's young-generation threshold "
        "during the run (Python's default is 700; a rollout makes almost no reference cycles, "
        "so collecting less often saves env CPU); None leaves Python's.",
    )
    # -- the model endpoint
    model_wait_s: float = Field(
        default=600.0,
        gt=0,
        description="serve/process/evaluate: longest wait at start for the --openai.* model "
        "endpoint to answer; each failed try is logged with the URL and what it answered, and "
        "the run ends with an error naming them once this has passed. During the run, a model "
        "call through Atropos's ServerManager fails (model_error) once every server has been "
        "marked unhealthy this long (a server restarting to load weights is waited for).",
    )

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _config_error(exc) from None

    def __setattr__(self, name: str, value: Any) -> None:
        """Assign a field through its checks; an unknown name is refused with the closest."""
        cls = type(self)
        if not name.startswith("_") and name not in cls.model_fields and name not in SEED_FIELDS:
            known = [*cls.model_fields, *SEED_FIELDS]
            close = closest_name(name, known)
            raise ConfigError(
                name, f"unknown setting{f'; did you mean {close!r}?' if close else ''}"
            )
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise _config_error(exc) from None

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Any:
        """A copy with ``update`` applied, built through every check a new config gets: a
        value out of range or an unknown name (naming the closest known one) is a
        ``ConfigError``, and a seed name sets its trajcore field with the usual warning."""
        if not update:
            return super().model_copy(deep=deep)
        data = {name: getattr(self, name) for name in self.model_fields_set}
        data.update(update)
        copied = type(self)(**data)
        return copied.model_copy(deep=deep) if deep else copied

    @model_validator(mode="before")
    @classmethod
    def _seed_names_and_unknown_fields(cls, data: object) -> object:
        """Seed names become their fields (one warning each); unknown names are refused."""
        if not isinstance(data, Mapping):
            return data
        known = {*cls.model_fields}
        known.update(f.alias for f in cls.model_fields.values() if f.alias)
        return translate_seed_fields({str(k): v for k, v in data.items()}, known)

    def parser_given(self) -> bool:
        """Whether ``tool_call_parser`` is other than this config class's default: what the
        user chose (not ``model_fields_set``: Atropos rebuilds a config from ``model_dump()``,
        which sets every field)."""
        default: object = type(self).model_fields["tool_call_parser"].default
        return self.tool_call_parser != default

    @field_validator("enabled_toolsets", mode="before")
    @classmethod
    def _names_from_text(cls, value: object) -> object:
        return None if value is None or value == "None" else _split_names(value)

    @field_validator("disabled_toolsets", mode="before")
    @classmethod
    def _disabled_from_text(cls, value: object) -> object:
        # hermes-agent's default, which its envs pass explicitly: None, nothing disabled
        return [] if value is None or value == "None" else _split_names(value)

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
        body = _json_or_pairs("extra_body", value)
        nested = body.get("sampling_params") if isinstance(body, dict) else None
        for at, where in (("extra_body", body), ("extra_body.sampling_params", nested)):
            for key in ("n", "best_of"):  # one completion per turn is read; more would be lost
                if isinstance(where, dict) and where.get(key, 1) != 1:
                    raise ConfigError(
                        f"{at}.{key}",
                        f"{where[key]!r}: a trajectory takes one completion per turn, so the "
                        "others would be sampled, paid for and dropped; group_size sets how "
                        "many trajectories sample each item",
                    )
        return body

    @field_validator("tool_call_parser")
    @classmethod
    def _known_parser(cls, value: str | None) -> str | None:
        if value is not None and value not in parser_names():
            registries.discover()  # the parsers installed packages name as entry points
            get_parser(value)  # ConfigError at tool_call_parser, listing the known names
        return value

    @field_validator("sandbox")
    @classmethod
    def _known_sandbox(cls, value: str) -> str:
        pools.POOLS.get(value)  # ConfigError at sandbox, listing the registered sources
        return value

    @field_validator("tokenizer_mode")
    @classmethod
    def _known_tokenizer_mode(cls, value: str) -> str:
        TOKENIZER_MODES.get(value)  # ConfigError at tokenizer_mode, listing the modes
        return value

    @field_validator("tool_servers")
    @classmethod
    def _tool_servers(
        cls, value: dict[str, dict[str, Any]] | str | None
    ) -> dict[str, dict[str, Any]] | str | None:
        if value is None:
            return None
        try:
            from trajcore.adapters.mcp.settings import parse_tool_servers
        except ImportError as exc:
            raise ConfigError(
                "tool_servers", f"needs the MCP SDK: pip install 'trajcore[mcp]' ({exc})"
            ) from None
        taken = {name for name, _, _ in DEFAULT_TOOLSETS} | {EXTERNAL_TOOLSET, "tool_server"}
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

    @property
    def resolved_mode(self) -> Literal["openai", "managed"]:
        """The mode in effect with no server type known (see ``mode_for``)."""
        return self.mode_for(()).mode

    def mode_for(self, server_types: Sequence[str]) -> ModeChoice:
        """The mode, parser and reason for servers of ``server_types`` (``--openai.*``).

        ``auto``: managed when a server type is ``vllm`` or ``sglang`` (parser ``hermes``
        unless ``tool_call_parser`` names another); OpenAI mode otherwise, where a
        ``tool_call_parser`` is ignored (the server parses; hosted OpenAI-compatible APIs have
        no token endpoint) and ``ignored_parser`` says so. ``mode: managed`` uses the parser
        with any server type.
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
            return ModeChoice(
                mode="openai",
                parser=None,
                reason="auto: no token server type",
                ignored_parser=parser,
            )
        if self.mode == "managed":
            return ModeChoice(
                mode="managed",
                parser=parser or (DEFAULT_PARSER if token_servers else None),
                reason="mode",
            )
        return ModeChoice(mode="openai", parser=None, reason="mode", ignored_parser=parser)

    def _render_grace_s(self) -> float:
        """The final render's grace past the deadline: the rollout's own, but at most half of
        what worker_timeout leaves after slot_lifetime_s, so a render that runs on after the
        deadline never outlasts worker_timeout (Atropos would cancel the whole group)."""
        grace = cast("float", attrs.fields(RolloutConfig).render_grace_s.default)
        if self.worker_timeout > 0:
            grace = min(grace, (self.worker_timeout - self.slot_lifetime_s) / 2)
        return grace

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
        pools.check_pool(self)  # the chosen source's own settings
        choice = self.mode_for(server_types)
        if choice.mode == "managed" and not choice.parser:
            raise ConfigError(
                "tool_call_parser", f"managed mode parses tool calls itself: set one of "
                f"{', '.join(parser_names())}"
            )  # fmt: skip
        for name in _CHAT_ONLY_REASONING if choice.mode == "managed" else ():
            if getattr(self, name) is not None:
                raise ConfigError(
                    name,
                    "managed mode sends token ids it rendered with the chat template, which "
                    "carry no reasoning setting (Atropos adds it to OpenAI mode's chat requests "
                    "only): the template decides how the model reasons; unset it, or run in "
                    "OpenAI mode",
                )
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
                # None: no cap of its own; in managed mode the trajectory caps each turn by
                # the context left (rollout.policy.turn_cap), in OpenAI mode the server.
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
            max_tool_result_chars=self.max_tool_result_chars,
            # Atropos drops a group with any sequence of max_token_length tokens or more.
            max_token_length=self.max_token_length - 1,
            render_grace_s=self._render_grace_s(),
            sandbox_budget_score=self.sandbox_budget_score,
            score_reserve_s=self.score_reserve_s,
        )
        settings = RolloutSettings(
            mode=choice.mode,
            parser=choice.parser,
            mode_reason=choice.reason,
            ignored_parser=choice.ignored_parser,
            rollout=rollout,
            batching=BatchConfig(
                window_ms=self.batch_window_ms, max_batch_size=self.max_batch_size
            ),
            toolsets=selection,
            on_failure=OnFailure(self.on_failure),
            min_healthy=self.min_healthy,
            drop_equal_scores=self.ensure_scores_are_not_same,
            include_messages=self.include_messages,
        )
        settings.group_rules(self.group_size)  # min_healthy against group_size
        return settings


_TOKEN_SERVER_TYPES = frozenset({"vllm", "sglang"})
# Atropos's reasoning settings (BaseEnvConfig), which only chat requests carry
_CHAT_ONLY_REASONING = ("reasoning_effort", "max_reasoning_tokens")
DEFAULT_PARSER = "hermes"
"""Managed mode's parser when a vLLM or SGLang server is configured and none is named."""


@attrs.frozen(kw_only=True)
class ModeChoice:
    """The model mode in effect, its parser, and why (``AgentEnvConfig.mode_for``).

    ``ignored_parser`` is a ``tool_call_parser`` that OpenAI mode does not use (the server
    parses the calls), for the start-up warning.
    """

    mode: Literal["openai", "managed"]
    parser: str | None
    reason: str
    ignored_parser: str | None = None


@attrs.frozen(kw_only=True)
class RolloutSettings:
    """What ``AgentEnvConfig.settings`` checked, as domain values.

    Attributes:
        mode: ``openai`` or ``managed``.
        parser: Managed mode's tool-call parser (``None`` in OpenAI mode).
        mode_reason: Why this mode (for the start-up log).
        ignored_parser: A ``tool_call_parser`` OpenAI mode does not use (the server parses).
        rollout: How each trajectory runs (limits, sampling, timeouts, the deadline).
        batching: The tool dispatcher's batch window and size.
        toolsets: Which toolsets each group draws.
        on_failure, min_healthy, drop_equal_scores: The group rules, whose ``group_size``
            comes from the config at each group (process mode changes it).
        include_messages: Send each member's conversation (Atropos's ``include_messages``).
    """

    mode: Literal["openai", "managed"]
    rollout: RolloutConfig
    batching: BatchConfig
    parser: str | None = None
    mode_reason: str = "mode"
    ignored_parser: str | None = None
    toolsets: ToolsetSelection
    on_failure: OnFailure
    min_healthy: int | None
    drop_equal_scores: bool
    include_messages: bool = True

    def group_rules(self, group_size: int) -> GroupRules:
        """The group rules for training groups of ``group_size``: members without training
        tokens are left out (``require_tokens``), since the trainer is sent tokens.

        Raises:
            ConfigError: ``min_healthy`` outside ``[1, group_size]``.
        """
        if self.min_healthy is None:
            return GroupRules(
                group_size=group_size,
                on_failure=self.on_failure,
                drop_equal_scores=self.drop_equal_scores,
                require_tokens=True,
            )
        return GroupRules(
            group_size=group_size,
            on_failure=self.on_failure,
            min_healthy=self.min_healthy,
            drop_equal_scores=self.drop_equal_scores,
            require_tokens=True,
        )

    def mode_line(self) -> str:
        """One line for the start-up log: the mode, why, and whether tokens are exact."""
        if self.mode == "managed":
            return (
                f"model mode managed ({self.mode_reason}), parser {self.parser}: "
                "tokens are exact (the sampled ids and their logprobs)"
            )
        ignored = (
            f"; tool_call_parser {self.ignored_parser!r} is ignored (the server parses tool "
            "calls; set mode managed to parse them from token ids)"
            if self.ignored_parser
            else ""
        )
        return (
            f"model mode openai ({self.mode_reason}): tokens are NOT exact (re-rendered "
            f"from the conversation): fit for SFT and evaluation, not for on-policy RL{ignored}"
        )

    @staticmethod
    def eval_rules(group_size: int) -> GroupRules:
        """Evaluation keeps every healthy member and never drops for equal scores."""
        return GroupRules(
            group_size=group_size,
            on_failure=OnFailure.KEEP_HEALTHY,
            min_healthy=1,
            drop_equal_scores=False,
        )
