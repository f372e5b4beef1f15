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
``GroupRules`` judge the group, and hands Atropos a ``ScoredDataGroup``.

Rules this package keeps:

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
- **Failures are not zeros, and say who caused them.** Members that failed for infrastructure
  reasons (sandbox, slot server, tool server: ``infra_error``), because of the model server
  (``model_error``) or because the env's own code raised (``env_error``, with the exception and
  the traceback's last frame) are never scored; ``on_failure`` drops such a group or keeps
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
  its meaning and one ``SeedSettingWarning`` (``seed_settings``), in code, YAML and ``--env.*``
  flags, and reads as its setting; any other unknown name is a ``ConfigError`` with the closest
  known name, also when assigned or given to ``model_copy`` (``docs/porting.md``).
- **The model endpoint answers before the first group.** Every ``--openai.*`` flag is honoured
  whatever ``config_init`` returns (``server_configs`` is its typed helper), and ``serve``,
  ``process`` and ``evaluate`` wait at most ``model_wait_s`` for the endpoint, reporting each
  failed try with the URL, what came back and what was expected (``startup``).

Injection points for tests and notebooks: override ``make_pool``, ``make_chat_server``,
``make_token_server``, ``make_tool_server`` or ``make_policy``, or pass fakes to ``run_task``
(``policy``, ``pool``, ``tool_server``), which runs one group without Atropos's API server.

Where each part lives: ``config`` (``AgentEnvConfig``, ``RolloutSettings``, the mode),
``startup`` (the ``--openai.*`` servers and the wait for the model endpoint),
``sandbox_settings`` (the sandbox section of the config, from which each pool's settings are
built), ``pools`` (the open registry of sandbox pools), ``cloud`` (the Modal and Daytona
pools), ``tokenizer_modes`` (the open registry of tokenizer modes),
``registries`` (the registry type and the entry-point groups), ``scored_data`` (a judged group
as Atropos's ``ScoredDataGroup``, pure), ``metrics`` (counters, wandb metrics and the rollout
table), ``services`` (``RolloutServices`` and the adapters behind them), ``env`` (``AgentEnv``
and its hooks).
"""
