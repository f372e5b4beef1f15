"""Env processes of one env given shards that overlap, against one real Atropos ``run-api``
(docs/deploy.md, "Several env processes of one env").

The test starts atroposlib's ``run-api`` with a trainer registered, the scripted model of
``test_env_processes`` on loopback, and that file's env in ``serve`` mode on shard ``0/2`` of a
four-row dataset, each on its own local pool. Once the first process's groups reach the trainer, it
starts two more processes of the same env against the same API and dataset: one on the same shard
``0/2``, one on ``1/3`` (another ``K``: its rows 1, 4, 7 ... meet ``0/2``'s 0, 2, 4 ...). Each of
them ends at once, before it registers with the API or starts a pool, with status 2 and one line
naming ``dataset_shard`` and why; an ``evaluate`` of the env on ``0/2`` meanwhile runs (it sends
the trainer no row, so it claims no shard; nor does ``process``) and exits 0; the first one keeps
serving, and SIGTERM then ends it with status 128 + 15. The shard claim file is removed at the end
by the last process that held a claim in it (it lies beside the host's slot uid reservations).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.integration import test_env_processes as shard_env
from tests.processes import alive, child_environment, descendants, run_api, wait_until
from trajcore.entrypoints.atropos.shard_claims import claim_file

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
]

ROWS = 4
START_S = 150.0
"""Generous bound on an env's start and first groups on a loaded 2-core machine."""


@attrs.frozen
class Shard:
    dataset_shard: str
    dataset: str
    rollout_server_url: str
    dataset_split: str = "train"
    wandb_name: str | None = "shard_env"  # (as ``_serve`` gives it)


@contextmanager
def _serve(
    shard: str,
    *,
    command: str = "serve",
    url: str,
    model: str,
    dataset: Path,
    log: Path,
    cwd: Path,
    environment: dict[str, str],
) -> Iterator[subprocess.Popen[bytes]]:
    """``test_env_processes.py serve`` (or ``command``) on ``shard``; killed, with every process
    it started, on the way out when still running."""
    argv = [
        sys.executable, shard_env.__file__, command,
        "--env.rollout_server_url", url,
        "--openai.base_url", model,
        "--openai.model_name", "stub-model",
        "--openai.api_key", "x",
        "--env.dataset", str(dataset),
        "--env.dataset_shard", shard,
        "--env.use_wandb", "false",
        "--env.wandb_name", "shard_env",
        "--env.include_messages", "true",
        "--env.total_steps", "100",
        "--env.max_token_length", "4096",
        "--env.max_tokens", "64",
        "--env.slot_lifetime_s", "30",
        "--env.local_containers", "1",
        "--env.slots_per_container", str(shard_env.GROUP_SIZE),
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=environment,
                                   cwd=cwd)  # fmt: skip
    try:
        yield process
    finally:
        started = descendants(process.pid)
        if process.poll() is None:
            process.kill()
            process.wait()
        for proc in alive(started):  # what a failing test left: never outlive the test
            os.kill(proc.pid, signal.SIGKILL)


def test_a_second_process_on_a_taken_shard_or_another_k_is_refused_naming_dataset_shard(
    tmp_path: Path,
) -> None:
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"Row {i}."}) + "\n" for i in range(ROWS)))
    scratch = Path(tempfile.mkdtemp(prefix="trajcore-env-shards-"))
    scratch.chmod(0o711)
    environment = child_environment(scratch)
    deadline = time.monotonic() + START_S
    claims: Path | None = None
    try:
        with (
            shard_env._model_server() as model,
            run_api(tmp_path, environment, batch_size=shard_env.GROUP_SIZE) as trainer,
            ExitStack() as envs,
        ):
            url = str(trainer.base_url).rstrip("/")
            claims = claim_file(Shard("0/2", str(dataset), url), shard_env.ShardEnv.__name__)

            def serve(shard: str, name: str, command: str = "serve") -> subprocess.Popen[bytes]:
                return envs.enter_context(
                    _serve(shard, command=command, url=url, model=f"{model.url}/v1",
                           dataset=dataset, log=tmp_path / f"{name}.log", cwd=tmp_path,
                           environment=environment)
                )  # fmt: skip

            first = serve("0/2", "first")
            logs = [tmp_path / "first.log", tmp_path / "run-api.log"]
            groups: list[dict[str, Any]] = []

            def first_groups() -> bool | None:
                assert first.poll() is None, logs[0].read_text()[-3000:]
                groups.extend(trainer.get("/batch").json()["batch"] or [])
                return True if groups else None

            wait_until(deadline, "the first env's groups", logs, first_groups)
            refused = {"0/2": serve("0/2", "same"), "1/3": serve("1/3", "other-k")}
            evaluate = serve("0/2", "evaluate", command="evaluate")
            statuses = {shard: p.wait(timeout=START_S) for shard, p in refused.items()}
            evaluated = evaluate.wait(timeout=START_S)
            outputs = {
                shard: (tmp_path / name).read_text(errors="replace")
                for shard, name in (("0/2", "same.log"), ("1/3", "other-k.log"))
            }
            assert first.poll() is None, logs[0].read_text()[-3000:]
            assert claims.is_file()
            first.send_signal(signal.SIGTERM)
            first_status = first.wait(timeout=60)
            claims_left = claims.exists()
    finally:
        if claims is not None:
            claims.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)

    reasons = {
        "0/2": "0/2: another process of ShardEnv 'shard_env' against "
        + url
        + " on this host serves this "
        "shard already; give each process its own I (0 to 1) @ dataset_shard",
        "1/3": "1/3: another process of ShardEnv 'shard_env' against "
        + url
        + " on this host serves the "
        "dataset in shards of another K (their rows would overlap); give every process the "
        "same K @ dataset_shard",
    }
    for shard, reason in reasons.items():
        assert statuses[shard] == 2, outputs[shard][-3000:]
        assert reason in outputs[shard], outputs[shard][-3000:]
        assert "stopping and closing the sandbox pool" not in outputs[shard]
    evaluate_output = (tmp_path / "evaluate.log").read_text(errors="replace")
    assert evaluated == 0, evaluate_output[-3000:]  # evaluate sends no row: it claims nothing
    assert "@ dataset_shard" not in evaluate_output
    assert first_status == 128 + signal.SIGTERM
    assert not claims_left  # the last claim's end removed its file
    run_api_log = (tmp_path / "run-api.log").read_text()
    assert run_api_log.count("POST /register-env") == 1, run_api_log[-3000:]
