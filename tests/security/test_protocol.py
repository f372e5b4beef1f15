"""Abuse of the slot server's HTTP API over TCP (class 10).

Each abusive request carries (or would carry) a call whose command writes a canary file into the
workspace of a live lease: no bearer token, a wrong one, a token with a suffix, a body declared
far over the limit, malformed JSON, an unknown path, the wrong method, an oversized head, a
stale epoch, and a head trickled in byte by byte (slowloris, for a bounded 2 s). Each must get
the right status (401, 413, 400, 404, 405, 431, or 200 with the call ``REJECTED`` as stale; the
slow head none while it is incomplete); the server must answer others within 5 s meanwhile; and
the host must find no canary file in the workspace and no call counted for the slot.
Control: the same request, well formed and with the right token and epoch, runs its command
and the host finds the canary.
"""

from __future__ import annotations

import json
import secrets
import socket
import time

import anyio

from tests.security.harness import TOKEN, Lease, Server, leased
from trajcore.adapters.pools.client import SlotServerClient


def host_and_port(server: Server) -> tuple[str, int]:
    host, _, port = server.address.removeprefix("http://").rpartition(":")
    return host, int(port)


def exchange(server: Server, raw: bytes, timeout_s: float = 10.0) -> tuple[int, bytes]:
    """Send ``raw`` on a fresh connection; the answer's status and body."""
    with socket.create_connection(host_and_port(server), timeout=timeout_s) as connection:
        connection.sendall(raw)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = connection.recv(1 << 16)
            if not chunk:
                break
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            chunk = connection.recv(1 << 16)
            if not chunk:
                break
            body += chunk
    return status, body


def request(
    method: str, path: str, body: bytes, authorization: str | None, *, length: int | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: slot-server", "Content-Type: application/json"]
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    lines.append(f"Content-Length: {len(body) if length is None else length}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def execute_body(lease: Lease, epoch: int, canary: str) -> bytes:
    call = {
        "slot": lease.slot, "epoch": epoch, "call_id": f"abuse-{secrets.token_hex(6)}",
        "tool": "bash", "arguments": {"command": f"echo ran > {canary}"}, "timeout_s": 10,
    }  # fmt: skip
    return json.dumps({"calls": [call]}).encode()


def abusive_requests(lease: Lease, canary: str) -> dict[str, tuple[bytes, int]]:
    """Name -> (raw request, the status it must get)."""
    good = f"Bearer {TOKEN}"
    body = execute_body(lease, lease.epoch, canary)
    return {
        "no token": (request("POST", "/v1/execute", body, None), 401),
        "wrong token": (request("POST", "/v1/execute", body, "Bearer not-the-token"), 401),
        "token with a suffix": (request("POST", "/v1/execute", body, good + "x"), 401),
        "token without Bearer": (request("POST", "/v1/execute", body, TOKEN), 401),
        "body declared at 1 GiB": (
            request("POST", "/v1/execute", body, good, length=1 << 30),
            413,
        ),
        "malformed JSON": (request("POST", "/v1/execute", body[:-7], good), 400),
        "unknown path": (request("POST", "/v1/execute/../reset", body, good), 404),
        "wrong method": (request("PUT", "/v1/execute", body, good), 405),
        "oversized head": (
            request("POST", "/v1/execute", body, good).replace(
                b"Connection: close", b"X-Pad: " + b"a" * (128 << 10) + b"\r\nConnection: close"
            ),
            431,
        ),
    }


async def calls_run(client: SlotServerClient, slot: int) -> int:
    return (await client.list_slots()).slots[slot].calls_run


def slowloris(server: Server, lease: Lease, canary: str, client_check_s: float) -> list[float]:
    """Trickle a valid, authorized request's head one byte at a time for 2 s (never finishing
    it), asking for health on another connection meanwhile; the health answers' latencies."""
    head = request(
        "POST", "/v1/execute", execute_body(lease, lease.epoch, canary), f"Bearer {TOKEN}"
    )
    latencies = []
    with socket.create_connection(host_and_port(server), timeout=5) as slow:
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < 2.0 and sent < len(head) - 4:
            slow.sendall(head[sent : sent + 1])
            sent += 1
            if sent % 10 == 0:
                asked = time.monotonic()
                status, _ = exchange(
                    server,
                    request("GET", "/v1/health", b"", f"Bearer {TOKEN}"),
                    timeout_s=client_check_s,
                )
                assert status == 200
                latencies.append(time.monotonic() - asked)
            time.sleep(0.05)
    return latencies


def test_abusive_requests_get_the_right_status_and_run_nothing(server: Server) -> None:
    canary = f"pwned-{secrets.token_hex(6)}"

    async def main() -> tuple[dict[str, int], dict[str, int], bool, int, int, list[float]]:
        async with server.client() as client:
            async with leased(server, client, 0) as old:
                await old.bash("true")
            stale_epoch = old.epoch
            async with leased(server, client, 0) as lease:
                await lease.bash("true")
                before = await calls_run(client, 0)
                expected: dict[str, int] = {}
                got: dict[str, int] = {}
                for name, (raw, status) in abusive_requests(lease, canary).items():
                    expected[name] = status
                    got[name], _ = await anyio.to_thread.run_sync(exchange, server, raw)
                stale_body = execute_body(lease, stale_epoch, canary)
                status, answer = await anyio.to_thread.run_sync(
                    exchange, server, request("POST", "/v1/execute", stale_body, f"Bearer {TOKEN}")
                )
                expected["stale epoch"], got["stale epoch"] = 200, status
                (result,) = json.loads(answer)["results"]
                stale_refused = result["outcome"] == "rejected" and "stale" in result["error"]
                latencies = await anyio.to_thread.run_sync(slowloris, server, lease, canary, 5.0)
                after = await calls_run(client, 0)
                planted = (lease.workspace / canary).exists()
        return expected, got, stale_refused and not planted, before, after, latencies

    expected, got, clean, before, after, latencies = anyio.run(main)
    assert got == expected
    assert clean, "a stale or refused request ran its command (the canary file exists)"
    assert after == before, "the server counted a call for an abusive request"
    assert latencies, "the slow head was never interleaved with other requests"
    assert max(latencies) < 5.0, f"a slow head stalled other requests: {max(latencies):.2f} s"


def test_control_a_well_formed_request_runs_its_command(server: Server) -> None:
    canary = f"pwned-{secrets.token_hex(6)}"

    async def main() -> tuple[int, bool]:
        async with server.client() as client, leased(server, client, 0) as lease:
            raw = request(
                "POST", "/v1/execute", execute_body(lease, lease.epoch, canary), f"Bearer {TOKEN}"
            )
            status, _ = await anyio.to_thread.run_sync(exchange, server, raw)
            return status, (lease.workspace / canary).exists()

    status, planted = anyio.run(main)
    assert status == 200
    assert planted
