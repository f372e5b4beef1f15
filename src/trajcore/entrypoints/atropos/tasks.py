"""What ``AgentEnv`` makes of one item before its group runs: the opening conversation and the
task environment.

- ``task_messages``: ``build_task``'s answer (text, or messages) with the system prompt put
  first when the task has none.
- ``row_environment``: the built-in ``task_environment`` hook: with ``environment_field`` set, a
  dataset row's field names the image (``null``: the slot servers' own root); a row without the
  field is refused naming it, so a misspelt field never runs every task over the wrong root.
- ``group_environment``: the hook called once per group and its answer checked with
  ``domain.task_environments``: a malformed reference, an answer that is not text, or a hook
  that raises fails that group's members as ``env_error`` (the env's data or code is at fault,
  never the model) with the field named, before any slot is leased.
- ``env_hook``: the same for the env's other per-item hooks (``build_task``, ``item_limits``):
  one that raises fails the group's members as ``env_error`` naming the hook and the frame,
  never the run, and the group is counted like any other.
- ``group_rollout``: the env's ``item_rollout`` answer, checked to be a ``RolloutConfig`` (any
  other answer fails the group's members as ``env_error`` naming the hook and what it returned),
  with the exported tokens cut below the trainer's ``max_token_len`` too (``trainer_limited``):
  Atropos skips a group holding a sequence of that many tokens, so trajcore cuts to the lower
  of its own ``max_token_length`` and the trainer's, and never counts such a group as sent.
- ``idle_limited``: the policy with ``slot_idle_timeout_s`` bounding each model turn.
- ``preparing``: with ``prepare_once`` and an environment, the group's preparation done once
  and frozen (``rollout.preparation``); else nothing.
- ``member_rollout``: a member's rollout with the deadline left of the group's: the deadline
  (``slot_lifetime_s``) counts from the group's start, so a preparation done once spends the
  members' time, as each member's own preparation would.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

import anyio
import attrs

from trajcore.domain.environment_leases import EnvironmentUnavailable, check_environment
from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.entrypoints.atropos.services import RolloutServices, release_tool_sessions
from trajcore.entrypoints.idle_slots import IdleLimitedPolicy
from trajcore.rollout.hook_failures import env_failure
from trajcore.rollout.policy import Policy
from trajcore.rollout.preparation import Prepared, prepared_group
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import RolloutConfig

__all__ = [
    "env_hook",
    "group_environment",
    "group_rollout",
    "idle_limited",
    "log_token_limit",
    "member_rollout",
    "preparing",
    "row_environment",
    "task_messages",
    "trainer_limited",
]

T = TypeVar("T")
log = logging.getLogger("trajcore.env")


def task_messages(task: str | Sequence[Message], system_prompt: str | None) -> list[Message]:
    """The opening conversation of ``task``, ``system_prompt`` first unless it has a system
    message.

    Raises:
        ConfigError: the task is not text or messages, or has none (``build_task``).
    """
    if isinstance(task, str):
        messages = [Message.user(task)]
    else:
        messages = list(task)
        for i, message in enumerate(messages):
            if not isinstance(message, Message):
                raise ConfigError(f"build_task[{i}]", "expected a Message")
    if not messages:
        raise ConfigError("build_task", "the task has no messages")
    if system_prompt and not any(m.role == "system" for m in messages):
        messages.insert(0, Message.system(system_prompt))
    return messages


def row_environment(item: object, field: str | None) -> str | None:
    """``item[field]`` for a dataset row when ``field`` is set (``None`` when the row holds
    ``null`` there), else ``None``.

    Raises:
        ConfigError: ``item`` is not a row, or has no ``field`` (``environment_field``).
    """
    if field is None:
        return None
    if not isinstance(item, dict):
        raise ConfigError(
            "environment_field",
            f"reads a dataset row's field, but the item is a {type(item).__name__}: override "
            "task_environment for items that are not rows",
        )
    if field not in item:
        raise ConfigError(
            "environment_field", f"the row has no field {field!r} (it has {sorted(item)})"
        )
    value: object = item[field]
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(field, f"must be an image reference or null, got {value!r}")
    return value


def group_environment(
    hook: Callable[[], str | None], *, field: str
) -> tuple[str | None, str | None]:
    """What ``hook`` (the env's ``task_environment`` for one item) names, checked:
    ``(environment, None)``, or ``(None, detail)`` when the group must fail as ``env_error``
    (``detail`` names ``field``, the hook or the row field the reference came from)."""
    answer, problem = env_hook("task_environment", hook, None)
    if problem is not None or answer is None:
        return None, problem
    try:
        return check_environment(answer, field=field), None
    except EnvironmentUnavailable as error:
        return None, f"task_environment returned {answer!r}: {error.reason} @ {error.field}"


def env_hook(where: str, hook: Callable[[], T], fallback: T) -> tuple[T, str | None]:
    """``(hook(), None)``, or ``(fallback, detail)`` when the env's hook ``where`` raised: a
    ``ConfigError`` as it reads, anything else as ``env_failure`` gives it (what, and the frame
    it was raised at). The group's members then fail as ``env_error`` with ``detail``."""
    try:
        return hook(), None
    except ConfigError as error:
        return fallback, f"{where}: {error}"
    except Exception as error:  # noqa: BLE001 - the env's own code: its members' env_error
        return fallback, env_failure(where, error)


def group_rollout(
    hook: Callable[[], object],
    fallback: RolloutConfig,
    *,
    trainer_max_token_len: int,
    overridden: bool = False,
) -> tuple[RolloutConfig, str | None]:
    """``(rollout, None)``: what ``hook`` (the env's ``item_rollout`` for one item) returned,
    cut to the trainer's limit; or ``(fallback, detail)`` when it raised or returned something
    that is not a ``RolloutConfig``, and the group's members must fail as ``env_error``. The
    detail names ``item_rollout`` when the env ``overridden`` it, else ``item_limits`` (which
    the built-in ``item_rollout`` calls)."""
    answer, problem = env_hook("item_rollout" if overridden else "item_limits", hook, None)
    if isinstance(answer, RolloutConfig):
        return trainer_limited(answer, trainer_max_token_len), None
    if problem is None:
        problem = (
            f"item_rollout returned {type(answer).__name__} {answer!r:.120}, not a RolloutConfig "
            "(item_limits returns ItemLimits or None; item_rollout applies them)"
        )
    return trainer_limited(fallback, trainer_max_token_len), problem


def trainer_limited(rollout: RolloutConfig, trainer_max_token_len: int) -> RolloutConfig:
    """``rollout`` with its exported tokens cut below ``trainer_max_token_len`` as well (the
    trainer's ``max_token_len``; 0 or less: the trainer sets none)."""
    if trainer_max_token_len <= 0:
        return rollout
    cap = max(1, trainer_max_token_len - 1)
    if rollout.max_token_length is not None and rollout.max_token_length <= cap:
        return rollout
    return attrs.evolve(rollout, max_token_length=cap)


def log_token_limit(max_token_length: int, trainer_max_token_len: int) -> None:
    """Warn, for the start-up log, when the trainer's ``max_token_len`` is lower than the env's
    ``max_token_length``: trajectories are then cut to the trainer's (``trainer_limited``)."""
    if 0 < trainer_max_token_len < max_token_length:
        log.warning(
            "the trainer's max_token_len %d is below max_token_length %d: trajectories are cut "
            "to %d tokens, so that Atropos does not skip their groups",
            trainer_max_token_len, max_token_length, max(1, trainer_max_token_len - 1),
        )  # fmt: skip


def idle_limited(policy: Policy, idle_s: float | None) -> Policy:
    """``policy`` with each model turn bounded by ``slot_idle_timeout_s`` when it is set."""
    return policy if idle_s is None else IdleLimitedPolicy(policy, idle_s)


@contextlib.asynccontextmanager
async def preparing(
    *,
    once: bool,
    group_id: str,
    environment: str | None,
    prepare: Callable[[SlotTools], Awaitable[JSONObject | None]],
    services: RolloutServices,
    rollout: RolloutConfig,
) -> AsyncIterator[Prepared | None]:
    """The group's preparation done once when ``once`` and ``environment`` (its snapshot
    dropped on exit), else ``None``: each member prepares itself."""
    if not once or environment is None:
        yield None
        return
    holder = f"{group_id}/prepare"
    try:
        async with prepared_group(
            group_id=group_id, environment=environment, prepare=prepare, pool=services.pool,
            dispatcher=services.dispatcher, tool_server=services.tool_server,
            tools=services.specs, tool_timeout_s=rollout.tool_timeout_s,
            acquire_timeout_s=rollout.acquire_timeout_s, deadline_s=rollout.deadline_s,
        ) as prepared:  # fmt: skip
            yield prepared
    finally:
        await release_tool_sessions(services.tool_server, holder)


def member_rollout(rollout: RolloutConfig, started: float) -> RolloutConfig | str:
    """``rollout`` with its deadline cut to what is left of the group's (``started``: the
    group's start, by ``anyio.current_time()``), or why nothing is left."""
    left = rollout.deadline_s - (anyio.current_time() - started)
    if left <= 0:
        return f"the group's preparation used the whole slot_lifetime_s ({rollout.deadline_s:g} s)"
    reserve = rollout.score_reserve_s
    if reserve is not None and left <= reserve:
        return (
            f"the group's preparation left {left:.1f} s of slot_lifetime_s "
            f"({rollout.deadline_s:g} s), no more than score_reserve_s ({reserve:g} s)"
        )
    return attrs.evolve(rollout, deadline_s=left)
