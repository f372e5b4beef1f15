"""What a run counts and shows: the ``trajcore/*`` counters, service statistics, the group log
line, the wandb rollout table, and the evaluation's runs and metrics.

Rules it keeps:

- Counters hold what happened since the last ``wandb_log``; the env starts a fresh
  ``RolloutCounters`` after each log, so every metric is a count over one logging interval.
- A failed tool call is counted by outcome and also kept as one line of hermes-agent's
  ``train/tool_error_details`` (the first ``MAX_ERROR_DETAILS``, then how many more).
- Statistics snapshots (attrs values from ``statistics()``) become metrics field by field, so a
  new numeric field shows up without a change here. A pool of slot servers reads its servers'
  figures only every few seconds: ``refresh_server_figures`` reads them afresh before the
  metrics are built (bounded by ``FIGURES_WAIT_S``), so they agree with the leases' own counts.
- The rollout table shows each conversation as readable text (``render_transcript``).
- Evaluation counts apart: ``eval/*`` never goes into the training counters or takes the
  training rollout table, and an item whose run raises is a failed sample, not the end of
  the evaluation. No metric is NaN: a mean over nothing is left out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import attrs

from trajcore.domain.agent_loop import StopReason
from trajcore.domain.errors import ConfigError, InfrastructureError
from trajcore.domain.tools import ToolOutcome
from trajcore.entrypoints.atropos.config import RolloutSettings
from trajcore.entrypoints.atropos.scored_data import (
    GroupConversion,
    ScoredGroup,
    chat_dicts,
    render_transcript,
)
from trajcore.ports.sandbox_pool import EnvironmentPool, SandboxPool
from trajcore.rollout.group import GroupResult, collect_group, failed_member
from trajcore.rollout.hook_failures import env_failure
from trajcore.rollout.trajectory import ToolExchange, TrajectoryResult

if TYPE_CHECKING:
    from trajcore.entrypoints.atropos.services import RolloutServices

T = TypeVar("T")
R = TypeVar("R")

__all__ = [
    "FIGURES_WAIT_S",
    "MAX_ERROR_DETAILS",
    "RolloutCounters",
    "RolloutTable",
    "each_limited",
    "eval_metrics",
    "eval_samples",
    "evaluate_items",
    "log_conversion",
    "log_eval_to_wandb",
    "log_group",
    "log_to_stderr_unless_configured",
    "refresh_server_figures",
    "running_service_metrics",
    "service_metrics",
    "statistics_metrics",
    "training_metrics",
]

log = logging.getLogger("trajcore.env")

MAX_ERROR_DETAILS = 200
"""Most lines of ``train/tool_error_details`` per logging interval."""

FIGURES_WAIT_S = 3.0
"""Longest wait for the slot servers' figures before the metrics are built without them."""


def _drift_words(group: GroupResult) -> str:
    """The group's token drift for its log line (``docs/tokens.md``)."""
    drifts = [m.drift for m in group.members if m.drift is not None]
    if not drifts:
        return "drift not measured (tokens not exact)"
    drifted = sum(not d.exact for d in drifts)
    tokens = sum(d.ledger_only_tokens + d.rendered_only_tokens for d in drifts)
    return f"drift {drifted}/{len(drifts)} members, {tokens} tokens"


def _error_summary(exchange: ToolExchange) -> str:
    """One failed call as hermes summarised it: ``[turn N] tool(args) -> error``."""
    error = f"{exchange.result.outcome.value}: {exchange.result.error or ''}"
    return (
        f"[turn {exchange.turn}] {exchange.call.name}({exchange.call.arguments_json()[:80]}) "
        f"-> {error[:150]}"
    )


