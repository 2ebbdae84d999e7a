"""Publish a model version atomically: validate in another process, copy, fsync, rename.

A reader of the repository (a worker, the master's watcher) sees either no new version or the
whole of it: the copy is written into a hidden directory beside its target and appears under
its version number only by rename. No TensorFlow in this module: validation runs
`python -m server.cli.validate` in a child process, so a trainer can call `publish()` too.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import socket
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

from server.cli.permissions import RepositoryAccess, tree
from server.cli.validate import ValidationFailed, model_settings, run_in_child
from server.models.handlers import has_handler
from server.repository import (
    HDF5_SUFFIXES,
    KERAS_SUFFIXES,
    detect_format,
    is_model_name,
    parse_version,
    scan_model,
)
from server.settings import conf_path_from_env

LOCK_NAME = ".publish.lock"
STAGING_PREFIX = ".publish-"
# `.publish-<pid>@<host>-<random>`: who is copying into it, so a later publish can tell a dead one's.
STAGING_RE = re.compile(r"\.publish-(?P<pid>[0-9]+)@(?P<host>.+)-[a-z0-9_]+")

log = logging.getLogger("forkserve.publish")


class PublishError(Exception):
    """The source cannot be published; nothing was left in the repository."""


def source_kind(source: Path) -> str:
    """'file' for a .keras/.h5/.hdf5 file; 'directory' for a version directory to copy whole.

    A directory holds a SavedModel (saved_model.pb) or exactly one .keras/.h5/.hdf5 file, with
    whatever else the version needs beside it (handler.py and the files it reads).
    """
    if not source.exists():
        raise PublishError(f"{source}: no such file or directory")
    if source.is_file() and source.suffix.lower() in KERAS_SUFFIXES + HDF5_SUFFIXES:
        return "file"
    if source.is_dir():
        fmt, problem = detect_format(source)
        if fmt:
            return "directory"
        raise PublishError(f"{source}: {problem}")
    raise PublishError(f"{source}: not a .keras, .h5 or .hdf5 file, nor a directory holding a model")


def default_conf() -> Path:
    """The file the server reads its per-model settings from: $FORKSERVE_CONF, else conf/models.toml."""
    return conf_path_from_env()


def request_shape_change(model_dir: Path, source: Path, kind: str) -> str:
    """Why `source` would answer another request shape than the model's newest version, or ''.

    A handler.py decides the request and response shape: a version with one and a version without
    speak to different clients, and the newest version is what `/v1/models/NAME:predict` serves.
    """
    newest = next((v for v in scan_model(model_dir.parent, model_dir.name) if v.format), None)
    if newest is None:
        return ""
    served, new = has_handler(newest.path), kind == "directory" and has_handler(source)
    if served == new:
        return ""
    if served:
        return (
            f"version {newest.version} of {model_dir.name} has a handler.py and {source.name} has none: its clients "
            f"(the handler's request shape) would get 400 once it is served; publish a directory with the model "
            f"and its handler.py (a copy of {newest.path} with the new model file), or pass --change-request-shape"
        )
    return (
        f"{source.name} has a handler.py and version {newest.version} of {model_dir.name} has none: its clients "
        f"(TensorFlow Serving's request shape) would get 400 once it is served; pass --change-request-shape if "
        f"they change too"
    )


def _fsync(path: Path) -> None:
    """Flush a file or a directory entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(source: Path, target: Path) -> None:
    """Copy a file or a tree (its contents, not its modes: `RepositoryAccess.apply` sets those)."""
    if source.is_file():
        shutil.copyfile(source, target)
    else:
        shutil.copytree(source, target, dirs_exist_ok=True, copy_function=shutil.copyfile)


@contextmanager
def _locked(model_dir: Path) -> Iterator[None]:
    """One publisher at a time per model (the version number is chosen under the lock)."""
    with open(model_dir / LOCK_NAME, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def next_version(model_dir: Path) -> int:
    """One more than the highest version present (1 for a new model)."""
    try:
        entries = list(model_dir.iterdir())
    except FileNotFoundError:
        return 1
    versions = [v for v in (parse_version(p.name) for p in entries) if v is not None]
    return max(versions, default=0) + 1


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def remove_stale_staging(model_dir: Path) -> list[str]:
    """Remove the staging directories of publishers on this host that are gone (a SIGKILL mid-copy).

    NOTE: only this host's: a pid says nothing about a publisher on another machine sharing the
    repository (NFS, a Kubernetes volume), whose staging directory is left alone.
    """
    host, removed = socket.gethostname(), []
    for entry in model_dir.iterdir():
        match = STAGING_RE.fullmatch(entry.name)
        if match and match["host"] == host and not _running(int(match["pid"])):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


def _staging_dir(model_dir: Path) -> Path:
    """A hidden directory beside the versions (never scanned), named after this publisher."""
    return Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}@{socket.gethostname()}-", dir=model_dir))


