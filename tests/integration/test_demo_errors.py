"""``trajcore demo`` ends an error with its message and a status, never a traceback: no
``examples/`` (an installed wheel), or a model endpoint that does not answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from examples.shell_tasks import TASKS

from trajcore.entrypoints import demo


def test_without_the_examples_the_demo_says_to_run_it_from_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "_EXAMPLES", tmp_path)  # what an installed wheel has: none
    assert demo.main(["--out", str(tmp_path / "out")]) == 2
    assert "run it from a checkout: ./dev demo" in capsys.readouterr().err


def test_an_endpoint_that_does_not_answer_ends_the_demo_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "http://127.0.0.1:1/v1"  # nothing listens on port 1
    argv = ["--base-url", url, "--model-wait-s", "1", "--out", str(tmp_path), "--plain"]
    assert demo.main(argv) == 1
    printed = capsys.readouterr()
    err = printed.err
    assert "ModelEndpointUnavailable" in err
    assert url in err
    assert "Traceback" not in err
    assert (tmp_path / "trajectories.jsonl").read_text() == ""
    said = f"stopped by ModelEndpointUnavailable after 0 of {len(TASKS)} groups"  # one a task
    assert f"\n{said}\n" in printed.out
    page = (tmp_path / "report.html").read_text()
    assert f"<h1>trajcore demo: shell tasks: {said}</h1>" in page
    assert "error: ModelEndpointUnavailable: " in page