def statistics_metrics(prefix: str, statistics: object) -> dict[str, float]:
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
class RolloutCounters:
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
    reward_errors: int = 0
    truncated: int = 0
    truncated_completion_tokens: int = 0
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
            cut = member.truncation
            if cut is not None:
                self.truncated += 1
                self.truncated_completion_tokens += cut.cut_completion_tokens
            if member.drift is not None:
                self.measured += 1
                self.drifted += not member.drift.exact
                self.drift_tokens += (
                    member.drift.ledger_only_tokens + member.drift.rendered_only_tokens
                )

    def record_conversion(self, conversion: GroupConversion) -> None:
        """Count a group as sent (partial or whole) or as dropped, by its reason."""
        if conversion.scored is None:
            reason = conversion.drop_reason or "dropped"
            self.groups_dropped[reason] = self.groups_dropped.get(reason, 0) + 1
            return
        if conversion.partial:
            self.groups_partial += 1
        self.groups_sent += 1

    def details(self) -> str:
        """hermes's ``train/tool_error_details``: one line per failed call (the first
        ``MAX_ERROR_DETAILS``, then how many more)."""
        lines = self.error_details[:MAX_ERROR_DETAILS]
        more = len(self.error_details) - len(lines)
        return "\n".join([*lines, f"... and {more} more"] if more else lines)

    def metrics(self) -> dict[str, float]:
        """The ``trajcore/*`` counters and hermes's ``train/tool_errors_count``."""
        out: dict[str, float] = {
            "train/tool_errors_count": len(self.error_details),
            "trajcore/groups": self.groups,
            "trajcore/groups_sent": self.groups_sent,
            "trajcore/groups_partial": self.groups_partial,
            "trajcore/trajectories": self.trajectories,
            "trajcore/tool_calls": self.tool_calls,
            "trajcore/tool_errors": sum(self.tool_errors.values()),
            "trajcore/parse_errors": self.parse_errors,
            "trajcore/truncated": self.truncated,
            "trajcore/truncated_completion_tokens": self.truncated_completion_tokens,
        }
        if self.reward_errors:
            out["trajcore/reward_errors"] = self.reward_errors
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


def log_to_stderr_unless_configured() -> None:
    """When the program has configured no logging, send trajcore's log to stderr at INFO."""
    trajcore_log = logging.getLogger("trajcore")
    if not logging.getLogger().handlers and not trajcore_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        trajcore_log.addHandler(handler)
        trajcore_log.setLevel(logging.INFO)


def service_metrics(pool: SandboxPool, dispatcher_statistics: object) -> dict[str, float]:
    """The pool's and the dispatcher's statistics as ``trajcore/pool/*`` and
    ``trajcore/dispatcher/*``, with the dispatcher's mean ``calls_per_batch``; and, once the
    pool ran a lease over a task environment, its ``EnvironmentStatistics`` as
    ``trajcore/environments/*``."""
    out = statistics_metrics("trajcore/pool", pool.statistics())
    if isinstance(pool, EnvironmentPool):
        environments = pool.environment_statistics()
        if environments.leases:
            out.update(statistics_metrics("trajcore/environments", environments))
    dispatcher = statistics_metrics("trajcore/dispatcher", dispatcher_statistics)
    if dispatcher.get("trajcore/dispatcher/batches"):
        dispatcher["trajcore/dispatcher/calls_per_batch"] = (
            dispatcher["trajcore/dispatcher/calls"] / dispatcher["trajcore/dispatcher/batches"]
        )
    out.update(dispatcher)
    return out


def running_service_metrics(services: RolloutServices | None) -> dict[str, float]:
    """``service_metrics`` of the open ``services``; empty when none are open."""
    if services is None:
        return {}
    return service_metrics(services.pool, services.dispatcher.statistics())


async def refresh_server_figures(services: RolloutServices | None) -> None:
    """Have the open ``services``' pool read its slot servers' figures now (cache hits, server
    forks, measured layers), once it ran a lease over a task environment: between its own reads
    (every ``figures_interval_s``) they lag, and a short run would show the servers' figures
    from its start. At most ``FIGURES_WAIT_S``; a server that does not answer keeps its last."""
    if services is None:
        return
    pool = services.pool
    # The pools of slot servers (``PoolCore`` and those built on it) read their servers.
    found: object = getattr(pool, "refresh_environment_figures", None)
    refresh = cast("Callable[[], Awaitable[None]] | None", found)
    if (
        refresh is not None
        and isinstance(pool, EnvironmentPool)
        and pool.environment_statistics().leases
    ):
        with anyio.move_on_after(FIGURES_WAIT_S):
            await refresh()


