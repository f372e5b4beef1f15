"""Adapters over atroposlib's ``ServerManager``, so an env's ``--openai.*`` settings keep working.

An Atropos env already has a ``ServerManager`` (``BaseEnv.server``) built from its
``APIServerConfig`` list: it load-balances across servers, holds atroposlib's semaphores and
health checks, and retries with tenacity. Two ways to reuse those settings:

- ``ServerManagerChatServer`` / ``ServerManagerTokenServer`` wrap the manager itself and implement
  the ``ChatServer`` / ``TokenServer`` ports through ``chat_completion`` and
  ``tokens_and_logprobs_completion``. atroposlib's own retries apply (three attempts with random
  exponential waits of up to 10 s, plus the openai client's); its answers are then read by the
  same pure parsers as the HTTP adapters, so bad data gets the same ``WireError`` paths.
- ``chat_server_from_config`` / ``token_server_from_config`` read one ``APIServerConfig`` and build
  trajcore's own HTTP adapter for it (``server_type`` ``vllm`` -> ``AtroposTokenServer``, the
  ``/generate`` server atroposlib's ``VLLMServer`` talks to; ``sglang`` -> ``SGLangTokenServer``;
  ``openai`` -> ``VLLMTokenServer`` on the OpenAI completions endpoint). These take trajcore's own
  path (its HTTP/1.1 client, retries inside the caller's deadline) and are what the entrypoint
  prefers for managed mode. The config's ``timeout`` (one request's limit) and
  ``num_max_requests_at_once`` (requests in flight at once) hold there as they do in
  ``ServerManager``; its periodic health check (the start-up probe checks the one server
  here), eval request count and metrics buffer are ``ServerManager``'s own.

atroposlib is untyped; its ``Any`` stays inside this module: the manager and configs come in as
``object`` and everything that leaves is a domain value or a trajcore error.

Error mapping: ``tenacity.RetryError`` is unwrapped to its last failure; openai's
``RateLimitError`` becomes ``RateLimited``; ``APIStatusError`` becomes ``ModelServerRejected``
(4xx; ``ContextFull`` when it says the request is longer than the model's context) or
``ModelServerError`` (5xx); connection and timeout errors, and aiohttp's errors on the
token path, become ``ModelServerError``; a reply atroposlib could not unpack (``KeyError``,
``IndexError``, ``TypeError``) becomes ``WireError``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import aiohttp
import anyio
import attrs
import openai
import tenacity

from trajcore.domain.errors import (
    ConfigError,
    ModelServerError,
    PoolClosed,
    RateLimited,
    TrajcoreError,
    WireError,
)
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason, SamplingParams, TokenCompletion
from trajcore.domain.tools import ToolSpec
from trajcore.domain.validators import check_argument, optional_positive_int

from .chat import OpenAIChatServer
from .chat_wire import parse_chat_body
from .token_wire import check_prompt_ids
from .tokens import AtroposTokenServer, SGLangTokenServer, VLLMTokenServer
from .transport import DEFAULT_CONNECTIONS, RetryRules, with_lone_surrogates_escaped
from .wire import BODY_EXCERPT_BYTES, array, integer, number, rejection

__all__ = [
    "ServerManagerChatServer",
    "ServerManagerTokenServer",
    "chat_server_from_config",
    "close_server_manager",
    "server_manager_for",
    "stall_check",
    "token_server_from_config",
]


log = logging.getLogger("trajcore.llm")

T = TypeVar("T")


def _translate(exc: BaseException) -> BaseException:
    """The trajcore error for an exception raised inside atroposlib."""
    if isinstance(exc, tenacity.RetryError):
        last = exc.last_attempt.exception()
        return _translate(last) if last is not None else ModelServerError(str(exc))
    if isinstance(exc, TrajcoreError):
        return exc
    if isinstance(exc, openai.RateLimitError):
        return RateLimited(f"model server rate-limited the request: {exc}", status=429)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if 400 <= status < 500 and status not in (408, 429):
            body = exc.response.text[:BODY_EXCERPT_BYTES]
            return rejection(f"model server refused: {exc}", status=status, body=body)
        return ModelServerError(f"model server failed: {exc}", status=status)
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return ModelServerError(f"model server unreachable: {exc}", status=None)
    if isinstance(exc, aiohttp.ClientResponseError):
        if 400 <= exc.status < 500 and exc.status not in (408, 429):
            return rejection(f"model server refused: {exc}", status=exc.status, body=exc.message)
        kind = RateLimited if exc.status == 429 else ModelServerError
        return kind(f"model server failed: {exc}", status=exc.status)
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError):
        return ModelServerError(f"model server unreachable: {exc}", status=None)
    if isinstance(exc, KeyError | IndexError | TypeError | ValueError):
        return WireError("$", f"atroposlib could not read the reply: {type(exc).__name__}: {exc}")
    return exc


def _sampling_kwargs(sampling: SamplingParams) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "n": 1,
    }
    if sampling.stop:
        kwargs["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        kwargs["seed"] = sampling.seed
    return kwargs


_OUTAGE_POLL_S = 1.0  # Atropos's health check runs once a second


@attrs.define
class _Outage:
    """How long every server of an atroposlib ``ServerManager`` has been marked unhealthy (by
    its health check), seen by polling while calls wait; a call gives up once that passes
    ``limit_s``. Atropos itself waits for a server to come back with no bound: right while a
    server restarts to load new weights, a silent hang of the run when it died for good."""

    manager: object
    limit_s: float | None
    _down_since: float | None = attrs.field(default=None, init=False)

    def _down_for(self) -> float | None:
        servers = list(cast("Any", self.manager).servers)
        if not servers or any(getattr(server, "server_healthy", True) for server in servers):
            self._down_since = None
            return None
        now = anyio.current_time()
        if self._down_since is None:
            self._down_since = now
        return now - self._down_since

    async def _watch(self, scope: anyio.CancelScope, down: list[str]) -> None:
        while True:
            await anyio.sleep(_OUTAGE_POLL_S)
            down_for = self._down_for()
            if down_for is not None and self.limit_s is not None and down_for >= self.limit_s:
                down.append(
                    f"every model server has been marked unhealthy by Atropos's health check "
                    f"for {down_for:.0f} s, past model_wait_s={self.limit_s:g} s"
                )
                scope.cancel()
                return

    async def bounded(self, call: Awaitable[T]) -> T:
        """``call``'s result, or ``ModelServerError`` once every server has been unhealthy
        for ``limit_s`` (``None``: no bound)."""
        if self.limit_s is None:
            return await call
        self._down_for()  # a server up now ends an outage seen before
        down: list[str] = []
        answer: list[T] = []
        failed: list[Exception] = []
        async with anyio.create_task_group() as group:
            group.start_soon(self._watch, group.cancel_scope, down)
            try:
                answer.append(await call)
            except Exception as exc:  # noqa: BLE001 - raised below, outside the task group
                failed.append(exc)
            group.cancel_scope.cancel()
        if answer:  # a server answered: whatever outage was seen is over
            self._down_since = None
            return answer[0]
        if down:
            raise ModelServerError(down[0], status=None)
        raise failed[0]


@attrs.define
class _OverManager:
    """What both adapters over a ``ServerManager`` share: the manager, the outage bound, and a
    call through it with atroposlib's errors as trajcore's.

    Attributes:
        manager: The env's ``ServerManager`` (typed ``object``: atroposlib is untyped).
        outage_s: A call fails (``ModelServerError``) once every server has been marked
            unhealthy this long; ``None``: it waits for one as long as Atropos does.
    """

    manager: object
    outage_s: float | None = None
    _closed: bool = attrs.field(default=False, init=False)
    _outage: _Outage = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._outage = _Outage(self.manager, self.outage_s)

    async def _through(self, method: str, kwargs: dict[str, Any]) -> Any:
        """The manager's ``method(**kwargs)``, within the outage bound; errors translated."""
        if self._closed:
            raise PoolClosed(f"{type(self).__name__} is closed")
        try:
            return await self._outage.bounded(getattr(self.manager, method)(**kwargs))
        except Exception as exc:
            raise _translate(exc) from exc

    async def aclose(self) -> None:
        """Idempotent; the manager itself belongs to the env and stays open."""
        self._closed = True


