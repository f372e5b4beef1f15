"""The slot's keeper (``slot-helper keep``) refuses a request over its size limit whole, with an
error naming the request and the limit, and never acts on the part of it that arrived.

The keeper runs here as a sandbox's first program under a real bubblewrap (a user namespace of
its own, the host's root read-only), on a ``SOCK_SEQPACKET`` socket as a slot server gives it.
The request is a lease over an image whose environment (``Env``) pushes it past the limit:
before, the keeper read its first 96 KiB and started the lease with the environment cut short.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from trajcore.adapters.slot_server.native_helper import NativeBuildError, build_slot_helper

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing")

LIMIT = 96 * 1024 - 1  # slot_helper.c's REQUEST_MAX, less the NUL it keeps


class Keeper:
    """A keeper in its own bubblewrap sandbox, asked over its socket."""

    def __init__(self, helper: Path, folder: Path) -> None:
        for name in ("workspace", "state", "tmp"):
            (folder / name).mkdir()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.socket = ours
        argv = [
            "bwrap", "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/",
            "--bind", str(folder), str(folder), "--proc", "/proc", "--dev", "/dev", "--",
            str(helper), "keep", "--workspace", str(folder / "workspace"),
            "--state-dir", str(folder / "state"), "--tmp", str(folder / "tmp"),
        ]  # fmt: skip
        self.process = subprocess.Popen(argv, stdin=theirs.fileno(), stderr=subprocess.PIPE)
        theirs.close()
        ours.settimeout(30)
        greeting = ours.recv(1 << 16)
        if not greeting:
            assert self.process.stderr is not None
            pytest.skip(f"bubblewrap cannot start here: {self.process.stderr.read()!r}")
        assert json.loads(greeting)["ready"] is True

    def ask(self, request: bytes, channel: socket.socket | None = None) -> dict[str, object]:
        fds = [] if channel is None else [channel.fileno()]
        socket.send_fds(self.socket, [request], fds)
        reply = json.loads(self.socket.recv(1 << 16))
        assert isinstance(reply, dict)
        return reply

    def close(self) -> int:
        self.socket.close()
        code = self.process.wait(30)
        assert self.process.stderr is not None
        self.process.stderr.close()
        return code


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[Keeper]:
    try:
        helper = build_slot_helper()
    except NativeBuildError as error:
        pytest.skip(f"no slot helper: {error}")
    running = Keeper(helper, tmp_path)
    try:
        yield running
    finally:
        assert running.close() == 0


def lease_image(tree: Path, env_bytes: int) -> bytes:
    """A ``lease-image`` request over ``tree`` whose one variable makes it ``env_bytes``
    bytes longer than the request without it."""
    return b"lease-image\0" + str(tree).encode() + b"\0\0" + b"BIG=" + b"x" * (env_bytes - 4)


def test_a_lease_request_over_the_limit_is_refused_naming_it(
    keeper: Keeper, tmp_path: Path
) -> None:
    request = lease_image(tmp_path, LIMIT)
    assert len(request) > LIMIT
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reply = keeper.ask(request, theirs)
    error = str(reply.get("error"))
    assert "lease" not in reply, reply  # nothing was started from the part that arrived
    assert f'request "lease-image" is {len(request)} bytes' in error, error
    assert f"over the keeper's limit of {LIMIT} bytes" in error, error
    assert "refused whole" in error, error
    assert keeper.ask(b"end") == {"ended": True, "status": None}  # no lease runs; it goes on


def test_a_lease_request_within_the_limit_is_served(keeper: Keeper, tmp_path: Path) -> None:
    """The control: the same request, as long as the limit allows, starts its lease."""
    request = lease_image(tmp_path, LIMIT - len(lease_image(tmp_path, 4)) + 4)
    assert len(request) == LIMIT
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reply = keeper.ask(request, theirs)
    assert reply.get("lease") is True, reply
    assert keeper.ask(b"end")["ended"] is True
