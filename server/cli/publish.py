"""Publish a model version atomically: validate in another process, copy, fsync, rename.

A reader of the repository (a worker, the master's watcher) sees either no new version or the
whole of it: the copy is written into a hidden directory beside its target and appears under
its version number only by rename. No TensorFlow in this module: validation runs
`python -m server.cli.validate` in a child process, so a trainer can call `publish()` too.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from server.repository import (
    HDF5_SUFFIXES,
    KERAS_SUFFIXES,
    detect_format,
    is_model_name,
    parse_version,
)

LOCK_NAME = ".publish.lock"


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


def validate(source: Path, timeout: float = 600.0) -> None:
    """Load (safe_mode) and warm the model in a child process; raise PublishError with its reason."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "server.cli.validate", str(source)],
            capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )
    except subprocess.TimeoutExpired:
        raise PublishError(f"{source}: validation did not finish within {timeout:.0f}s") from None
    if result.returncode != 0:
        lines = [line for line in result.stderr.strip().splitlines() if line.startswith("invalid model:")]
        reason = lines[-1] if lines else (result.stderr.strip().splitlines() or ["validation crashed"])[-1]
        raise PublishError(f"{source}: {reason}")


def _fsync(path: Path) -> None:
    """Flush a file or a directory entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_synced(source: Path, target: Path) -> None:
    """Copy a file or a tree and fsync every file and directory written."""
    if source.is_file():
        shutil.copy2(source, target)
        _fsync(target)
        return
    shutil.copytree(source, target, dirs_exist_ok=True)
    for directory, _, files in os.walk(target):
        for name in files:
            _fsync(Path(directory) / name)
        _fsync(Path(directory))


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
    versions = [v for v in (parse_version(p.name) for p in model_dir.iterdir()) if v is not None]
    return max(versions, default=0) + 1


def publish(name: str, source: Path | str, models_dir: Path | str, check: bool = True) -> int:
    """Publish `source` as the next version of model `name`; returns the version number."""
    source, models_dir = Path(source).resolve(), Path(models_dir).resolve()
    if not is_model_name(name):
        raise PublishError(f"invalid model name {name!r}: letters, digits, '_', '.', '-', not all digits")
    kind = source_kind(source)
    if check:
        validate(source)
    model_dir = models_dir / name
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".publish-", dir=model_dir))  # hidden: never scanned
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it 0700; a version is as readable as a copy
        _copy_synced(source, staging / ("model" + source.suffix.lower()) if kind == "file" else staging)
        _fsync(staging)
        with _locked(model_dir):
            version = next_version(model_dir)
            os.rename(staging, model_dir / str(version))
            _fsync(model_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return version
