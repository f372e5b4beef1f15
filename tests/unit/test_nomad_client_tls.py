"""An https Nomad agent whose certificate a cluster's own CA signed: the client checks it against
the bundle ``$NOMAD_CACERT`` names, as the ``nomad`` command line does, and a certificate it
cannot check fails naming the address."""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trajcore.adapters.pools.nomad_client import NomadClient, NomadUnavailable

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Leader(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'"127.0.0.1:4647"'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An https agent on loopback answering ``status/leader``, and its certificate's file."""
    cert, key = tmp_path / "agent.pem", tmp_path / "agent.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Leader)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


async def test_the_cluster_ca_in_nomad_cacert_checks_the_agent(
    agent: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, cert = agent
    monkeypatch.setenv("NOMAD_CACERT", str(cert))
    assert await NomadClient(address=address, timeout_s=5.0).leader() == "127.0.0.1:4647"


async def test_an_agent_certificate_no_known_ca_signed_fails_naming_the_address(
    agent: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, _ = agent
    monkeypatch.delenv("NOMAD_CACERT", raising=False)
    with pytest.raises(NomadUnavailable) as caught:
        await NomadClient(address=address, timeout_s=5.0).leader()
    assert caught.value.field == "address"
    assert "127.0.0.1" in str(caught.value)