@attrs.define
class ServerManagerChatServer(_OverManager):
    """A ``ChatServer`` over an atroposlib ``ServerManager`` (``chat_completion``); its
    attributes are ``_OverManager``'s."""

    async def chat(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSpec], sampling: SamplingParams
    ) -> ChatTurn:
        """Sample one turn through the manager; errors as for ``OpenAIChatServer.chat``."""
        kwargs = _sampling_kwargs(sampling)
        # a lone surrogate as its escaped text, as the tokenizer adapters render it: the
        # openai client encodes its body as strict UTF-8 and would fail on it before sending
        kwargs["messages"] = [
            with_lone_surrogates_escaped(m.to_chat_dict(arguments_as_json=True)) for m in messages
        ]
        if tools:
            kwargs["tools"] = [with_lone_surrogates_escaped(spec.to_openai()) for spec in tools]
        if sampling.extra_body:
            kwargs["extra_body"] = dict(sampling.extra_body)
        completion = await self._through("chat_completion", kwargs)
        try:
            data: object = completion.model_dump(mode="json")
        except Exception as exc:
            raise _translate(exc) from exc
        return parse_chat_body(data)


def _finish(value: object, field: str) -> FinishReason:
    if isinstance(value, dict):
        return FinishReason.parse(value.get("type"), field=f"{field}.type")
    return FinishReason.parse(value, field=field)


