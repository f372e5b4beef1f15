"""atroposlib's ``BaseEnv`` and ``BaseEnvConfig``, as a type checker should see them.

atroposlib ships no types, so a class that inherits its ``BaseEnv`` inherits ``Any``: under
``mypy --strict`` an env author's ``self.config.max_turn`` (a typo) and ``self.no_such_hook()``
would pass. ``AgentEnv`` and ``AgentEnvConfig`` inherit from the names below instead. At run
time they *are* atroposlib's classes; for the type checker they are typed faces that declare
what trajcore and an env author use (``BaseEnvConfig``'s every field, ``BaseEnv``'s attributes
and the methods an env calls or overrides), so ``Any`` from atroposlib stops here.

Rule this module keeps: the faces describe atroposlib 0.4 as locked (``requirements.lock``); a
field or method added here must exist there (``tests/unit/test_agent_env_types.py`` checks every
declared name against the real classes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["BaseEnv", "BaseEnvConfig"]

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Mapping, Sequence
    from typing import Protocol

    import pydantic
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    class ServerManager(Protocol):
        """atroposlib's ``ServerManager`` (``BaseEnv.server``): the calls an env makes on it,
        each routed to the most available model server (OpenAI's keyword arguments, plus
        atroposlib's ``split="eval"``)."""

        async def chat_completion(self, **kwargs: object) -> ChatCompletion: ...

        async def completion(self, **kwargs: object) -> Completion: ...

    class BaseEnvConfig(pydantic.BaseModel):
        """atroposlib's ``BaseEnvConfig``: the settings every Atropos env has."""

        group_size: int = 4
        max_num_workers: int = -1
        max_eval_workers: int = 16
        max_num_workers_per_node: int = 8
        steps_per_eval: int = 100
        max_token_length: int = 2048
        eval_handling: object = None
        eval_limit_ratio: float = 0.5
        inference_weight: float = 1.0
        batch_size: int = -1
        max_batches_offpolicy: int = 3
        tokenizer_name: str = "NousResearch/DeepHermes-3-Llama-3-3B-Preview"
        use_wandb: bool = True
        rollout_server_url: str = "http://localhost:8000"
        total_steps: int = 1000
        wandb_name: str | None = None
        num_rollouts_to_keep: int = 32
        num_rollouts_per_group_for_logging: int = 1
        ensure_scores_are_not_same: bool = True
        data_path_to_save_groups: str | None = None
        data_dir_to_save_evals: str | None = None
        min_items_sent_before_logging: int = 2
        include_messages: bool = False
        min_batch_allocation: float | None = None
        worker_timeout: float = 600
        thinking_mode: bool = False
        reasoning_effort: str | None = None
        max_reasoning_tokens: int | None = None
        custom_thinking_prompt: str | None = None

    class BaseEnv:
        """atroposlib's ``BaseEnv``: what an agent env uses of it."""

        name: str | None
        env_config_cls: type[BaseEnvConfig]
        config: BaseEnvConfig
        server: ServerManager
        tokenizer: object
        curr_step: int
        wandb_prepend: str | None
        max_token_len: int
        n_groups_to_process: int
        group_size_to_process: int
        workers: set[asyncio.Task[object]]
        eval_workers: set[asyncio.Task[object]]
        eval_runner: asyncio.Task[object] | None

        def __init__(
            self,
            config: BaseEnvConfig,
            server_configs: object,
            slurm: bool = False,
            testing: bool = False,
        ) -> None: ...

        @classmethod
        def config_init(cls) -> tuple[BaseEnvConfig, object]: ...

        @classmethod
        def cli(cls) -> None: ...

        @classmethod
        def get_cli_serve_config_cls(cls) -> type: ...

        @classmethod
        def get_cli_process_config_cls(cls) -> type: ...

        @classmethod
        def get_cli_evaluate_config_cls(cls) -> type: ...

        async def setup(self) -> None: ...

        async def env_manager(self) -> None: ...

        async def process_manager(self) -> None: ...

        async def get_server_info(self) -> None: ...

        async def _run_evaluate(self) -> None: ...

        async def evaluate(self, *args: object, **kwargs: object) -> object: ...

        async def evaluate_log(  # noqa: PLR0917 - atroposlib's own signature
            self,
            metrics: Mapping[str, object],
            task_name: str | None = None,
            model_name: str | None = None,
            start_time: float | None = None,
            end_time: float | None = None,
            generation_parameters: Mapping[str, object] | None = None,
            samples: Sequence[Mapping[str, object]] | None = None,
            verbose: bool = True,
        ) -> None: ...

        async def wandb_log(self, wandb_metrics: dict[str, object] | None = None) -> None: ...

        async def add_rollouts_for_wandb(
            self, scored_data: object, item: object = None
        ) -> None: ...

        async def create_rollout_table(
            self, wandb_metrics: dict[str, object]
        ) -> dict[str, object]: ...

        def save_checkpoint(self, step: int, data: Mapping[str, object] | None = None) -> None: ...

        def load_checkpoint(self) -> None: ...

else:
    from atroposlib.envs.base import BaseEnv, BaseEnvConfig
