"""Fixtures of the red-team suite: the compiled attack kit and a slot server to attack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.harness import (
    Server,
    build_kit,
    bwrap_missing,
    compiler,
    keyrings_supported,
    own_session_keyring,
    server_root,
    start_server,
    stop_server,
)


@pytest.fixture(scope="session")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The attack kit, compiled with the host's C compiler."""
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the attack kit")
    return build_kit(tmp_path_factory.mktemp("kit"))


@pytest.fixture(scope="session")
def session_keyring() -> int | None:
    """This test process's own session keyring, made before any slot server starts so the
    servers inherit it (as they inherit whatever keyring starts them in production)."""
    if not keyrings_supported():
        return None
    return own_session_keyring()


@pytest.fixture(scope="session")
def server(session_keyring: int | None) -> Iterator[Server]:
    """A slot server (TCP, network off, sandbox required); its keepers and lease agents are the
    slot helper, built at start."""
    if bwrap_missing():
        pytest.skip("bubblewrap is not installed: there is no sandbox to attack")
    if compiler() is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    with server_root("server") as root:
        running = start_server(root)
        yield running
        stop_server(running)
