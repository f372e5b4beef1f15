"""Shard claims (``trajcore.entrypoints.atropos.shard_claims``): two env processes of one run of
an env on one host never serve the same ``dataset_shard``, nor shards of two ``K`` s; each refusal
is a ``ConfigError`` at ``dataset_shard`` saying which; a claim ends with its holder, however the
holder ends; the last claim to end removes the claim file.

The claims are open-file-description locks, so two claims in this one process meet as two
processes' claims do; the claim files lie in ``tmp_path`` (beside the slot uid reservation file
``TRAJCORE_SLOT_UID_LOCK`` names, as root; in ``XDG_RUNTIME_DIR`` otherwise).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from trajcore.adapters.slot_uid_locks import LOCK_FILE_ENV, reserve
from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.atropos.shard_claims import MAX_SHARDS, claim_file, claim_shard

ENV = "ShardEnv"


@attrs.frozen(kw_only=True)
class Run:
    dataset_shard: str | None
    dataset: str | None = "rows.jsonl"
    dataset_split: str = "train"
    rollout_server_url: str = "http://127.0.0.1:8000"
    wandb_name: str | None = None


@pytest.fixture(autouse=True)
def claims_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(LOCK_FILE_ENV, str(tmp_path / "run" / "slot-uids"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    return tmp_path / "run"


def test_a_shard_is_served_by_one_process_of_a_run_only() -> None:
    with claim_shard(Run(dataset_shard="0/3"), ENV), claim_shard(Run(dataset_shard="2/3"), ENV):
        with pytest.raises(ConfigError) as caught, claim_shard(Run(dataset_shard="2/3"), ENV):
            pass
        assert caught.value.field == "dataset_shard"
        assert "2/3: another process of ShardEnv against http://127.0.0.1:8000" in str(caught.value)
        assert "serves this shard already; give each process its own I (0 to 2)" in str(
            caught.value
        )
        with claim_shard(Run(dataset_shard="1/3"), ENV):  # the shard left is free
            pass
    with claim_shard(Run(dataset_shard="2/3"), ENV):  # free again once its holder ended
        pass


def test_the_claim_file_lives_while_a_claim_holds_it_and_goes_with_the_last() -> None:
    path = claim_file(Run(dataset_shard="0/2"), ENV)
    with claim_shard(Run(dataset_shard="0/2"), ENV):
        with claim_shard(Run(dataset_shard="1/2"), ENV):
            assert path.is_file()
            with pytest.raises(ConfigError), claim_shard(Run(dataset_shard="1/2"), ENV):
                pass
            assert path.is_file()  # a refused claim leaves the holders' file
        assert path.is_file()  # the other claim still holds it
        with pytest.raises(ConfigError), claim_shard(Run(dataset_shard="0/2"), ENV):
            pass  # and its lock still stands
    assert not path.exists()
    assert not list(path.parent.iterdir())


@pytest.mark.parametrize("other", ["0/1", "0/2", "1/2", "1/4", "3/4", f"0/{MAX_SHARDS}"])
def test_shards_of_another_k_are_refused_both_ways(other: str) -> None:
    for first, second in (("1/3", other), (other, "1/3")):
        with claim_shard(Run(dataset_shard=first), ENV):
            with pytest.raises(ConfigError) as caught, claim_shard(Run(dataset_shard=second), ENV):
                pass
            assert caught.value.field == "dataset_shard"
            assert "serves the dataset in shards of another K" in str(caught.value), caught.value
            assert "give every process the same K" in str(caught.value)


@pytest.mark.parametrize(
    "apart",
    [
        Run(dataset_shard="0/2", rollout_server_url="http://127.0.0.1:8001"),
        Run(dataset_shard="0/2", dataset="other.jsonl"),
        Run(dataset_shard="0/2", dataset_split="test"),
        Run(dataset_shard="0/3", rollout_server_url="http://127.0.0.1:8001"),
    ],
)
def test_runs_that_differ_in_api_dataset_or_split_do_not_meet(apart: Run) -> None:
    with claim_shard(Run(dataset_shard="0/2"), ENV), claim_shard(apart, ENV):
        pass
    with claim_shard(Run(dataset_shard="0/2"), ENV), claim_shard(Run(dataset_shard="0/2"), "Other"):
        pass


def test_two_envs_of_one_class_registered_under_two_names_do_not_meet() -> None:
    """One env class run as two envs of the trainer (``wandb_name``, the name each registers
    under) may serve the same rows to each; processes of one of them still meet."""
    easy, hard = (
        Run(dataset_shard="0/2", wandb_name="easy"),
        Run(dataset_shard="0/2", wandb_name="hard"),
    )
    with claim_shard(easy, ENV), claim_shard(hard, ENV):
        with pytest.raises(ConfigError) as caught:  # noqa: SIM117 (the claim raises)
            with claim_shard(easy, ENV):
                pass
        assert "another process of ShardEnv 'easy' against" in str(caught.value)


@pytest.mark.parametrize("shard", ["2/2", "0/0", "5/3", f"0/{MAX_SHARDS + 1}", "x/2"])
def test_a_shard_that_is_no_shard_is_refused_naming_the_field(shard: str) -> None:
    with pytest.raises(ConfigError) as caught, claim_shard(Run(dataset_shard=shard), ENV):
        pass
    assert caught.value.field == "dataset_shard"
    assert f"expected I/K with 0 <= I < K <= {MAX_SHARDS}, got {shard!r}" in str(caught.value)


def test_no_shard_claims_nothing(claims_in_tmp: Path) -> None:
    with claim_shard(Run(dataset_shard=None), ENV), claim_shard(Run(dataset_shard=None), ENV):
        pass
    assert not claims_in_tmp.exists()


def test_a_killed_holders_shard_is_free_at_once(tmp_path: Path) -> None:
    """A process that holds shard 0/2 and is killed (SIGKILL, no exit code of its own runs)."""
    script = (
        "import sys, attrs\n"
        "from trajcore.entrypoints.atropos.shard_claims import claim_shard\n"
        "from tests.unit.test_shard_claims import ENV, Run\n"
        "with claim_shard(Run(dataset_shard='0/2'), ENV):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.read()\n"
    )
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    with subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path},
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == b"held\n"
            with pytest.raises(ConfigError), claim_shard(Run(dataset_shard="0/2"), ENV):
                pass
        finally:
            holder.kill()
            holder.wait()
    claims = claim_file(Run(dataset_shard="0/2"), ENV)
    assert claims.is_file()  # the killed holder could not remove it
    with claim_shard(Run(dataset_shard="0/2"), ENV):
        pass
    assert not claims.exists()  # the next claim's end did


def test_an_unusable_claim_folder_is_warned_about_and_the_run_goes_on(
    claims_in_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = claim_file(Run(dataset_shard="0/2"), ENV).parent
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.write_text("not a folder")
    with caplog.at_level(logging.WARNING), claim_shard(Run(dataset_shard="0/2"), ENV):
        pass
    assert "dataset_shard 0/2: cannot check that no other process serves it" in caplog.text


def test_a_claim_file_being_removed_is_never_taken_for_another_processs_shards(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The last claim to end removes the file under a write lock over all of it: a claim that
    meets that lock (the removal's moment) is not refused as a conflict with shards served; it
    takes its locks again (here the removal never ends: it gives up with a warning)."""
    path = claim_file(Run(dataset_shard="0/2"), ENV)
    path.parent.mkdir(parents=True, exist_ok=True)
    every_shard = MAX_SHARDS * (MAX_SHARDS + 1) // 2  # the bytes of every I/K, and the next
    removing = reserve(0, every_shard + 1, path=path)  # as the last claim's end holds
    try:
        with caplog.at_level(logging.WARNING), claim_shard(Run(dataset_shard="0/2"), ENV):
            pass
    finally:
        removing.release()
    assert "dataset_shard 0/2: cannot check that no other process serves it" in caplog.text
    assert "was being removed" in caplog.text
    with claim_shard(Run(dataset_shard="0/2"), ENV):  # the removal over, claims as ever
        pass
