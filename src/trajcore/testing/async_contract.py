"""The base of the abstract async contract suites: their coroutine tests run on asyncio.

A suite subclasses ``AsyncioContract``; every ``async def test_...`` of it (and of its own
subclasses) runs under anyio's pytest plugin on the asyncio backend, without a marker per test.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

__all__ = ["AsyncioContract"]


class AsyncioContract:
    """Marks the suite's tests for anyio and picks the asyncio backend for them."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"
