"""The trainer's API (Atropos's ``run-api``, at ``rollout_server_url``) failing under ``serve``.

Atropos's serve loop calls ``run-api`` (register, status, info) with three quick tries each and
then raises tenacity's ``RetryError[<Future ... raised ClientConnectorError>]``, which names
neither the URL nor the setting: ``run-api`` not started yet when the env starts, or stopped or
restarted during the run, ended ``serve`` with that line. ``explained`` turns it into
``TrainerApiUnavailable``, naming ``rollout_server_url``, its value and the last failure (a
``run-api`` that answered and refused the request, HTTP 4xx, is said to be up and refusing,
with the request and the status, not to be unreachable); the run still ends (with the pool
closed), as Atropos ends it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import tenacity

from trajcore.domain.errors import InfrastructureError

__all__ = ["TrainerApiUnavailable", "explained"]


class TrainerApiUnavailable(InfrastructureError):
    """The trainer's API at ``rollout_server_url`` could not be reached, or kept failing."""


def explained(loop: Callable[[], Awaitable[None]], url: str) -> Callable[[], Awaitable[None]]:
    """``loop`` with Atropos's retries against ``url`` exhausted raised as
    ``TrainerApiUnavailable``; any other error passes as is."""

    async def run() -> None:
        try:
            await loop()
        except tenacity.RetryError as exc:
            last = exc.last_attempt.exception()
            if not isinstance(last, aiohttp.ClientError | OSError | TimeoutError):
                raise
            if isinstance(last, aiohttp.ClientResponseError) and 400 <= last.status < 500:
                raise TrainerApiUnavailable(
                    f"rollout_server_url: the trainer's API at {url} is up but refused the env's "
                    f"request ({last.request_info.method} {last.request_info.url.path}: HTTP "
                    f"{last.status} {last.message}): check that run-api is the one of this "
                    "atroposlib version and that the env's settings it was sent (wandb_name, "
                    "group_size, max_token_len) are set"
                ) from last
            raise TrainerApiUnavailable(
                f"rollout_server_url: the trainer's API at {url} could not be reached or kept "
                f"failing ({type(last).__name__}: {last}): start run-api and register the "
                "trainer before serve, and keep run-api up for the run (a restarted run-api "
                "forgets its envs: restart serve with it)"
            ) from last

    return run
