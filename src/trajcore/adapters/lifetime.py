"""Async resources whose ``async with`` block ends in their own ``aclose``.

A pool, a server or a stream of trajcore is closed by ``aclose`` (idempotent, as the ports say).
For those whose block's end means nothing more, ``ClosedOnExit`` is that end: leaving the block
awaits ``aclose`` and nothing else, and what the block raised propagates as it is.
"""

from __future__ import annotations

import abc

__all__ = ["ClosedOnExit"]


class ClosedOnExit(abc.ABC):
    """A resource whose ``async with`` block ends by awaiting its ``aclose`` (never suppressing
    what the block raised). Subclasses define ``aclose`` and, when entering does work,
    ``__aenter__``."""

    __slots__ = ()

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release everything the resource holds. Idempotent."""

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
