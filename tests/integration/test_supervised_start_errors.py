"""A pool of slot servers this machine starts (the local pool here) whose servers all fail
their start together, as one bad setting or image makes them: the caller gets one error of the
kind the pool promises, naming each reason, not an exception group."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.errors import SlotServerError
from trajcore.domain.slot_server_settings import SlotServerSettings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_servers_that_all_fail_their_start_raise_one_slot_server_error(
    tmp_path: Path,
) -> None:
    wrong = tmp_path / "python"  # an interpreter whose server prints no ready line
    wrong.write_text("#!/bin/sh\necho 'Usage: python3.6 [option]'\nsleep 30\n", encoding="utf-8")
    wrong.chmod(0o755)
    config = LocalPoolConfig(
        containers=3,
        python=str(wrong),
        stop_timeout_s=1.0,
        server=SlotServerSettings(slots_per_container=1, start_timeout_s=10.0),
    )
    with pytest.raises(SlotServerError) as refused:
        async with LocalSandboxPool(config):
            pytest.fail("a pool started without any server")
    message = str(refused.value)
    assert "slot servers failed to start" in message
    assert "slot server local-0 printed no ready line" in message
