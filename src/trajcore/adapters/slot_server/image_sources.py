"""Where an image's layers come from: OCI layouts and archives, docker archives, and the local
container engine's store.

Every reference ends as an ``ImageLayers``: the image's id (the sha256 of its config, which
names its content: the config lists the digest of every uncompressed layer) and its layers in
order, each with the digest it must have. The rules kept here:

- **JSON through the wire module.** ``index.json``, manifests and configs are structured with
  ``adapters.wire.structure``; a malformed one is a ``TaskEnvironmentError`` naming the image
  and the JSON path.
- **Blobs stay inside the layout.** A descriptor's digest must read ``sha256:<64 hex>``; the
  blob is taken from ``blobs/sha256/<hex>`` and must be a regular file there (no symlink).
- **Outer archives through tarfile's ``data`` filter**, the standard library's own refusal of
  absolute names, ``..``, links out and device nodes; the layers inside them go through
  ``image_unpack``'s stricter rules later.
- **Engines with a deadline.** ``podman`` and ``docker`` run with ``timeout_s``; an image the
  store does not hold is a ``TaskEnvironmentError`` quoting the engine's own words. A failure
  of the moment (an engine missing, past its deadline, failing its export; a full disk while an
  archive is copied out) is a ``SourceUnavailable``, which the cache never remembers as the
  image's refusal.
- **One platform.** An image index is resolved to the host's ``linux/<arch>`` manifest; a tag
  picks among several images of one layout (``org.opencontainers.image.ref.name``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO

import attrs

from trajcore.adapters.slot_server.image_refusals import SourceUnavailable
from trajcore.adapters.slot_server.image_unpack import Layer
from trajcore.adapters.wire import structure
from trajcore.domain.errors import WireError
from trajcore.domain.task_environments import EnvironmentRef, TaskEnvironmentError

__all__ = [
    "ENV_MAX_BYTES",
    "ENV_MAX_VARIABLES",
    "EngineExport",
    "ImageConfig",
    "ImageLayers",
    "engine_image",
    "exported",
    "image_env",
    "read_image",
]

# What the files of an image archive (its layout or docker save's) may add up to: the same bound
# as an image's unpacked files (``ImageLimits.max_bytes``' default), since layers are stored
# uncompressed in the worst case.
ARCHIVE_MAX_BYTES = 8 << 30
_COPY_CHUNK = 1 << 20
# What an image's ``Env`` may hold: every lease over the image carries it to its keeper in one
# request (the keeper's REQUEST_MAX is 96 KiB, layers' paths included).
ENV_MAX_VARIABLES = 1000
ENV_MAX_BYTES = 64 << 10

_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_INDEX_TYPES = frozenset(
    {
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    }
)
_ARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "armv7l": "arm",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
}
# an engine's names of a machine that differ from the image config's (``GOARCH``) names
_ENGINE_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
_REF_NAME = "org.opencontainers.image.ref.name"
# what a copy's ``OSError`` says of the machine at the moment, not of the archive
_MOMENTARY = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EMFILE, errno.ENFILE})


@attrs.frozen(kw_only=True)
class _Platform:
    architecture: str = ""
    os: str = ""


@attrs.frozen(kw_only=True)
class _Descriptor:
    mediaType: str  # noqa: N815  # the OCI field's name
    digest: str
    size: int = 0
    annotations: dict[str, str] = attrs.Factory(dict)
    platform: _Platform | None = None


@attrs.frozen(kw_only=True)
class _Index:
    manifests: list[_Descriptor]


@attrs.frozen(kw_only=True)
class _Manifest:
    config: _Descriptor
    layers: list[_Descriptor]


@attrs.frozen(kw_only=True)
class _DockerArchiveImage:
    Config: str  # docker save's field name
    Layers: list[str]
    RepoTags: list[str] | None = None


@attrs.frozen(kw_only=True)
class _RootFs:
    diff_ids: list[str]


@attrs.frozen(kw_only=True)
class _RunConfig:
    Env: list[str] | None = None  # the OCI config's field names
    WorkingDir: str | None = None
    User: str | None = None


@attrs.frozen(kw_only=True)
class _Config:
    rootfs: _RootFs
    architecture: str = ""
    config: _RunConfig | None = None


@attrs.frozen(kw_only=True)
class _RunOnly:
    """An image config read for its run settings alone (a layout's: its layers are the
    manifest's)."""

    architecture: str = ""
    config: _RunConfig | None = None


@attrs.frozen(kw_only=True)
class ImageConfig:
    """What an image's config says about running it, as recorded in the cache.

    Attributes:
        env: its ``Env``, ``NAME=VALUE`` each, in order (checked by ``image_env``).
        working_dir: its ``WorkingDir`` ("" when unset): recorded, not applied (a lease starts
            in its workspace).
        user: its ``User`` ("" when unset): recorded, not applied (a lease runs as its slot's
            uid).
    """

    env: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""


@attrs.frozen(kw_only=True)
class EngineExport:
    """An image of an engine's store, read as the engine's own flattened export of it (one
    tar, no whiteouts): ``podman create`` + ``podman export``, or docker's same two commands."""

    image_id: str
    engine: str
    name: str
    config: ImageConfig = ImageConfig()
    architecture: str = ""


@attrs.frozen(kw_only=True)
class ImageLayers:
    """An image ready to unpack: its id (config sha256, hex) and its layers, lowest first;
    ``architecture``: the one its config names (``""``: none); ``config``: how to run it."""

    image_id: str
    layers: tuple[Layer, ...]
    architecture: str = ""
    config: ImageConfig = ImageConfig()


def _open_regular(path: Path, field: str) -> IO[bytes]:
    """``path`` opened for reading, once it is known to be a regular file: opened without
    blocking first, so that a FIFO (or a device) is refused naming ``field`` at once instead of
    holding the server's thread on ``open`` for ever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TaskEnvironmentError(field, f"{path} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _load(path: Path, cls: type[object], image: str) -> object:
    field = f"{image}: {path.name}"
    try:
        with _open_regular(path, field) as source:
            data = json.loads(source.read())
    except FileNotFoundError as error:
        raise TaskEnvironmentError(field, "is missing") from error
    except (OSError, ValueError) as error:
        raise TaskEnvironmentError(field, f"cannot be read as JSON: {error}") from error
    try:
        return structure(data, cls)
    except WireError as error:
        raise TaskEnvironmentError(f"{field} {error.field}", error.reason) from error


def image_env(entries: list[str] | None, image: str) -> tuple[str, ...]:
    """An image config's ``Env``, checked: each entry ``NAME=VALUE`` with a name of its own (no
    NUL anywhere, no ``=`` in the name), at most ``ENV_MAX_VARIABLES`` entries and
    ``ENV_MAX_BYTES`` in all.

    Raises:
        TaskEnvironmentError: naming the image and the entry.
    """
    found = tuple(entries or ())
    field = f"{image}: config Env"
    if len(found) > ENV_MAX_VARIABLES:
        raise TaskEnvironmentError(
            field, f"sets {len(found)} variables, more than the {ENV_MAX_VARIABLES} allowed"
        )
    size = sum(len(entry.encode("utf-8", "surrogateescape")) + 1 for entry in found)
    if size > ENV_MAX_BYTES:
        raise TaskEnvironmentError(
            field, f"holds {size} bytes, more than the {ENV_MAX_BYTES} allowed"
        )
    for number, entry in enumerate(found):
        name, equals, _value = entry.partition("=")
        if "\0" in entry:
            raise TaskEnvironmentError(f"{field}[{number}]", "holds a NUL character")
        if not equals or not name:
            raise TaskEnvironmentError(
                f"{field}[{number}]", f"{entry[:80]!r} does not read NAME=VALUE"
            )
    return found


def _run_config(found: _RunConfig | None, image: str) -> ImageConfig:
    if found is None:
        return ImageConfig()
    return ImageConfig(
        env=image_env(found.Env, image),
        working_dir=found.WorkingDir or "",
        user=found.User or "",
    )


def _blob(layout: Path, digest: str, image: str) -> tuple[Path, str]:
    match = _DIGEST.match(digest)
    if match is None:
        raise TaskEnvironmentError(
            f"{image}: digest {digest!r}", "must read sha256:<64 hex digits>"
        )
    path = layout / "blobs" / "sha256" / match[1]
    try:
        info = os.lstat(path)
    except FileNotFoundError as error:
        raise TaskEnvironmentError(
            f"{image}: blob {digest}", "is missing from the layout"
        ) from error
    if not stat.S_ISREG(info.st_mode):
        raise TaskEnvironmentError(f"{image}: blob {digest}", "is not a regular file")
    return path, match[1]


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _pick(index: _Index, tag: str | None, image: str) -> _Descriptor:
    manifests = index.manifests
    if tag is not None:
        named = [
            m
            for m in manifests
            if m.annotations.get(_REF_NAME) == tag
            or m.annotations.get(_REF_NAME, "").endswith(f":{tag}")
        ]
        if not named:
            found = sorted({m.annotations.get(_REF_NAME, "(unnamed)") for m in manifests})
            raise TaskEnvironmentError(
                f"{image}: tag", f"{tag!r} is not in the layout (it holds {found})"
            )
        manifests = named
    if len(manifests) == 1:
        return manifests[0]
    if not manifests:
        raise TaskEnvironmentError(f"{image}: index.json", "lists no image")
    arch = _ARCH.get(platform.machine(), platform.machine())
    fitting = [
        m
        for m in manifests
        if m.platform is not None and (m.platform.os, m.platform.architecture) == ("linux", arch)
    ]
    if len(fitting) == 1:
        return fitting[0]
    names = sorted({m.annotations.get(_REF_NAME, m.digest) for m in manifests})
    raise TaskEnvironmentError(
        f"{image}: index.json", f"holds several images {names}: name one with :TAG"
    )


def _read_layout(layout: Path, tag: str | None, image: str) -> ImageLayers:
    index = _load(layout / "index.json", _Index, image)
    assert isinstance(index, _Index)
    chosen = _pick(index, tag, image)
    for _ in range(4):  # an index of indexes, as registries nest them, at most this deep
        if chosen.mediaType not in _INDEX_TYPES:
            break
        path, _hex = _blob(layout, chosen.digest, image)
        nested = _load(path, _Index, image)
        assert isinstance(nested, _Index)
        chosen = _pick(nested, None, image)
    path, _hex = _blob(layout, chosen.digest, image)
    manifest = _load(path, _Manifest, image)
    assert isinstance(manifest, _Manifest)
    config_path, image_id = _blob(layout, manifest.config.digest, image)
    run = _load(config_path, _RunOnly, image)
    assert isinstance(run, _RunOnly)
    layers = []
    for descriptor in manifest.layers:
        blob, hex_digest = _blob(layout, descriptor.digest, image)
        layers.append(Layer(path=blob, media_type=descriptor.mediaType, sha256=hex_digest))
    return ImageLayers(
        image_id=image_id,
        layers=tuple(layers),
        architecture=run.architecture,
        config=_run_config(run.config, image),
    )


def _read_docker_archive(root: Path, image: str) -> ImageLayers:
    if (root / "oci-layout").is_file() and (root / "index.json").is_file():
        return _read_layout(root, None, image)
    entries = _load(root / "manifest.json", list[_DockerArchiveImage], image)
    assert isinstance(entries, list)
    if len(entries) != 1:
        raise TaskEnvironmentError(
            f"{image}: manifest.json", f"holds {len(entries)} images; one is needed"
        )
    entry: _DockerArchiveImage = entries[0]
    config_path = root / entry.Config
    config = _load(config_path, _Config, image)
    assert isinstance(config, _Config)
    if len(config.rootfs.diff_ids) != len(entry.Layers):
        raise TaskEnvironmentError(
            f"{image}: {entry.Config}", "lists another number of layers than manifest.json"
        )
    layers = []
    for name, diff_id in zip(entry.Layers, config.rootfs.diff_ids, strict=True):
        match = _DIGEST.match(diff_id)
        if match is None or name.startswith("/") or ".." in name.split("/"):
            raise TaskEnvironmentError(f"{image}: layer {name!r}", "has a bad path or digest")
        layers.append(Layer(path=root / name, media_type="application/x-tar", sha256=match[1]))
    return ImageLayers(
        image_id=_file_sha256(config_path),
        layers=tuple(layers),
        architecture=config.architecture,
        config=_run_config(config.config, image),
    )


def _extract_archive(
    archive: Path, into: Path, image: str, *, max_bytes: int = ARCHIVE_MAX_BYTES
) -> None:
    """The files of an image archive (an OCI layout, or what ``docker save`` writes) under
    ``into``.

    Such an archive holds directories, regular files and symlinks among them (podman's
    ``docker save`` links each ``layer.tar`` to its blob): any other member (a hard link, a
    device, a FIFO), a name that would land outside ``into`` (absolute, ``..``, NUL), a member
    written through a symlink, a symlink that resolves outside ``into`` once everything is
    unpacked, a name given twice, or more than ``max_bytes`` of files is refused naming the
    member, and only the image fails. Written here rather than with tarfile's extraction
    filters, which the Python 3.11 of older images (before 3.11.4) does not have.
    """
    written = 0
    links: list[tuple[Path, str]] = []
    try:
        with (
            _open_regular(archive, image) as raw,
            tarfile.open(fileobj=raw, mode="r:*") as tar,
        ):
            for member in tar:
                where = f"{archive} member {member.name!r}"
                parts = PurePosixPath(member.name).parts
                if member.name.startswith("/") or ".." in parts or "\0" in member.name:
                    raise TaskEnvironmentError(image, f"{where}: names a place outside it")
                if any(into.joinpath(*parts[:n]).is_symlink() for n in range(1, len(parts))):
                    raise TaskEnvironmentError(image, f"{where}: lies below a symlink")
                target = into.joinpath(*parts) if parts else into
                if member.issym() and parts and "\0" not in member.linkname:
                    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    os.symlink(member.linkname, target)
                    links.append((target, where))
                    continue
                if member.isdir():
                    target.mkdir(mode=0o700, parents=True, exist_ok=True)
                    continue
                if not member.isfile():
                    kinds = "files, directories and symlinks"
                    raise TaskEnvironmentError(image, f"{where}: an archive holds only {kinds}")
                written += member.size
                if written > max_bytes:
                    raise TaskEnvironmentError(
                        image, f"{where}: the archive's files pass {max_bytes} bytes"
                    )
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None  # a regular file's member always has data
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                with source, os.fdopen(os.open(target, flags, 0o600), "wb") as out:
                    shutil.copyfileobj(source, out, _COPY_CHUNK)
        inside = os.path.realpath(into)
        for link, where in links:
            resolved = os.path.realpath(link)
            if os.path.commonpath([inside, resolved]) != inside:
                raise TaskEnvironmentError(image, f"{where}: a symlink that leads outside it")
    except FileNotFoundError as error:
        raise TaskEnvironmentError(image, f"{archive} does not exist") from error
    except FileExistsError as error:
        raise TaskEnvironmentError(
            image, f"{archive} cannot be unpacked: it names {error.filename} twice"
        ) from error
    except OSError as error:
        if error.errno in _MOMENTARY:  # the staging's disk, not the archive
            raise SourceUnavailable(image, f"{archive} cannot be copied out: {error}") from error
        raise TaskEnvironmentError(image, f"{archive} cannot be unpacked: {error}") from error
    except tarfile.TarError as error:
        raise TaskEnvironmentError(image, f"{archive} cannot be unpacked: {error}") from error


def _engine(command: list[str], image: str, timeout_s: float) -> str:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError as error:
        raise SourceUnavailable(image, f"{command[0]} is not installed") from error
    except subprocess.TimeoutExpired as error:
        raise SourceUnavailable(
            image, f"`{' '.join(command)}` took longer than {timeout_s} s"
        ) from error
    if done.returncode != 0:
        words = (done.stderr.strip() or done.stdout.strip())[-400:]
        raise TaskEnvironmentError(image, f"{command[0]} answered: {words}")
    return done.stdout


def engine_image(ref: EnvironmentRef, *, timeout_s: float) -> EngineExport:
    """An image of podman's or docker's store: its id (config sha256, hex), what its config
    says about running it, and its architecture (``""``: the engine names none).

    Raises:
        TaskEnvironmentError: the store does not hold it, or it is built for another machine
            or system than this host's (its ``Architecture`` or ``Os``): named before anything
            is exported.
    """
    program = "podman" if ref.transport == "containers-storage" else "docker"
    shape = "\t".join(("{{.Id}}", "{{json .Architecture}}", "{{json .Os}}", "{{json .Config}}"))
    out = _engine(
        [program, "image", "inspect", "--format", shape, ref.location], str(ref), timeout_s
    )
    first, *rest = out.strip().split("\t", 3)  # JSON text holds no raw tab
    found = first.strip().removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{64}", found):
        raise TaskEnvironmentError(str(ref), f"{program} gave no image id: {found[:80]!r}")
    try:  # a field the engine leaves out (an older one) is absent: "" or no config
        architecture, system, config = (
            json.loads(part or "null") for part in [*rest, "", "", ""][:3]
        )
        architecture, system = architecture or "", system or ""
        run = structure({"config": config}, _RunOnly)
        if not isinstance(architecture, str) or not isinstance(system, str):
            raise ValueError(f"Architecture {architecture!r} and Os {system!r} are not text")
    except (ValueError, WireError) as error:
        raise TaskEnvironmentError(
            f"{ref}: config", f"{program} gave no readable config: {error}"
        ) from error
    assert isinstance(run, _RunOnly)
    architecture = _ENGINE_ARCH.get(architecture, architecture)
    _refuse_foreign(str(ref), architecture, system)
    engine = "podman" if ref.transport == "containers-storage" else "docker"
    return EngineExport(
        image_id=found, engine=engine, name=ref.location,
        config=_run_config(run.config, str(ref)), architecture=architecture,
    )  # fmt: skip


def _refuse_foreign(image: str, architecture: str, system: str) -> None:
    """``TaskEnvironmentError`` naming the field, its value and the host's, when an image's
    ``Architecture`` or ``Os`` (each where given) is not this host's."""
    host = _ARCH.get(platform.machine(), platform.machine())
    if architecture and architecture != host:
        raise TaskEnvironmentError(
            f"{image}: Architecture",
            f"image {image} is built for {architecture} (its config's Architecture), this "
            f"host runs {host}: no command could run over it",
        )
    if system and system != "linux":
        raise TaskEnvironmentError(
            f"{image}: Os",
            f"image {image} is built for {system} (its config's Os), this host runs linux: "
            "no command could run over it",
        )