@attrs.define
class ServerManagerTokenServer(_OverManager):
    """A ``TokenServer`` over an atroposlib ``ServerManager`` (``tokens_and_logprobs_completion``)
    whose servers are ``vllm`` or ``sglang`` typed; its attributes are ``_OverManager``'s."""

    async def generate(
        self, prompt_ids: Sequence[int], *, sampling: SamplingParams
    ) -> TokenCompletion:
        """Sample through the manager; errors as for the HTTP ``TokenServer`` adapters.

        Fields in ``WireError`` name the parts of atroposlib's tuple: ``$.output_tokens[0][i]``,
        ``$.output_logprobs[0]``, ``$.finish_reasons[0]``.
        """
        kwargs = _sampling_kwargs(sampling)
        kwargs.update(sampling.extra_body)
        kwargs["input_ids"] = check_prompt_ids(prompt_ids)
        result: object = await self._through("tokens_and_logprobs_completion", kwargs)
        parts = array(list(result) if isinstance(result, tuple) else result, "$")
        if len(parts) != 4:
            raise WireError("$", f"expected (prompt, tokens, logprobs, finishes), got {len(parts)}")
        tokens = array(parts[1], "$.output_tokens")
        logprobs = array(parts[2], "$.output_logprobs")
        finishes = array(parts[3], "$.finish_reasons")
        if not tokens or not logprobs or not finishes:
            raise WireError("$.output_tokens", "expected one completion, got none")
        ids = [
            integer(t, f"$.output_tokens[0][{i}]")
            for i, t in enumerate(array(tokens[0], "$.output_tokens[0]"))
        ]
        values = [
            number(v, f"$.output_logprobs[0][{i}]")
            for i, v in enumerate(array(logprobs[0], "$.output_logprobs[0]"))
        ]
        if len(ids) != len(values):
            raise WireError(
                "$.output_logprobs[0]", f"{len(values)} logprobs for {len(ids)} token ids"
            )
        return TokenCompletion(
            token_ids=ids,
            logprobs=values,
            finish_reason=_finish(finishes[0], "$.finish_reasons[0]"),
        )


def _config_fields(config: object) -> tuple[str, str, str, str | None]:
    c = cast("Any", config)
    server_type = str(getattr(c, "server_type", "openai"))
    base_url = getattr(c, "base_url", None)
    if not base_url:
        raise ConfigError("openai.base_url", "must be set to build a trajcore adapter")
    model = str(getattr(c, "model_name", "default"))
    api_key = getattr(c, "api_key", None)
    return server_type, str(base_url), model, str(api_key) if api_key else None


def _client_limits(config: object, retry: RetryRules | None) -> tuple[RetryRules, int]:
    """The retry rules and the most requests in flight at once that an ``APIServerConfig``'s
    ``timeout`` and ``num_max_requests_at_once`` ask for, in Atropos's own meaning: the limit
    on one request (here on one attempt, its wait for a connection included; the caller's
    deadline still bounds them all) and the requests sent at once (more wait for one to end).
    An explicit ``retry`` (the start-up probe's) is kept as given; a config object without
    either field (not atroposlib's) leaves the client's own default for it.

    Raises:
        ConfigError: either is not a whole number of at least 1 (``openai.<field>``).
    """
    c = cast("Any", config)
    timeout: Any = getattr(c, "timeout", None)
    at_once: Any = getattr(c, "num_max_requests_at_once", None)
    for field, value in (("timeout", timeout), ("num_max_requests_at_once", at_once)):
        check_argument(optional_positive_int, f"openai.{field}", value)
    rules = retry or RetryRules(attempt_timeout_s=None if timeout is None else float(timeout))
    return rules, DEFAULT_CONNECTIONS if at_once is None else int(at_once)


def chat_server_from_config(config: object, *, retry: RetryRules | None = None) -> OpenAIChatServer:
    """trajcore's ``OpenAIChatServer`` for one atroposlib ``APIServerConfig``, its ``timeout``
    and ``num_max_requests_at_once`` kept (``_client_limits``).

    Raises:
        ConfigError: the config has no ``base_url``, or a limit that cannot work.
    """
    _type, base_url, model, api_key = _config_fields(config)
    rules, at_once = _client_limits(config, retry)
    return OpenAIChatServer(
        base_url=base_url, model=model, api_key=api_key, retry=rules, max_connections=at_once
    )


