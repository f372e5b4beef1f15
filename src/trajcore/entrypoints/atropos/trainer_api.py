"""The trainer's API (Atropos's ``run-api``, at ``rollout_server_url``) failing under ``serve``.

Atropos's serve loop calls ``run-api`` (register, status, info) with three quick tries each and
then raises tenacity's ``RetryError[<Future ... raised ClientConnectorError>]``, which names
neither the URL nor the setting: ``run-api`` not started yet when the env starts, or stopped or
restarted during the run, ended ``serve`` with that line. ``explained`` turns it into
``TrainerApiUnavailable``, naming ``rollout_server_url``, its value and the last failure; the
run still ends (with the pool closed), as Atropos ends it.
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
            raise TrainerApiUnavailable(
                f"rollout_server_url: the trainer's API at {url} could not be reached or kept "
                f"failing ({type(last).__name__}: {last}): start run-api and register the "
                "trainer before serve, and keep run-api up for the run (a restarted run-api "
                "forgets its envs: restart serve with it)"
            ) from last

    return run
