"""``process`` against a real endpoint: the ``--openai.*`` flags are honoured and a bad endpoint
ends the run with a clear error within a stated deadline.

This very file is the env (``python test_model_endpoint.py process ...``, the command an env
author runs); its ``config_init`` returns ``super()``'s servers, as the examples do, which is
Atropos's ``ServerBaseline`` (that used to drop every ``--openai.*`` flag and then poll
``localhost:9004`` forever, silently). The sandbox is the in-memory pool, so only the model
side is real: a port nothing listens on, a loopback HTTP server that answers the wrong thing
(404 pages), and a loopback OpenAI-compatible server (``trajcore.testing.llm_stubs``) as the
control that a run goes through when the endpoint is right. Every child runs in its own
process group and is killed, group and all, at the end.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path

import pytest

from tests.processes import child_environment, end_group, free_port
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.messages import Message
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.rollout.tools import SlotTools

pytestmark = pytest.mark.slow

MODEL_WAIT_S = 3
START_UP_S = 40
"""Generous bound on a child's start (imports, tokenizer) on a loaded 2-core machine."""


class EndpointEnv(AgentEnv[str]):
    """Answer anything; the score is 1 when the model said something."""

    name = "endpoint_env"

    async def get_next_item(self) -> str:
        return "say hello"

    def build_task(self, item: str) -> str:
        return item

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        return 1.0 if messages[-1].content else 0.0

    def make_pool(self) -> AbstractAsyncContextManager[SandboxPool]:
        return FakeSandboxPool(containers=1, slots_per_container=2)

    @classmethod
    def config_init(cls) -> tuple[AgentEnvConfig, object]:
        config, servers = super().config_init()  # Atropos's ServerBaseline, as the examples
        return config.model_copy(update={"group_size": 2, "max_turns": 2}), servers


def _child_env(tmp_path: Path) -> dict[str, str]:
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    return child_environment(scratch)


def _process(tmp_path: Path, base_url: str, *extra: str) -> tuple[int, str, float]:
    """Run ``process`` against ``base_url``; its exit code, output and wall time."""
    argv = [
        sys.executable, __file__, "process",
        "--openai.base_url", base_url,
        "--openai.model_name", "stub-model",
        "--openai.api_key", "x",
        "--env.tokenizer_name", str(qwen3_tokenizer_path()),
        "--env.use_wandb", "false",
        "--env.total_steps", "1",
        "--env.max_token_length", "4096",
        "--env.max_tokens", "64",
        "--env.slot_lifetime_s", "30",
        "--env.agent_max_steps", "2",  # a seed name, accepted as a flag
        "--env.data_path_to_save_groups", str(tmp_path / "groups.jsonl"),
        *extra,
    ]  # fmt: skip
    log = tmp_path / "process.log"
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_child_env(tmp_path),
            start_new_session=True,
        )
    try:
        code = process.wait(timeout=START_UP_S + 60)
    except subprocess.TimeoutExpired:
        end_group(process)
        pytest.fail(
            f"process mode did not end within {START_UP_S + 60} s:\n"
            + log.read_text(errors="replace")[-3000:]
        )
    finally:
        end_group(process)
    return code, log.read_text(errors="replace"), time.monotonic() - started


class _WrongAnswers(http.server.BaseHTTPRequestHandler):
    """A web server that is not a model server: every request gets a 404 page."""

    def _not_here(self) -> None:
        body = b"<html><body>Not Found</body></html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._not_here()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        self._not_here()

    def log_message(self, format: str, *args: object) -> None:
        return


