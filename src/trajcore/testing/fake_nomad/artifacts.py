"""How the fake Nomad client fetches a task's artifacts before the task starts.

Nomad's ``artifact`` block (``Tasks[0].Artifacts``: ``GetterSource``, ``RelativeDest``,
``GetterMode``, ``GetterOptions``) has the client fetch each source with go-getter into the task
directory before the task's command runs. The fake fetches what can be had without a network:
a source that is an absolute path on this host or a ``file://`` URL, as go-getter's file getter
reads it:

- ``GetterMode`` ``file``: the source file is placed at ``RelativeDest``;
- ``dir``: a folder source is copied into ``RelativeDest``; an archive (``.tar``, ``.tar.gz``,
  ``.tgz``) is unpacked into it, unless ``GetterOptions.archive`` is ``false``;
- ``any`` (Nomad's default): a folder as ``dir``, an archive unpacked, a file placed in the
  folder ``RelativeDest`` under its own name.
- ``GetterOptions.checksum`` (``md5:``, ``sha1:``, ``sha256:``, ``sha512:`` then hex) is checked
  before anything is placed.

What Nomad refuses when the job is registered (``jobs.parse_artifacts``, a 400): no source, a
destination that leaves the task directory, an unknown mode, an option the fake does not know.
What fails on the client (``fetch_artifacts``, ``ArtifactError``): a source that is missing, a
URL the fake cannot fetch, a checksum mismatch; the agent then records Nomad's ``Failed Artifact
Download`` event and the task does not start (restarted, then failed, as any start that fails).
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

from trajcore.testing.fake_nomad.jobs import Artifact

__all__ = ["ArtifactError", "fetch_artifacts"]

_ARCHIVES = (".tar", ".tar.gz", ".tgz")
_HASHES = {"md5": "md5", "sha1": "sha1", "sha256": "sha256", "sha512": "sha512"}


class ArtifactError(Exception):
    """An artifact could not be fetched (the message is the event's)."""


def fetch_artifacts(artifacts: tuple[Artifact, ...], task_dir: Path) -> None:
    """Place every artifact in ``task_dir`` (blocking; a worker thread). Raises
    ``ArtifactError`` naming the source and the reason."""
    for artifact in artifacts:
        try:
            _fetch(artifact, task_dir)
        except OSError as error:
            raise ArtifactError(
                f"failed to download artifact {artifact.source!r}: {error}"
            ) from None


def _source_path(source: str) -> Path:
    if source.startswith("file://"):
        return Path(unquote(urlsplit(source).path))
    if source.startswith("/"):
        return Path(source)
    raise ArtifactError(
        f"failed to download artifact {source!r}: the fake Nomad fetches local files only "
        "(an absolute path or a file:// URL)"
    )


def _fetch(artifact: Artifact, task_dir: Path) -> None:
    source = _source_path(artifact.source)
    if not source.exists():
        raise ArtifactError(
            f"failed to download artifact {artifact.source!r}: source path error: stat "
            f"{source}: no such file or directory"
        )
    checksum = artifact.option("checksum")
    if checksum is not None:
        _check_sum(source, checksum, artifact.source)
    target = task_dir / artifact.destination
    unpack = artifact.option("archive") != "false" and source.name.endswith(_ARCHIVES)
    if artifact.mode == "file":
        if source.is_dir():
            raise ArtifactError(f"failed to download artifact {artifact.source!r}: is a folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    elif source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True, symlinks=True)
    elif unpack:
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(source) as archive:
            archive.extractall(target, filter="data")
    elif artifact.mode == "dir":
        raise ArtifactError(
            f"failed to download artifact {artifact.source!r}: mode dir needs a folder or an "
            "archive"
        )
    else:
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target / source.name)


def _check_sum(source: Path, checksum: str, named: str) -> None:
    kind, _, expected = checksum.partition(":")
    algorithm = _HASHES.get(kind)
    if algorithm is None or source.is_dir():
        raise ArtifactError(f"failed to download artifact {named!r}: unsupported checksum {kind!r}")
    digest = hashlib.new(algorithm)
    with source.open("rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected.lower():
        raise ArtifactError(
            f"failed to download artifact {named!r}: checksums did not match: expected "
            f"{expected}, got {digest.hexdigest()}"
        )