def _reason(exc: OSError, doing: str) -> str:
    """One line for an OSError: what publish was doing and why it failed."""
    what = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        what += ", the repository's file system is full"
    written = exc.filename2 or exc.filename  # a copy's error names the source first, then what it wrote
    where = f" ({written})" if written else ""
    return f"{doing}: {what}{where}"


def _model_dir(models_dir: Path, name: str, access: RepositoryAccess) -> tuple[Path, bool]:
    """The model's directory and whether this call made it; a new one gets the repository's group and modes."""
    model_dir = models_dir / name
    try:
        model_dir.mkdir()
    except FileExistsError:
        return model_dir, False
    access.apply(model_dir)
    return model_dir, True


@contextmanager
def _removed_on_failure(staging: Path, doing: str) -> Iterator[None]:
    """Remove `staging` when the block fails; an OSError becomes one line saying what publish was doing."""
    try:
        yield
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):
            raise PublishError(_reason(exc, doing)) from None
        raise


def _stage(source: Path, kind: str, model_dir: Path, access: RepositoryAccess) -> Path:
    """Copy `source` into a staging directory readable by the repository's readers, fsynced."""
    try:
        staging = _staging_dir(model_dir)
    except OSError as exc:
        raise PublishError(_reason(exc, f"creating a staging directory in {model_dir}")) from None
    with _removed_on_failure(staging, f"copying {source} into {model_dir}"):
        _copy(source, staging / ("model" + source.suffix.lower()) if kind == "file" else staging)
        access.apply(staging)
        shown = [(p, str(p.relative_to(staging)) if p != staging else "the version directory") for p in tree(staging)]
        problem = access.unreadable([(model_dir, str(model_dir)), *shown])
        if problem:
            raise PublishError(f"the server could not read the published version: {problem}")
        for path in reversed(list(tree(staging))):  # files first, each directory after its entries
            _fsync(path)
    return staging


def _stage_and_rename(source: Path, kind: str, model_dir: Path, access: RepositoryAccess) -> int:
    """Stage `source` in `model_dir` and rename it to the next version under the lock; that version."""
    staging = _stage(source, kind, model_dir, access)
    with _removed_on_failure(staging, f"renaming into {model_dir}"), _locked(model_dir):
        for stale in remove_stale_staging(model_dir):
            log.info("removed %s, left by a publisher that is gone", model_dir / stale)
        version = next_version(model_dir)
        os.rename(staging, model_dir / str(version))
    return version


def publish(
    name: str,
    source: Path | str,
    models_dir: Path | str,
    check: bool = True,
    conf: Path | str | None = None,
    change_request_shape: bool = False,
) -> int:
    """Publish `source` as the next version of model `name`; returns the version number.

    `conf` is the server's per-model settings file (default: $FORKSERVE_CONF, else
    conf/models.toml): the version is validated with the settings the server will apply.
    """
    source, models_dir = Path(source).resolve(), Path(models_dir).resolve()
    conf = Path(conf).resolve() if conf is not None else default_conf()
    if not is_model_name(name):
        raise PublishError(f"invalid model name {name!r}: letters, digits, '_', '.', '-', not all digits")
    kind = source_kind(source)
    shape_change = request_shape_change(models_dir / name, source, kind)
    if shape_change and not change_request_shape:
        raise PublishError(shape_change)
    if check:
        try:
            verdict = run_in_child(source, name, model_settings(name, conf), next_version(models_dir / name), conf)
        except ValidationFailed as exc:
            raise PublishError(str(exc)) from None
        for warning in verdict["warnings"]:
            log.warning("warning: %s", warning)
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        access = RepositoryAccess.of(models_dir)
        model_dir, created = _model_dir(models_dir, name, access)
    except OSError as exc:
        raise PublishError(_reason(exc, f"creating {models_dir / name}")) from None
    try:
        version = _stage_and_rename(source, kind, model_dir, access)
    except BaseException:
        if created:  # a first publish that failed before its lock leaves no empty model directory behind
            with suppress(OSError):
                model_dir.rmdir()  # NOTE: only empty: never another publisher's staging directory or lock
        raise
    try:
        _fsync(model_dir)
    except OSError as exc:  # NOTE: the rename happened: the version IS published and may be served already
        log.warning("warning: version %d is published, but flushing %s to disk failed (%s): "
                    "it may not survive a crash of this machine before the next sync", version, model_dir, exc.strerror or exc)
    return version