@contextmanager
def _wrong_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WrongAnswers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def _llm_stub(tmp_path: Path) -> Iterator[int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "trajcore.testing.llm_stubs"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=_child_env(tmp_path),
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.strip().isdigit(), line
        yield int(line)
    finally:
        end_group(process)
        if process.stdout is not None:
            process.stdout.close()


def test_an_unreachable_endpoint_ends_the_run_after_model_wait_s(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: connections are refused
    url = f"http://127.0.0.1:{port}/v1"
    code, output, wall_s = _process(tmp_path, url, "--env.model_wait_s", str(MODEL_WAIT_S))
    assert code != 0
    assert "unrecognized arguments" not in output
    assert "agent_max_steps is the atropos-agent name of trajcore's max_turns" in output
    assert f"waiting for the model endpoint (giving up in {MODEL_WAIT_S} s" in output
    assert "EndpointEnv: ModelEndpointUnavailable: " in output  # one line, no traceback
    assert "Traceback" not in output
    assert f"no model endpoint answered within model_wait_s={MODEL_WAIT_S} s" in output
    assert url in output  # the URL the user gave, not Atropos's localhost:9004
    assert "localhost:9004" not in output
    assert "expected POST" in output
    assert "/chat/completions" in output
    assert wall_s < START_UP_S + MODEL_WAIT_S + 10
    groups = tmp_path / "groups.jsonl"
    assert not groups.exists() or groups.read_text() == ""  # no group was written


def test_an_endpoint_answering_the_wrong_thing_ends_the_run_at_once(tmp_path: Path) -> None:
    with _wrong_server() as port:
        url = f"http://127.0.0.1:{port}/v1"
        # The deadline is long: a wrong answer must not wait for it.
        code, output, wall_s = _process(tmp_path, url, "--env.model_wait_s", "300")
    assert code != 0
    assert "ModelEndpointUnavailable" in output
    assert "answers, but not as a model server" in output
    assert url in output
    assert "HTTP 404" in output
    assert f"expected POST {url}/chat/completions answering 200" in output
    assert "Check --openai.base_url" in output
    assert wall_s < START_UP_S + 20


def test_the_openai_flags_reach_the_model_when_it_answers(tmp_path: Path) -> None:
    with _llm_stub(tmp_path) as port:
        url = f"http://127.0.0.1:{port}/v1"
        code, output, _ = _process(tmp_path, url, "--env.model_wait_s", str(MODEL_WAIT_S))
    assert code == 0, output[-3000:]
    assert f"model endpoint {url} answers" in output
    (group,) = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert len(group["messages"]) == 2
    for conversation in group["messages"]:
        assert conversation[-1]["content"] == "echo: say hello"  # the stub's answer


class _StallingModel(http.server.BaseHTTPRequestHandler):
    """A model server that answers the one-token probes (the env's start-up probe, Atropos's
    health check) until a trajectory's first request, then fails as ``mode`` says: ``"hang"``
    holds every request but the probes unanswered; ``"down"`` answers every request, the
    probes included, with HTTP 503, so Atropos's health check marks the server unhealthy."""

    mode = "hang"
    released = threading.Event()
    failing = threading.Event()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        if body.get("max_tokens") != 1:
            self.failing.set()
        if self.failing.is_set() and self.mode == "down":
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if body.get("max_tokens") != 1:  # "hang": held until the test ends
            self.released.wait(timeout=120)
            return
        answer = json.dumps({
            "id": "probe", "object": "chat.completion", "created": 0, "model": "stub-model",
            "choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": "h"}}],
        }).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        return


@contextmanager
def _stalling_model(mode: str) -> Iterator[int]:
    class Handler(_StallingModel):  # its own events: one server per test
        released = threading.Event()
        failing = threading.Event()

    Handler.mode = mode
    handler = Handler
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        handler.released.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize(
    ("mode", "extra", "why"),
    [
        ("hang", ("--openai.timeout", "2"), "past openai.timeout=2 s for one request"),
        ("down", (), "every model server (1) is marked unhealthy by Atropos's health check"),
    ],
)
def test_a_model_server_failing_until_the_deadline_is_a_model_error_not_a_score(
    tmp_path: Path, mode: str, extra: tuple[str, ...], why: str
) -> None:
    """Atropos's own retries outlast a trajectory's deadline; the members whose model call
    was still in flight then are the model server's failure, never scored 0."""
    with _stalling_model(mode) as port:
        url = f"http://127.0.0.1:{port}/v1"
        code, output, _ = _process(
            tmp_path, url, "--env.model_wait_s", "20", "--env.slot_lifetime_s", "8", *extra
        )
    assert code == 1  # the groups failed, max_failed_groups in a row, said in one line:
    assert "EndpointEnv: GroupsFailing: 5 groups in a row failed" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "model_error" in output, output[-3000:]
    assert why in output, output[-3000:]
    assert "scores [None, None]" in output, output[-3000:]  # never scored, never 0
    assert "scores [0.0" not in output, output[-3000:]
    warned = "openai.timeout=1200 s is not below the trajectory's deadline (8 s)" in output
    assert warned is (mode == "down")  # Atropos's default timeout, which a hang never reaches
    groups = tmp_path / "groups.jsonl"
    assert not groups.exists() or groups.read_text() == ""  # nothing scored was written


if __name__ == "__main__":
    EndpointEnv.cli()