def log_group(group: GroupResult, toolsets: Sequence[str]) -> None:
    """Log the group's line (verdict, scores, tool calls and errors, drift, toolsets, time),
    each member's hook metadata, each failed member, and each failed tool call."""
    verdict = group.verdict
    calls = sum(m.stats.tool_calls for m in group.members)
    errors = sum(m.stats.tool_errors.total for m in group.members)
    over = "" if group.environment is None else f" over {group.environment}"
    log.info(
        "group %s%s (%s): %s, scores %s, %d tool calls, %d tool errors, %s, toolsets %s, %.1fs",
        group.group_id,
        over,
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
        cut = member.truncation
        if cut is not None:
            log.warning(
                "trajectory %s cut to max_token_length %d: %d tokens cut, %d of them sampled "
                "(lost for training)%s",
                member.trajectory_id,
                cut.max_token_length,
                cut.cut_tokens,
                cut.cut_completion_tokens,
                "" if member.outcome.has_tokens else "; no sampled token left: left out",
            )
        for untrained in () if member.tokens is None else member.tokens.untrained_turns:
            log.warning(
                "trajectory %s turn %d not trained (masked): %s",
                member.trajectory_id,
                untrained.turn,
                untrained.reason,
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


def log_conversion(group: GroupResult, conversion: GroupConversion) -> None:
    """Log the kept members left out for want of tokens, and why a group is not sent."""
    members = {member.trajectory_id: member for member in group.members}
    for trajectory_id in conversion.left_out:
        member = members.get(trajectory_id)
        if member is None:
            why = "not in the group"
        elif member.truncation is not None:
            why = "every sampled token was cut by max_token_length"
        elif member.stats.turns == 0:
            why = "no model turn"
        else:  # its render was given up or failed: the outcome says which
            why = member.outcome.detail or "its tokens were not rendered"
        log.warning(
            "group %s: member %s has no training tokens (%s); left out",
            group.group_id,
            trajectory_id,
            why,
        )
    if conversion.scored is None:
        log.info("group %s dropped: %s", group.group_id, conversion.detail)


_TABLE_COLUMNS = (
    "trajectory",
    "score",
    "turns",
    "tool_calls",
    "tool_errors",
    "stop_reason",
    "conversation",
)


@attrs.define
class RolloutTable:
    """The wandb rollout table's rows: id, score, turns, tool calls, tool errors, stop,
    conversation, the newest ``keep`` of them."""

    rows: list[list[object]] = attrs.field(factory=list)

    def add(self, group: ScoredGroup, *, per_group: int, keep: int) -> None:
        """Add ``per_group`` members of ``group`` (-1: all), then keep the newest ``keep`` rows."""
        count = len(group["scores"]) if per_group == -1 else min(per_group, len(group["scores"]))
        conversations = group["messages"]
        for i in range(count):
            story = group["overrides"][i]["trajcore"] if group.get("overrides") else {}
            self.rows.append(
                [
                    story.get("trajectory_id", ""),
                    group["scores"][i],
                    story.get("turns", 0),
                    story.get("tool_calls", 0),
                    story.get("tool_errors", 0),
                    story.get("stop_reason", ""),
                    render_transcript(conversations[i])
                    if conversations is not None
                    else "(not sent: include_messages is off)",
                ]
            )
        del self.rows[: max(0, len(self.rows) - keep)]

    def wandb_table(self) -> Any:
        """The rows as a ``wandb.Table`` (imports wandb)."""
        import wandb

        table = wandb.Table(columns=list(_TABLE_COLUMNS))
        for row in self.rows:
            table.add_data(*row)
        return table


def eval_metrics(items: int, done: Sequence[GroupResult]) -> dict[str, float]:
    """``eval/*``: items, members scored and failed (``eval/failed``, and by status
    ``eval/failed/<status>``), and, when any member was scored, the mean score and the share
    solved (score > 0); with nothing scored those two are left out, never NaN."""
    scores = [s for r in done for s in r.verdict.member_scores if s is not None]
    out: dict[str, float] = {"eval/items": items, "eval/scored": len(scores), "eval/failed": 0}
    for group in done:
        for index in group.verdict.failed:
            out["eval/failed"] += 1
            key = f"eval/failed/{group.members[index].outcome.status.value}"
            out[key] = out.get(key, 0) + 1
    if scores:
        out["eval/mean_score"] = sum(scores) / len(scores)
        out["eval/solved_rate"] = sum(s > 0 for s in scores) / len(scores)
    return out


def eval_samples(done: Sequence[GroupResult]) -> list[dict[str, Any]]:
    """One sample per evaluated item, in item order, for ``evaluate_log``: the item's index in
    ``eval_items()``, its trajectory id, score, status, detail and messages."""
    return [
        {
            "item": index,
            "trajectory_id": r.members[0].trajectory_id,
            "score": r.verdict.member_scores[0],
            "status": r.members[0].outcome.status.value,
            "detail": r.members[0].outcome.detail,
            "messages": chat_dicts(r.members[0].messages),
        }
        for index, r in enumerate(done)
    ]


def log_eval_to_wandb(eval_metrics: dict[str, float], *, step: int, prefix: str | None) -> None:
    """Log ``eval/*`` to wandb at ``step`` (each key led by ``prefix_`` when set), and nothing
    else: the training rollout table, completion lengths and timings stay for the training
    log."""
    import wandb

    logged = {f"{prefix}_{k}" if prefix else k: v for k, v in eval_metrics.items()}
    wandb.log(logged, step=step)


def training_metrics(
    counters: RolloutCounters, services: dict[str, float], given: dict[str, Any] | None
) -> dict[str, Any]:
    """What ``wandb_log`` logs besides Atropos's own: ``given``, the counters and ``services``
    (logged here as one line), and ``train/tool_error_details`` when a call failed."""
    counted = {**counters.metrics(), **services}
    logged = {**(given or {}), **counted}
    details = counters.details()
    if details:
        logged["train/tool_error_details"] = details
    log.info("trajcore metrics: %s", json.dumps(counted, sort_keys=True))
    return logged


async def evaluate_items(
    items: Sequence[T], run: Callable[[T], Awaitable[GroupResult]], *, workers: object
) -> list[GroupResult]:
    """``run`` over ``items``, at most ``workers`` at a time, results in item order. An item
    whose ``run`` raises is logged and becomes a one-member failed group (``infra_error`` for
    an ``InfrastructureError``, else ``env_error``, with what was raised and where); the other
    items run on.

    Raises:
        ConfigError: ``workers`` (``max_eval_workers``) is not an integer of at least 1.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError("max_eval_workers", f"must be an integer of at least 1, got {workers!r}")

    async def guarded(index: int) -> GroupResult:
        try:
            return await run(items[index])
        except Exception as error:
            log.exception("evaluate: item %d raised; it is a failed sample", index)
            infra = isinstance(error, InfrastructureError)
            reason = StopReason.INFRA_ERROR if infra else StopReason.ENV_ERROR
            detail = env_failure(f"eval item {index}", error)

            async def failed(trajectory_id: str) -> TrajectoryResult:
                return failed_member(trajectory_id, reason, detail)

            return await collect_group(
                group_id=f"eval-item-{index}", rules=RolloutSettings.eval_rules(1),
                run_member=failed,
            )  # fmt: skip

    return await each_limited(range(len(items)), guarded, limit=workers)


async def each_limited(
    items: Sequence[T], run: Callable[[T], Awaitable[R]], *, limit: int
) -> list[R]:
    """``run`` over ``items`` concurrently, at most ``limit`` at a time; results in item order.

    ``limit`` workers (at most one per item) take the next item in turn, so the tasks alive at
    once are bounded by ``limit``, not by the number of items. An exception in ``run`` ends
    the whole call (the task group's); catch it in ``run`` to go on.

    Raises:
        ValueError: ``limit`` is below 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    results: dict[int, R] = {}
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < len(items):
            index = next_index
            next_index += 1
            results[index] = await run(items[index])

    async with anyio.create_task_group() as group:
        for _ in range(min(limit, len(items))):
            group.start_soon(worker)
    return [results[index] for index in range(len(items))]