def read_image(
    ref: EnvironmentRef, staging: Path, *, timeout_s: float, known: Callable[[str], bool]
) -> ImageLayers | EngineExport | str:
    """The layers of ``ref``, staged under ``staging`` where they must be copied out first.

    An engine's image is returned as an ``EngineExport`` to stream with ``exported``, or, when
    ``known`` says the cache holds its id already, as that id, with nothing exported.

    Raises:
        TaskEnvironmentError: the image is missing or malformed, naming ``ref`` and the fault.
    """
    image = str(ref)
    if ref.transport == "oci":
        layout = Path(ref.location)
        if not layout.is_dir():
            raise TaskEnvironmentError(image, f"{layout} is not a directory")
        return _read_layout(layout, ref.tag, image)
    if ref.transport in ("oci-archive", "docker-archive"):
        _extract_archive(Path(ref.location), staging, image)
        if ref.transport == "oci-archive":
            return _read_layout(staging, ref.tag, image)
        return _read_docker_archive(staging, image)
    if ref.transport in ("containers-storage", "docker-daemon"):
        export = engine_image(ref, timeout_s=timeout_s)
        return export.image_id if known(export.image_id) else export
    raise TaskEnvironmentError(image, "is a directory: it is used in place, not read as layers")


@contextlib.contextmanager
def exported(
    export: EngineExport,
    *,
    timeout_s: float,
    container: str | None = None,
    label: str = "",
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> Iterator[IO[bytes]]:
    """The engine's flattened export of ``export`` as a stream, within ``timeout_s`` in all.

    The container made for it (named ``container`` where given, labelled ``label``) is removed
    on the way out, whatever happened; one left by a process killed meanwhile is the image
    cache's to remove (``ImageCache`` names it and records it in its staging). ``on_start`` is
    given the export's process as soon as it runs (the cache's close kills it by its pid).

    Raises:
        SourceUnavailable: the engine failed (its words quoted), passed the deadline, was
            ended, or gave a stream that is not a whole tar (cut short).
        TaskEnvironmentError: the stream's reader refused what the image holds.
    """
    image = f"{export.engine}:{export.name}"
    program = [export.engine, "--runtime", "runc"] if export.engine == "podman" else [export.engine]
    naming = [] if container is None else ["--name", container]
    naming += [] if not label else ["--label", label]
    try:
        created = _engine(
            [*program, "create", *naming, export.name, "/bin/true"], image, timeout_s
        ).strip()
    except TaskEnvironmentError as error:
        if container is not None:  # a create cut short may have made it all the same
            _remove(program, container, timeout_s)
        raise SourceUnavailable(error.field, error.reason) from error
    try:
        process = subprocess.Popen(
            [*program, "export", created], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        if on_start is not None:
            on_start(process)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            process.kill()

        watchdog = threading.Timer(timeout_s, expire)
        watchdog.start()
        try:
            assert process.stdout is not None
            yield process.stdout
            process.stdout.read()
            _, stderr = process.communicate(timeout=timeout_s)
        except (TaskEnvironmentError, OSError, subprocess.TimeoutExpired) as error:
            if expired.is_set() or isinstance(error, subprocess.TimeoutExpired):
                # the stream was cut by the deadline: what its reader found says nothing
                raise SourceUnavailable(
                    image, f"{export.engine} export took longer than {timeout_s} s"
                ) from error
            if (process.poll() or 0) < 0:  # killed (the cache's close): the stream was cut
                raise SourceUnavailable(image, f"{export.engine} export was ended") from error
            if isinstance(error, TaskEnvironmentError) and isinstance(
                error.__cause__, tarfile.TarError
            ):  # the engine writes the tar, not the image: one cut short (podman exits 0 on
                # SIGTERM mid-way) or unreadable says nothing of the image
                raise SourceUnavailable(
                    image, f"{export.engine} export gave no whole tar stream: {error.reason}"
                ) from error
            raise
        finally:
            watchdog.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
            for pipe in (process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()
        if process.returncode != 0:
            words = stderr.decode("utf-8", "replace").strip()[-400:] or f"exit {process.returncode}"
            raise SourceUnavailable(image, f"{export.engine} export failed: {words}")
    finally:
        _remove(program, created, timeout_s)


def _remove(program: list[str], container: str, timeout_s: float) -> None:
    """``rm -f`` the export's ``container``, best effort: an engine that fails or does not
    answer leaves it (to the image cache's sweep, where it is named) and raises nothing, so
    the export's own error stands."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            [*program, "rm", "-f", container], capture_output=True, timeout=timeout_s, check=False
        )
