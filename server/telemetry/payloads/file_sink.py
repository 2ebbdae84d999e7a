"""JSON lines, one file per worker (DIR/payloads-HOST-PID.jsonl), rotated by size; files 0600 in a 0750 directory."""

from __future__ import annotations

import os
import socket
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
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
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

    def _still_at_path(self) -> bool:
        """Whether the open file is the one at self.path."""
        assert self._fd is not None
        try:
            at_path = os.stat(self.path)
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
            if older.exists():
                os.replace(older, f"{self.path}.{number + 1}")
        os.replace(self.path, f"{self.path}.1")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
