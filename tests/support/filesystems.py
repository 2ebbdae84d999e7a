"""Small file systems that are full or read-only on demand (tmpfs mounts: root only; skipped without, failed in CI)."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


def mount_tmpfs(where: Path, size: str) -> None:
    """Mount a tmpfs of `size` at `where`, or skip the test (fail it in CI) when this user cannot."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs: {mounted.stderr!r}")
        pytest.skip("mounting a tmpfs needs root")


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


@contextmanager
def tmpfs(where: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs at `where` for the duration."""
    mount_tmpfs(where, size)
    try:
        yield where
    finally:
        unmount(where)


@contextmanager
def filled(directory: Path) -> Iterator[None]:
    """The file system of `directory` full to its last block, for the duration."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as handle:
        for size in (1 << 20, 4096, 1):  # down to the last partial page
            try:
                while handle.write(b"\0" * size):
                    pass
            except OSError:
                pass
    try:
        yield
    finally:
        filler.unlink()


@contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """`directory` read-only through its path (a read-only bind mount over it), for the duration.

    NOTE: the kernel refuses to remount a file system read-only while files on it are open for
    writing (a server's metric files are); a read-only bind mount over the path gives every new
    open, create and unlink there EROFS, as a read-only volume does.
    """
    subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True)
        assert not os.access(directory, os.W_OK)
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)
