"""``HermesToolContext`` on the local pool: real slot servers, real bubblewrap. Files move whole
and binary-safe past the terminal's output cap and argument limit, and the terminal says why a
command could not start or did not finish."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest

from tests.integration.test_local_pool import config
from tests.integration.test_slot_tools_local import slot_tools
from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.compat import HermesToolContext

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def context(
    *, max_file_bytes: int | None = None, output_cap_bytes: int | None = None
) -> AsyncIterator[HermesToolContext]:
    settings = config(containers=1, slots=1)
    isolation = settings.server.isolation
    if max_file_bytes is not None:
        isolation = attrs.evolve(isolation, max_file_bytes=max_file_bytes)
    if output_cap_bytes is not None:
        isolation = attrs.evolve(isolation, output_cap_bytes=output_cap_bytes)
    settings = attrs.evolve(settings, server=attrs.evolve(settings.server, isolation=isolation))
    async with (
        LocalSandboxPool(settings) as pool,
        slot_tools(pool, timeout_s=20.0) as tools,
    ):
        yield HermesToolContext(tools)


async def test_files_cross_whole_and_binary_safe_past_the_output_cap(tmp_path: Path) -> None:
    sent = os.urandom(200_000)  # base64 of it is past the 128 KiB limit of one argument
    (tmp_path / "up.bin").write_bytes(sent)
    async with context() as ctx:
        assert await ctx.upload_file(str(tmp_path / "up.bin"), "in/blob.bin") == {
            "exit_code": 0,
            "output": "",
        }
        digest = await ctx.terminal("sha256sum in/blob.bin")
        assert digest["output"].split()[0] == hashlib.sha256(sent).hexdigest()

        for size in (0, 50_000, 300_000):  # 50 kB: its base64 is just past the 64 KiB cap
            await ctx.terminal(f"head -c {size} /dev/urandom > f{size}.bin")
            there = (await ctx.terminal(f"sha256sum f{size}.bin"))["output"].split()[0]
            answer = await ctx.download_file(f"f{size}.bin", str(tmp_path / f"f{size}.bin"))
            assert answer == {"success": True, "bytes": size}
            assert hashlib.sha256((tmp_path / f"f{size}.bin").read_bytes()).hexdigest() == there

        missing = await ctx.download_file("nope.bin", str(tmp_path / "nope.bin"))
        assert missing["success"] is False
        assert "nope.bin" in missing["error"]
        assert not (tmp_path / "nope.bin").exists()


async def test_the_terminal_says_why_a_command_did_not_start_or_finish() -> None:
    async with context() as ctx:
        too_long = await ctx.terminal("printf '%s' " + "A" * 140_000 + " | wc -c")
        assert too_long["exit_code"] == -1
        assert "Argument list too long" in too_long["output"], too_long

        slow = await ctx.terminal("echo started; sleep 5", timeout=1)
        assert slow["exit_code"] == -1
        assert slow["output"].startswith("started\n")
        assert "[timed out after 1 s" in slow["output"], slow


async def test_file_tools_read_a_tilde_path_as_the_shell_does() -> None:
    # hermes's prompts: "Create ~/greeting.txt", checked with `cat ~/greeting.txt`
    async with context() as ctx:
        assert await ctx.write_file("~/greeting.txt", "hello") == {"success": True}
        assert await ctx.terminal("cat ~/greeting.txt") == {"exit_code": 0, "output": "hello"}
        assert await ctx.terminal("test ! -e '~'") == {"exit_code": 0, "output": ""}
        await ctx.terminal("mkdir -p ~/sub && printf deep > ~/sub/f.txt")
        assert await ctx.read_file("~/sub/f.txt") == {"content": "deep"}
        assert await ctx.read_file("sub/f.txt") == {"content": "deep"}
        refused = await ctx.read_file("~/../outside")
        assert "error" in refused


async def test_a_failed_upload_leaves_the_target_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(os.urandom(150_000))  # four pieces
    async with context(max_file_bytes=60 * 1024) as ctx:  # the second piece cannot be written
        await ctx.terminal("printf old > kept.txt")
        refused = await ctx.upload_file(str(tmp_path / "big.bin"), "kept.txt")
        assert refused["exit_code"] != 0
        assert refused["output"].startswith("writing bytes 49152.. of 150000 to kept.txt")
        assert await ctx.read_file("kept.txt") == {"content": "old"}
        assert await ctx.terminal("ls -A") == {"exit_code": 0, "output": "kept.txt\n"}


async def test_dash_and_tilde_paths_name_the_files_the_file_tools_name(tmp_path: Path) -> None:
    (tmp_path / "up.txt").write_bytes(b"dash")
    async with context() as ctx:
        assert (await ctx.upload_file(str(tmp_path / "up.txt"), "-d/-f.txt"))["exit_code"] == 0
        assert await ctx.read_file("-d/-f.txt") == {"content": "dash"}
        assert await ctx.download_file("-d/-f.txt", str(tmp_path / "f.txt")) == {
            "success": True,
            "bytes": 4,
        }
        assert await ctx.download_dir("-d", str(tmp_path / "d")) == [{"success": True, "bytes": 4}]
        assert (tmp_path / "d" / "-f.txt").read_bytes() == b"dash"

        assert await ctx.write_file("~/home/a.txt", "tilde") == {"success": True}
        assert await ctx.download_file("~/home/a.txt", str(tmp_path / "a.txt")) == {
            "success": True,
            "bytes": 5,
        }
        assert (tmp_path / "a.txt").read_bytes() == b"tilde"
        assert (await ctx.upload_file(str(tmp_path / "up.txt"), "~/home/b.txt"))["exit_code"] == 0
        assert await ctx.read_file("home/b.txt") == {"content": "dash"}
        got = await ctx.download_dir("~/home", str(tmp_path / "h"))
        assert sorted(answer["bytes"] for answer in got) == [4, 5], got
        assert (tmp_path / "h" / "a.txt").read_bytes() == b"tilde"
        assert (tmp_path / "h" / "b.txt").read_bytes() == b"dash"
        assert (await ctx.search("tilde", "~/home"))["matches"] == ["home/a.txt:1:tilde"]
        assert await ctx.terminal("test ! -e '~'") == {"exit_code": 0, "output": ""}


async def test_downloads_fit_a_smaller_output_cap(tmp_path: Path) -> None:
    async with context(output_cap_bytes=16 * 1024) as ctx:
        await ctx.terminal("head -c 100000 /dev/urandom > f.bin")
        there = (await ctx.terminal("sha256sum f.bin"))["output"].split()[0]
        answer = await ctx.download_file("f.bin", str(tmp_path / "f.bin"))
        assert answer == {"success": True, "bytes": 100_000}
        assert hashlib.sha256((tmp_path / "f.bin").read_bytes()).hexdigest() == there
