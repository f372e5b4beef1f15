"""The rows behind the built-in ``get_next_item`` (``trajcore.entrypoints.dataset_rows``):
files read as they are, every bad file or row a ``ConfigError`` naming where, and a Hugging
Face name loaded without ever reaching the network."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.dataset_rows import load_rows


def test_a_jsonl_string_may_hold_unicode_line_separators(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": "a\u2028b"}, {"prompt": "c\x85d\u2029e"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    assert load_rows(str(path), split="train", prompt_field="prompt") == tuple(rows)


def test_a_jsonl_that_is_not_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(ConfigError) as caught:
        load_rows(str(path), split="train", prompt_field="prompt")
    assert caught.value.field == "dataset"
    assert f"{path}:2 is not UTF-8" in caught.value.reason


def test_a_corrupt_parquet_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"not a parquet file")
    with pytest.raises(ConfigError) as caught:
        load_rows(str(path), split="train", prompt_field="prompt")
    assert caught.value.field == "dataset"
    assert str(path) in caught.value.reason


def test_a_bad_row_is_named_by_its_line_blank_lines_counted(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('\n{"prompt": "a"}\n\n{"task": "b"}\n[1]\n')
    with pytest.raises(ConfigError) as caught:
        load_rows(str(path), split="train", prompt_field="prompt")
    assert caught.value.field == "prompt_field"
    assert caught.value.reason.startswith(f"{path}:4 has no text field 'prompt'")
    path.write_text('{"prompt": "a"}\n\n[1]\n')
    with pytest.raises(ConfigError) as caught:
        load_rows(str(path), split="train", prompt_field="prompt")
    assert caught.value.reason == f"{path}:3 is not an object"


class _CountingHub(http.server.BaseHTTPRequestHandler):
    """A stand-in for the Hub on loopback that counts every request and answers 404."""

    requests: ClassVar[list[str]] = []

    def _answer(self) -> None:
        self.requests.append(f"{self.command} {self.path}")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._answer()

    def do_HEAD(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def counting_hub() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Handler", (_CountingHub,), {"requests": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


_CHILD = """
import huggingface_hub, datasets  # imported online, as a program would
from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.dataset_rows import load_rows
try:
    load_rows("some-org/some-dataset", split="train", prompt_field="prompt")
except ConfigError as error:
    print("ConfigError", error.field)
"""


def test_a_hub_name_never_reaches_the_network_in_a_process_started_online(
    tmp_path: Path, counting_hub: tuple[str, list[str]]
) -> None:
    endpoint, seen = counting_hub
    offline = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    environment = {k: v for k, v in os.environ.items() if k not in offline}
    environment.update(
        HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), HF_HUB_ETAG_TIMEOUT="2",
        HF_HUB_DOWNLOAD_TIMEOUT="2", NO_PROXY="*", no_proxy="*",
        PYTHONPATH=os.pathsep.join(sys.path),
    )  # fmt: skip
    child = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=environment, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "ConfigError dataset" in child.stdout, child.stderr[-2000:]
    assert seen == []