def token_server_from_config(
    config: object, *, retry: RetryRules | None = None
) -> VLLMTokenServer | SGLangTokenServer | AtroposTokenServer:
    """trajcore's ``TokenServer`` for one atroposlib ``APIServerConfig`` (see the module doc),
    its ``timeout`` and ``num_max_requests_at_once`` kept (``_client_limits``).

    Raises:
        ConfigError: no ``base_url``, a ``server_type`` without a token endpoint (``trl``), or a
            limit that cannot work.
    """
    server_type, base_url, model, api_key = _config_fields(config)
    policy, at_once = _client_limits(config, retry)
    if server_type == "vllm":
        return AtroposTokenServer(
            base_url=base_url, api_key=api_key, retry=policy, max_connections=at_once
        )
    if server_type == "sglang":
        return SGLangTokenServer(
            base_url=base_url, api_key=api_key, retry=policy, max_connections=at_once
        )
    if server_type == "openai":
        return VLLMTokenServer(
            base_url=base_url, model=model, api_key=api_key, retry=policy, max_connections=at_once
        )
    raise ConfigError(
        "openai.server_type", f"{server_type!r} has no token endpoint trajcore speaks"
    )


def server_manager_for(configs: Sequence[Mapping[str, object]]) -> object:
    """An atroposlib ``ServerManager`` over ``APIServerConfig`` s built from ``configs`` (the
    fields an env's ``--openai.*`` settings carry: ``base_url``, ``model_name``, ``server_type``,
    ``api_key``, ``tokenizer_name``, ``health_check``...).

    Raises:
        ConfigError: atroposlib refused a config (its pydantic message, ``openai[i]`` as field).
    """
    from atroposlib.envs.server_handling.server_baseline import (  # type: ignore[import-untyped]
        APIServerConfig,
    )
    from atroposlib.envs.server_handling.server_manager import (  # type: ignore[import-untyped]
        ServerManager,
    )

    built: list[Any] = []
    for i, fields in enumerate(configs):
        try:
            built.append(APIServerConfig(**fields))
        except Exception as exc:
            raise ConfigError(f"openai[{i}]", str(exc)) from exc
    manager: object = ServerManager(built)
    return manager


def stall_check(
    manager: object, *, deadline_s: float | None = None
) -> Callable[[float], str | None]:
    """When a model call through ``manager`` that is still in flight at a trajectory's turns'
    deadline is the model server's failure, not the policy's time running out
    (``rollout.policy.ModelStallCheck``): every server of the manager is marked unhealthy by
    Atropos's health check (the call waits, retrying, for one to come back), or the call has
    waited longer than its servers' longest ``timeout``, one request's limit (an attempt failed
    and is being retried, or it waited behind ``num_max_requests_at_once``). Atropos's retries,
    three rounds of three attempts each up to ``timeout``, can outlast any deadline.

    A server that takes a request and never answers also holds Atropos's health check (a
    request of its own, with the same ``timeout``), so only the second rule sees it: with a
    ``timeout`` not below the trajectory's ``deadline_s`` it cannot, and a warning says so."""
    servers = list(cast("Any", manager).servers)
    timeouts = [getattr(getattr(server, "config", None), "timeout", None) for server in servers]
    limit = max((float(t) for t in timeouts if isinstance(t, int | float)), default=None)
    if limit is not None and deadline_s is not None and limit >= deadline_s:
        log.warning(
            "openai.timeout=%g s is not below the trajectory's deadline (%g s): a model server "
            "that takes a request and never answers it is seen only as the trajectory's time "
            "running out (time_budget, scored), not as the server's failure (model_error); set "
            "--openai.timeout below --env.slot_lifetime_s",
            limit,
            deadline_s,
        )

    def stalled(waited_s: float) -> str | None:
        if servers and not any(getattr(server, "server_healthy", True) for server in servers):
            return (
                f"every model server ({len(servers)}) is marked unhealthy by Atropos's health "
                f"check; the model call had waited {waited_s:.1f} s"
            )
        if limit is not None and waited_s > limit:
            return (
                f"the model call had waited {waited_s:.1f} s, past openai.timeout={limit:g} s "
                "for one request: the model server did not answer it (its attempts failed and "
                "were being retried, or it waited for a free request)"
            )
        return None

    return stalled


async def close_server_manager(manager: object) -> None:
    """Close the openai clients a ``ServerManager`` opened (atroposlib has no close of its own)."""
    for server in cast("Any", manager).servers:
        client = getattr(server, "openai", None)
        if client is not None:
            await client.close()
