"""A batch's answer stays within what the pool's client accepts when every slot reads a binary
file at once: each ``read_file`` answer is at most ``file_cap_bytes`` as JSON, not six times
that (a zero byte is written ``\\u0000``). Before, sixteen slots reading a 20 MB file of zeros
made a 943 MB answer that the client refused, so the whole slot server was lost and every
trajectory on it ended ``infra_error``."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from tests.integration.test_slot_server import call, searchable_dir, start_server, stop_server
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.domain.tools import ToolOutcome, ToolResult

CAP = 1 << 20
pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(
        not any(shutil.which(name) for name in ("cc", "gcc", "clang")),
        reason="no C compiler (cc, gcc, clang) for the helper",
    ),
]


def test_reads_of_binary_files_keep_the_batch_answer_bounded() -> None:
    with searchable_dir("read-size") as folder:
        server = start_server(folder / "root")  # 4 slots, file_cap_bytes 1 MiB
        try:

            async def main() -> list[ToolResult]:
                async with server.client() as client:
                    return await _read_everywhere(client)

            results = asyncio.run(main())
        finally:
            assert stop_server(server) == 0
    zeros, mixed, text = results[0], results[1], results[2]
    for result in results:
        assert result.outcome is ToolOutcome.OK, result
        assert len(json.dumps(result.content, ensure_ascii=False).encode()) <= CAP + 200
    assert zeros.content.startswith("\0")
    assert "[... truncated: showing " in zeros.content
    shown = int(zeros.content.rsplit("showing ", 1)[1].split(" ")[0])
    assert CAP // 7 <= shown < CAP // 5, shown  # about a sixth of the cap, as \u0000 each
    assert "of 3145728 bytes]" in zeros.content
    assert "\ufffd" in mixed.content
    assert text.content.startswith("aaaa")  # plain text: the whole cap, as before
    assert f"showing {CAP} of 3145728 bytes]" in text.content


async def _read_everywhere(client: SlotServerClient) -> list[ToolResult]:
    writes = [
        call(0, "bash", command="head -c 3145728 /dev/zero > f"),
        call(1, "bash", command="head -c 3145728 /dev/urandom > f"),
        call(2, "bash", command="head -c 3145728 /dev/zero | tr '\\0' a > f"),
    ]
    for done in await client.execute(writes):
        assert done.outcome is ToolOutcome.OK, done
    return await client.execute([call(slot, "read_file", path="f") for slot in range(3)])
