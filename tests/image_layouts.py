"""Small OCI image layouts and docker archives written by the tests, entry by entry.

A layer is a list of ``Entry`` values, written as a gzip (or plain) tar exactly as given, so a
test can write what no well-behaved image builder would: absolute names, ``..``, symlinks
followed by writes through them, device nodes, whiteouts, bombs.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

import attrs

from trajcore.adapters.slot_server.image_checks import HOST_ARCHITECTURE

__all__ = ["Entry", "layer_bytes", "write_docker_archive", "write_layout"]


@attrs.frozen(kw_only=True)
class Entry:
    """One tar entry: ``kind`` is a tarfile type (``tarfile.REGTYPE`` ...)."""

    name: str
    data: bytes = b""
    kind: bytes = tarfile.REGTYPE
    link: str = ""
    mode: int = 0o644
    size: int | None = None  # a declared size other than len(data) (zeros are written)


def layer_bytes(entries: Sequence[Entry]) -> bytes:
    """The plain tar of ``entries``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = entry.kind
            info.mode = entry.mode
            info.linkname = entry.link
            if entry.kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
                info.devmajor, info.devminor = 1, 3
            if entry.kind == tarfile.REGTYPE:
                info.size = entry.size if entry.size is not None else len(entry.data)
                data = entry.data if entry.size is None else b"\0" * entry.size
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return out.getvalue()


def _blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return digest


def write_layout(
    layout: Path,
    layers: Sequence[Sequence[Entry]],
    *,
    tag: str = "latest",
    compress: bool = True,
    salt: str = "",
    architecture: str = HOST_ARCHITECTURE,
    env: Sequence[str] | None = None,
) -> str:
    """Write an OCI image layout of ``layers`` at ``layout``; the image's id (config sha256).

    ``salt`` goes into the config, so two layouts with the same layers get different ids;
    ``architecture`` is the one the config names (by default this host's).
    ``env``, when given, is the config's ``Env``.
    """
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    descriptors = []
    diff_ids = []
    for entries in layers:
        plain = layer_bytes(entries)
        diff_ids.append(f"sha256:{hashlib.sha256(plain).hexdigest()}")
        data = gzip.compress(plain, mtime=0) if compress else plain
        media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
        descriptors.append(
            {"mediaType": media, "digest": f"sha256:{_blob(layout, data)}", "size": len(data)}
        )
    config = json.dumps(
        {
            "architecture": architecture,
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "config": {"Labels": {"salt": salt}, **({} if env is None else {"Env": list(env)})},
        }
    ).encode()
    config_digest = _blob(layout, config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": f"sha256:{config_digest}",
                "size": len(config),
            },
            "layers": descriptors,
        }
    ).encode()
    manifest_digest = _blob(layout, manifest)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": f"sha256:{manifest_digest}",
                "size": len(manifest),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index))
    return config_digest


def write_docker_archive(archive: Path, layers: Sequence[Sequence[Entry]]) -> str:
    """Write what ``docker save`` writes (``manifest.json``, a config, ``<n>/layer.tar``)."""
    files: dict[str, bytes] = {}
    diff_ids = []
    names = []
    for number, entries in enumerate(layers):
        plain = layer_bytes(entries)
        diff_ids.append(f"sha256:{hashlib.sha256(plain).hexdigest()}")
        names.append(f"{number}/layer.tar")
        files[names[-1]] = plain
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    config_id = hashlib.sha256(config).hexdigest()
    files[f"{config_id}.json"] = config
    files["manifest.json"] = json.dumps(
        [{"Config": f"{config_id}.json", "RepoTags": ["test:latest"], "Layers": names}]
    ).encode()
    with tarfile.open(archive, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return config_id
