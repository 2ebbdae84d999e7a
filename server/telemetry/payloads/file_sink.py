"""JSON lines, one file per worker (DIR/payloads-HOST-PID.jsonl), rotated by size; files 0600 in a 0750 directory.

NOTE: the file is opened without following a symbolic link (O_NOFOLLOW) and used only when it is
a regular file with one link, owned by this worker's user; its mode is then set to 0600 whatever
it was. Anyone else who can write to DIR could otherwise plant a link (to a file of ours, or one
they read) or a file they own, and have user data written there. Rotation only renames, and a
rename never follows a link; a link planted at a rotated name is renamed or replaced like a file.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import time
from pathlib import Path

from server.telemetry.payloads.record import Record

KEEP = 5  # rotated files kept per worker (.1 the newest .. .5 the oldest): at most 6 x FORKSERVE_PAYLOAD_LOG_MAX_MB each
FILE_MODE = 0o600  # payloads are user data: readable by the server's user only
DIR_MODE = 0o750  # when forkserve creates the directory
RECHECK_S = 1.0  # how often the writer checks that its open file is still at its path


class FileSink:
    """Appends records to this worker's file; past `max_bytes` the file is renamed .1 (older ones shift) and a new one begun."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.path = directory / f"payloads-{socket.gethostname()}-{os.getpid()}.jsonl"
        self.max_bytes = max_bytes
        self._fd: int | None = None
        self._size = 0
        self._checked = 0.0

    def write(self, record: Record) -> None:
        """Write one line; an OSError (full disk, removed directory) propagates to the writer, which counts it."""
        if self._fd is not None and time.monotonic() - self._checked >= RECHECK_S:
            self._checked = time.monotonic()
            if not self._still_at_path():
                self.close()  # removed or moved away (rm -r DIR, a log shipper): a new file, not lines nobody sees
        if self._fd is None:
            self.path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            self._fd = self._open()
            self._size = os.fstat(self._fd).st_size
        line = record.line()
        try:
            written = os.write(self._fd, line)
            if written < len(line):
                raise OSError(f"short write to {self.path} ({written} of {len(line)} bytes): the disk is full")
        except OSError:
            os.ftruncate(self._fd, self._size)  # NOTE: a part of a line would glue itself to the next record
            raise
        self._size += written
        if self._size >= self.max_bytes:
            self._rotate()

    def _open(self) -> int:
        """This worker's file, opened for appending; OSError for a link, or a file that is not ours alone."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                         FILE_MODE)  # NOTE: O_NONBLOCK: a FIFO planted at the path must not hang the writer on open
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OSError(errno.ELOOP, f"{self.path} is a symbolic link: not followed, not written") from None
            raise
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode):
                raise OSError(f"{self.path} is not a regular file: not written")
            if found.st_uid != os.geteuid():
                raise OSError(f"{self.path} belongs to uid {found.st_uid}, not this worker's user ({os.geteuid()}): not written")
            if found.st_nlink != 1:
                raise OSError(f"{self.path} has {found.st_nlink} hard links: not written")
            if stat.S_IMODE(found.st_mode) != FILE_MODE:
                os.fchmod(fd, FILE_MODE)  # a file made before us (by anyone, with any mode) is ours alone from now on
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _still_at_path(self) -> bool:
        """Whether the open file is the one at self.path."""
        assert self._fd is not None
        try:
            at_path = os.stat(self.path, follow_symlinks=False)  # a link put in its place is not it
        except OSError:
            return False
        opened = os.fstat(self._fd)
        return (at_path.st_dev, at_path.st_ino) == (opened.st_dev, opened.st_ino)

    def _rotate(self) -> None:
        """Shift PATH.N to PATH.N+1 (the oldest is replaced), PATH to PATH.1; the next write opens a new PATH."""
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        for number in range(KEEP - 1, 0, -1):
            older = Path(f"{self.path}.{number}")
            if os.path.lexists(older):
                os.replace(older, f"{self.path}.{number + 1}")
        os.replace(self.path, f"{self.path}.1")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
