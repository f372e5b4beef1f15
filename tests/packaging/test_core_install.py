"""The core install on its own: a fresh venv with trajcore's wheel and its core dependencies only
(at the locked versions) runs ``trajcore slot-server`` and answers health.

This builds the wheel (the build backend and the core's packages come from PyPI through uv, whose
cache makes reruns fast) and installs it into a new venv made without pip, so every distribution in
it is one the core install brought.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).parent / "uv"
HAS_COMPILER = any(shutil.which(name) for name in ("cc", "gcc", "clang"))
MAX_CORE_DISTRIBUTIONS = 20

pytestmark = pytest.mark.slow


def _constraints(lock: Path, target: Path) -> Path:
    """The lock's pins (name==version; marker) without its hashes, as a constraints file."""
    pins = [
        line.rstrip(" \\")
        for line in lock.read_text().splitlines()
        if re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*==", line)
    ]
    target.write_text("\n".join(pins) + "\n")
    return target


def _uv(*args: str) -> str:
    done = subprocess.run(
        [str(UV), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"uv {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _get(socket_path: str, target: str) -> tuple[int, dict[str, object]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(30)
        connection.connect(socket_path)
        connection.sendall(
            f"GET {target} HTTP/1.1\r\nHost: slots\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := connection.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    if b"chunked" in head.lower():
        raise AssertionError(f"unexpected chunked answer: {head!r}")
    return status, json.loads(body)


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not UV.is_file():
        pytest.skip(f"uv is not installed next to {sys.executable} (./dev test installs it)")
    work = tmp_path_factory.mktemp("core-install")
    _uv("build", "--wheel", "--quiet", "--out-dir", str(work / "dist"), str(ROOT))
    (wheel,) = (work / "dist").glob("trajcore-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        shipped = "trajcore/adapters/slot_server/_native/slot-helper" in names
    # the report's templates are package data
    assert {"report.html.j2", "message.html.j2", "report.css"} <= {
        name.rsplit("/", 1)[1]
        for name in names
        if name.startswith("trajcore/entrypoints/templates/")
    }
    # the build hook compiles the helper into the wheel wherever a compiler is present
    assert shipped == HAS_COMPILER, (wheel.name, shipped)
    venv = work / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    constraints = _constraints(ROOT / "requirements.lock", work / "constraints.txt")
    _uv(
        "pip",
        "install",
        "--quiet",
        "--python",
        str(venv / "bin" / "python"),
        "--constraint",
        str(constraints),
        str(wheel),
    )
    return venv


@pytest.fixture
def slot_root() -> Iterator[Path]:
    """A fresh directory every user may search: a server run as root runs its slots as other
    uids, which must reach their workspaces below it (pytest's ``tmp_path`` is private)."""
    folder = Path(tempfile.mkdtemp(prefix="trajcore-core-install-"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_core_install_is_small_and_holds_no_trainer_stack(core_venv: Path) -> None:
    listing = subprocess.run(
        [
            str(core_venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m, json;"
            "print(json.dumps(sorted(d.metadata['Name'].lower() for d in m.distributions())))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    installed = json.loads(listing.stdout)
    assert "trajcore" in installed
    assert {"attrs", "cattrs", "anyio", "jsonschema"} <= set(installed)
    assert len(installed) <= MAX_CORE_DISTRIBUTIONS, installed
    said = re.search(r"that is (\d+) distributions", (ROOT / "docs" / "deploy.md").read_text())
    assert said is not None
    assert int(said.group(1)) == len(installed), installed  # docs/deploy.md says the count
    for heavy in ("atroposlib", "transformers", "tokenizers", "httpx", "aiohttp", "numpy"):
        assert heavy not in installed


def test_the_core_install_serves_slots(core_venv: Path, slot_root: Path) -> None:
    socket_path = str(slot_root / "slots.sock")
    server = subprocess.Popen(
        [
            str(core_venv / "bin" / "trajcore"),
            "slot-server",
            "--slots",
            "2",
            "--root",
            str(slot_root / "root"),
            "--unix",
            socket_path,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # no compiler at run time: the helper can only be the one the wheel ships
        env={
            **os.environ,
            "CC": "/nonexistent/cc",
            "TRAJCORE_CACHE_DIR": str(slot_root / "cache"),
        },
    )
    try:
        assert server.stdout is not None
        assert server.stderr is not None
        line = server.stdout.readline()
        if not HAS_COMPILER:
            # the wheel ships no helper and none can be built: no server, and what to install
            assert line == ""
            refusal = server.stderr.read()
            assert "no compiled helper ships with this install" in refusal, refusal
            assert "gcc and libc6-dev" in refusal, refusal
        else:
            ready = json.loads(line or "{}")
            assert ready.get("ready") is True, server.stderr.read()
            status, health = _get(socket_path, "/v1/health")
            assert status == 200
            assert health["slots"] == 2
            assert health["capabilities"] == ready["capabilities"]
            capabilities = ready["capabilities"]
            assert capabilities["slot_helper"] == "native", capabilities["detail"]
            assert capabilities["slot_helper_origin"] == "shipped"
            assert not list((slot_root / "cache").glob("slot-helper-*"))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
            raise
        for stream in (server.stdout, server.stderr):
            if stream is not None:
                stream.close()
    assert code == (0 if HAS_COMPILER else 2)


def test_a_subcommand_outside_the_core_names_its_extra(core_venv: Path) -> None:
    done = subprocess.run(
        [str(core_venv / "bin" / "trajcore"), "tool-server", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "install trajcore[tool-server]" in done.stderr
