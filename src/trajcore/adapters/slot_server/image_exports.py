"""The engine exports an image cache runs: each recorded in its ``staging/`` while it runs,
ended by the cache's close, and its container removed by the next open when its owner died.

An image of podman's or docker's store is read as the engine's export of a container made
for it (``image_sources.exported``). The rules kept here:

- **Recorded while it runs.** ``staging/export-<token>-<n>`` names the engine and the
  container (``trajcore-export-<token>-<n>``) from before the container is made until it is
  removed, so a sweep (``remove_container``) removes a dead owner's container.
- **Ended on close.** ``RunningExports.end`` (the slot server's SIGTERM, through its
  runtime's close) kills each export's process by its pid, removes its container with the
  engine and waits for the unpacking that read it to remove its staging tree, all within one
  deadline; what is still left then is returned, to be logged, and is the next open's to
  remove. An export started after the end is refused (``SourceUnavailable``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

from trajcore.adapters.slot_server.image_refusals import SourceUnavailable

__all__ = ["ExportRun", "RunningExports", "remove_container"]

_POLL_S = 0.02
_log = logging.getLogger(__name__)


def _program(engine: str) -> list[str]:
    return [engine, "--runtime", "runc"] if engine == "podman" else [engine]


@attrs.define
class ExportRun:
    """One export: its engine, its container's name, its staging tree and, once started, its
    process (``started``)."""

    engine: str
    container: str
    staged: Path
    process: subprocess.Popen[bytes] | None = None
    ended: bool = False

    def started(self, process: subprocess.Popen[bytes]) -> None:
        """Note the export's process (``image_sources.exported``'s ``on_start``); one started
        after the end is killed at once."""
        self.process = process
        if self.ended:
            process.kill()


class RunningExports:
    """The exports one cache runs now (see the module's rules); safe to use from several
    threads (a cache's requests run in worker threads)."""

    def __init__(self, staging: Path, token: str) -> None:
        self.staging = staging
        self.token = token
        self._lock = threading.Lock()
        self._runs: list[ExportRun] = []
        self._ended = False

    @contextlib.contextmanager
    def record(self, engine: str, staged: Path) -> Iterator[ExportRun]:
        """An export of ``engine`` unpacking into ``staged``, recorded in ``staging/`` (the
        engine and the container's name) and held here for as long as it runs.

        Raises:
            SourceUnavailable: the exports were ended (the server is stopping).
        """
        fd, made = tempfile.mkstemp(dir=self.staging, prefix=f"export-{self.token}-")
        container = f"trajcore-export-{Path(made).name.removeprefix('export-')}"
        run = ExportRun(engine=engine, container=container, staged=staged)
        try:
            with os.fdopen(fd, "w") as record:
                json.dump({"engine": engine, "container": container}, record)
            with self._lock:
                if self._ended:
                    raise SourceUnavailable(engine, "the image cache is closing: no new export")
                self._runs.append(run)
            try:
                yield run
            finally:
                with self._lock:
                    self._runs.remove(run)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(made)

    def end(self, timeout_s: float) -> list[str]:
        """End every running export within ``timeout_s``: kill its process, remove its
        container, wait for its staging tree to go. Returns what is still left (its container
        or staging tree, in words); later exports are refused. Idempotent."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._ended = True
            runs = list(self._runs)
        for run in runs:
            run.ended = True
            if run.process is not None and run.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    run.process.kill()  # by its pid; the reading thread then sees the end
        left: list[str] = []
        for run in runs:
            spare = deadline - time.monotonic()
            try:
                if spare <= 0:
                    raise subprocess.TimeoutExpired("rm", timeout_s)
                subprocess.run(
                    [*_program(run.engine), "rm", "-f", run.container],
                    capture_output=True, timeout=spare, check=False,
                )  # fmt: skip
            except (OSError, subprocess.TimeoutExpired) as error:
                left.append(f"container {run.container} ({error})")
        for run in runs:
            while run.staged.exists() and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            if run.staged.exists():
                left.append(f"staging tree {run.staged}")
        return left


def remove_container(record: Path, timeout_s: float) -> bool:
    """Remove the container a dead owner's export made (its record names it), within
    ``timeout_s``. True when the engine ran (the container is gone, or was never made);
    False when it could not be run or did not answer in time (logged): the record stays for
    the next open."""
    try:
        found = json.loads(record.read_text())
        engine, container = str(found["engine"]), str(found["container"])
    except (OSError, ValueError, KeyError, TypeError):
        return True  # written only partly: the owner died before its container was made
    if engine not in ("podman", "docker") or not container.startswith("trajcore-export-"):
        return True
    try:
        subprocess.run(
            [*_program(engine), "rm", "-f", container],
            capture_output=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        _log.warning("cannot remove a dead export's container %s: %s", container, error)
        return False
    return True
