"""The run directory: made private or checked before use, probed, and cleaned without following a symlink (no TensorFlow here).

Runs in the master (Settings.export at start, the master hooks at start and exit) and in
`python -m server reload` (which pid files it believes). The default run directory is a fresh
`$TMPDIR/forkserve-<pid>-<random>` made with mode 0700, so another local user can neither
predict it nor plant anything in it. A directory given in FORKSERVE_RUN_DIR is used when it is a
real directory (not a symlink) owned by this user or by root (a Kubernetes emptyDir is root's);
whatever is inside it is removed, never followed.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

PREFIX = "forkserve-"  # `python -m server reload` looks for $TMPDIR/forkserve-*


class RunDirError(Exception):
    """The run directory cannot be used; the message names it and why (errno included)."""


def prepare(run_dir: Path, metrics_dir: Path) -> None:
    """Master, at start: make or check the run directory, make the metrics directory, prove both writable.

    A failure removes what this call made and raises RunDirError.
    """
    made: list[Path] = []
    try:
        _make_or_check(run_dir, made)
        if not _is_real_directory(metrics_dir):
            if metrics_dir.parent == run_dir:
                remove_tree(metrics_dir)  # a planted symlink or file: removed, never followed
            metrics_dir.mkdir(parents=True)
            made.append(metrics_dir)
        for directory in (run_dir, metrics_dir):
            probe(directory)
    except OSError as exc:
        for path in reversed(made):
            remove_tree(path)
        raise RunDirError(f"run directory {run_dir}: {_describe(exc)}") from None


def _make_or_check(run_dir: Path, made: list[Path]) -> None:
    """Make `run_dir` (mode 0700, refusing one that appeared meanwhile), or check the one there is ours."""
    try:
        info = os.lstat(run_dir)
    except FileNotFoundError:
        missing = [p for p in (run_dir, *run_dir.parents) if not os.path.lexists(p)]
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(run_dir, 0o700)  # NOTE: fails if it exists by now: never one another user made
        made.extend(reversed(missing))
        return
    if stat.S_ISLNK(info.st_mode):
        raise RunDirError(f"run directory {run_dir}: is a symbolic link; give the directory itself")
    if not stat.S_ISDIR(info.st_mode):
        raise RunDirError(f"run directory {run_dir}: is not a directory")
    if info.st_uid not in (os.geteuid(), 0):
        raise RunDirError(f"run directory {run_dir}: is owned by uid {info.st_uid}, not by this user "
                          f"(uid {os.geteuid()}) or root; another user could change what the server reads there")


def probe(directory: Path) -> None:
    """Raise the OSError a write in `directory` gets now (read-only, full, not permitted)."""
    fd, name = tempfile.mkstemp(prefix=".probe-", dir=directory)
    try:
        os.write(fd, b"x")  # a block: a full file system refuses it, an empty file it would take
    finally:
        os.close(fd)
        os.unlink(name)


def _describe(exc: OSError) -> str:
    """`[Errno 28] No space left on device` with the path concerned when it is not the run directory itself."""
    where = f" ({exc.filename})" if exc.filename else ""
    return f"[Errno {exc.errno}] {exc.strerror}{where}" if exc.strerror else str(exc)


def _is_real_directory(path: Path) -> bool:
    """A directory, not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def reset_directory(path: Path) -> None:
    """Master, at start: an empty directory at `path`, whatever was there (a symlink is removed, never followed)."""
    remove_tree(path)
    path.mkdir()  # NOTE: fails if something appeared since: never into a directory another process made


def remove_tree(path: Path) -> None:
    """Best effort: remove `path` and what is below it, without following a symlink at any level."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)  # fd-based on Linux (rmtree.avoids_symlink_attacks)
        else:
            path.unlink()
    except OSError:
        pass


def remove_file(path: Path) -> None:
    """Best effort: remove one file (a symlink itself, never its target)."""
    try:
        path.unlink()
    except OSError:
        pass


def trusted_pid(pid_file: Path) -> int | None:
    """The pid in a pid file this user wrote: None for a symlink, another owner, or no number.

    `python -m server reload` signals the pid it reads; a pid file another user planted (or a
    symlink to some other file) must never choose what it signals.
    """
    try:
        fd = os.open(pid_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return None
        try:
            return int(handle.read(64).strip())
        except ValueError:
            return None


def candidates(temporary: Path | None = None) -> list[Path]:
    """Run directories of this user's servers under $TMPDIR (`forkserve-*`): real directories this user owns."""
    return sorted(p for p in (temporary or Path(tempfile.gettempdir())).glob(f"{PREFIX}*") if _owned_directory(p))


def _owned_directory(path: Path) -> bool:
    """A directory (not a symlink to one) that this user owns."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
