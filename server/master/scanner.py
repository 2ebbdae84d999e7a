"""The master's view of the model repository: which version directories have settled (no TensorFlow).

Runs in the master's rollout thread. A new version directory counts once its files (names,
sizes, mtimes) did not change between two polls. Once settled, a directory stays settled:
`touch` or an rsync of identical content must not take a served version out of service. A
settled directory whose files really change (names or sizes) is reported, not reloaded:
versions are immutable, and workers keep the copy they loaded. The digest of a directory's
bytes (content_digest) tells a failed version whose files were replaced from one merely touched.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from server.config import ServerConfig
from server.repository import VersionSource, scan


@dataclass(frozen=True)
class DirectoryFiles:
    """What a poll sees of one version directory."""

    content: tuple[tuple[str, int], ...]  # relative file names and sizes
    mtimes: tuple[int, ...]

    @property
    def key(self) -> str:
        """A short name for the content (names and sizes; mtimes left out, so `touch` keeps it)."""
        return hashlib.sha256(repr(self.content).encode()).hexdigest()[:16]


def read_files(path: Path) -> DirectoryFiles:
    """Names, sizes and mtimes of every file under a version directory (sorted)."""
    content, mtimes = [], []
    for directory, subdirs, files in os.walk(path):
        subdirs.sort()
        for name in sorted(files):
            full = os.path.join(directory, name)
            try:
                info = os.stat(full)
            except FileNotFoundError:
                continue
            content.append((os.path.relpath(full, path), info.st_size))
            mtimes.append(info.st_mtime_ns)
    return DirectoryFiles(tuple(content), tuple(mtimes))


# Called with a settled version whose files changed and what changed; True makes it settle again
# (a failed version being rewritten), False keeps it settled (a served one: reported only).
ChangeReport = Callable[[VersionSource, str], bool]


class SettledScanner:
    """Scans the repository; reports new versions once settled, and keeps settled ones."""

    def __init__(self, models_dir: Path | None, report_change: ChangeReport | None = None, new_versions: bool = True) -> None:
        self.models_dir = models_dir
        self._report_change = report_change
        # per model and directory (a reload may move a model): its versions when first seen; None: new versions are looked for
        self._first_seen: dict[tuple[str, Path], set[Path]] | None = None if new_versions else {}
        self._seen: dict[Path, DirectoryFiles] = {}  # every version directory at the last poll
        self._settled: dict[Path, DirectoryFiles] = {}  # settled directories, as they were when reported
        self._unsettled_since: dict[Path, float] = {}  # directories seen but not settled: since when (monotonic)
        self._digests: dict[Path, tuple[DirectoryFiles, str]] = {}  # content_digest() per directory, by its view

    def scan(self, trust_all: bool = False, config: ServerConfig | None = None) -> dict[str, list[VersionSource]]:
        """Settled versions per model (the repository's, and those `config` gives a base_path), newest first.

        `trust_all` (first start) takes every directory as settled.

        A model whose only versions are still changing is left out (it has nothing to serve yet);
        a model directory without versions is kept, empty.
        """
        found = self._only_first_seen(scan(self.models_dir, config))
        seen: dict[Path, DirectoryFiles] = {}
        settled: dict[str, list[VersionSource]] = {}
        for name, sources in found.items():
            kept = []
            for source in sources:
                files = seen[source.path] = read_files(source.path)
                if self._keep(source, files, trust_all):
                    kept.append(source)
            if kept or not sources:
                settled[name] = kept
        self._settled = {path: files for path, files in self._settled.items() if path in seen}
        self._digests = {path: digest for path, digest in self._digests.items() if path in seen}
        now = time.monotonic()
        self._unsettled_since = {path: self._unsettled_since.get(path, now) for path in seen if path not in self._settled}
        self._seen = seen
        return settled

    def _only_first_seen(self, found: dict[str, list[VersionSource]]) -> dict[str, list[VersionSource]]:
        """Without new versions (TF Serving's --file_system_poll_wait_seconds=0): each model's versions when first seen."""
        if self._first_seen is None:
            return found
        for name, sources in found.items():
            for directory in {source.path.parent for source in sources}:
                self._first_seen.setdefault((name, directory), {s.path for s in sources if s.path.parent == directory})
        return {name: [s for s in sources if s.path in self._first_seen[(name, s.path.parent)]]
                for name, sources in found.items()}

    def unsettled_for(self) -> float:
        """Seconds the oldest directory still changing has been seen (0 when every directory settled)."""
        if not self._unsettled_since:
            return 0.0
        return time.monotonic() - min(self._unsettled_since.values())

    def _keep(self, source: VersionSource, files: DirectoryFiles, trust_all: bool) -> bool:
        """Whether the directory counts as settled now (and note what changed in a settled one)."""
        before = self._settled.get(source.path)
        if before is not None:
            if files.content != before.content and self._report_change is not None:
                if self._report_change(source, _difference(before, files)):
                    del self._settled[source.path]
                    return False
            self._settled[source.path] = files  # each distinct change is reported once
            return True
        if trust_all or self._seen.get(source.path) == files:
            self._settled[source.path] = files
            return True
        return False

    def content_key(self, path: Path) -> str:
        """The content key of a version directory at the last poll ("" if it was not seen)."""
        files = self._seen.get(path)
        return files.key if files is not None else ""

    def content_digest(self, path: Path) -> str:
        """A digest of the bytes of a version directory's files at the last poll ("" if it was not seen).

        NOTE: reads every byte, so it is asked only about failed versions, and computed again only
        when the directory's names, sizes or mtimes changed: `touch` costs one read, a poll none.
        """
        files = self._seen.get(path)
        if files is None:
            return ""
        cached = self._digests.get(path)
        if cached is None or cached[0] != files:
            cached = self._digests[path] = (files, digest_files(path, files))
        return cached[1]


def digest_files(path: Path, files: DirectoryFiles) -> str:
    """sha256 over each file's name, size and bytes; a file that cannot be read counts by its error.

    NOTE: only regular files are read: a FIFO (or a device) would block the master's rollout
    thread for ever, so its type stands in for its content. O_NONBLOCK covers a file swapped for
    a FIFO between the stat and the open.
    """
    digest = hashlib.sha256()
    for name, size in files.content:
        digest.update(f"{name}\0{size}\0".encode())
        try:
            fd = os.open(path / name, os.O_RDONLY | os.O_NONBLOCK)
            with open(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    digest.update(f"not a regular file: {stat.S_IFMT(os.fstat(fd).st_mode)}".encode())
                    continue
                left = size  # NOTE: at most the size the poll saw: a file of /proc says 0 and never ends
                while left > 0 and (chunk := handle.read(min(left, 1 << 20))):
                    digest.update(chunk)
                    left -= len(chunk)
        except OSError as exc:
            digest.update(f"unreadable: {exc.errno}".encode())
    return digest.hexdigest()[:16]


def _difference(before: DirectoryFiles, after: DirectoryFiles) -> str:
    """A short description of what changed between two views of a directory."""
    old, new = dict(before.content), dict(after.content)
    parts = []
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    resized = sorted(name for name in set(old) & set(new) if old[name] != new[name])
    for label, names in (("added", added), ("removed", removed), ("resized", resized)):
        if names:
            parts.append(f"{label} {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}")
    return "; ".join(parts)
