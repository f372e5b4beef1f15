"""The slot server's TCP connections (cluster pools) send each message at once: Nagle's
algorithm is off on the accepted socket (``TCP_NODELAY``, which asyncio's transports set). With a
reply written in one write (``http1.server.encode_reply`` joins head and body), no segment waits
for the peer's delayed ACK, so ``TCP_QUICKACK`` has nothing to do."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.server import start_http_server

TOKEN = "socket-options-token-0123456789abcdef"


def test_an_accepted_tcp_connection_has_nagle_off(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[list[int], bytes]:
        runtime = SlotRuntime(RuntimeConfig(slots=1, root=tmp_path / "root"))
        server, address = await start_http_server(runtime, TOKEN, listen="127.0.0.1:0")
        try:
            assert address is not None
            host, _, port = address.removeprefix("http://").rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /v1/nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
            first = await reader.read(1 << 16)
            options = [
                conn.transport.get_extra_info("socket").getsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY
                )
                for conn in server._connections  # the accepted sockets
                if conn.transport is not None
            ]
            writer.close()
            return options, first
        finally:
            await server.aclose()

    options, first = asyncio.run(main())
    assert options
    assert all(options)
    head, _, body = first.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert head.startswith(b"HTTP/1.1 401")
    assert len(body) == length
