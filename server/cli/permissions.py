"""Who reads the model repository, and giving a published version the same readers (caller's process).

`publish` runs as the operator (a trainer, root, a CI job); the server often runs as another user.
Nothing says who that is but the repository directory itself: its owner, its group and its mode
are the best evidence of who reads it. A published version gets the repository's group and, for
each class the repository lets in (owner, group, others, with r and x), read access (x on
directories), whatever the source's modes were (a `tempfile.mkdtemp()` source is 0700). Group
and others never get write: versions are immutable. Then every reader the repository lets in is
checked against the published tree, so a version the server could not read is never published.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

READ, EXECUTE = 0o4, 0o1


@dataclass(frozen=True)
class Reader:
    """Someone the repository lets in: one user with its groups, any member of a group, or anyone."""

    who: str
    uid: int | None  # None: not one particular user
    gids: frozenset[int]

    def may(self, status: os.stat_result, wanted: int) -> bool:
        """Whether the file's mode grants this reader `wanted` (READ, READ | EXECUTE)."""
        if self.uid == 0:
            return True  # root reads everything
        if self.uid is not None and status.st_uid == self.uid:
            bits = status.st_mode >> 6
        elif status.st_gid in self.gids:
            bits = status.st_mode >> 3
        else:
            bits = status.st_mode
        return bits & wanted == wanted


def _user(uid: int) -> tuple[str, frozenset[int]]:
    """A user's name and groups; an unknown uid (no passwd entry here) has none we can name."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return f"uid {uid}", frozenset()
    return f"{entry.pw_name} (uid {uid})", frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


@dataclass(frozen=True)
class RepositoryAccess:
    """The owner, group and mode of the repository directory, and what they mean for a version."""

    path: Path
    uid: int
    gid: int
    mode: int

    @classmethod
    def of(cls, repository: Path) -> "RepositoryAccess":
        """The access of an existing repository directory."""
        status = os.stat(repository)
        return cls(repository, status.st_uid, status.st_gid, stat.S_IMODE(status.st_mode))

    def _lets_in(self, shift: int) -> bool:
        """Whether the class at `shift` (6 owner, 3 group, 0 others) may list and enter the repository."""
        return (self.mode >> shift) & (READ | EXECUTE) == READ | EXECUTE

    def mode_for(self, directory: bool, executable: bool) -> int:
        """A published entry's mode: the owner (the publisher) rw, every class the repository lets in r (x)."""
        wanted = READ | EXECUTE if directory or executable else READ
        mode = 0o200 | wanted << 6
        for shift in (3, 0):
            if self._lets_in(shift):
                mode |= wanted << shift
        return mode

    def apply(self, root: Path) -> None:
        """Give `root` and everything under it the repository's group and published modes.

        NOTE: the group change is what a setgid repository would do; it fails (and is left to
        `unreadable`) when the publisher is neither root nor a member of the repository's group.
        """
        for path in tree(root):
            try:
                os.chown(path, -1, self.gid, follow_symlinks=False)
            except PermissionError:
                pass
            status = os.lstat(path)
            directory = stat.S_ISDIR(status.st_mode)
            os.chmod(path, self.mode_for(directory, bool(status.st_mode & stat.S_IXUSR)), follow_symlinks=False)

    def readers(self) -> list[Reader]:
        """Everyone the repository's mode lets in: its owner, its group's members, anyone."""
        found = []
        if self._lets_in(6):
            name, groups = _user(self.uid)
            found.append(Reader(f"the repository's owner {name}", self.uid, groups))
        if self._lets_in(3):
            found.append(Reader(f"the repository's group {_group(self.gid)}", None, frozenset({self.gid})))
        if self._lets_in(0):
            found.append(Reader("any user (the repository is world-readable)", None, frozenset()))
        return found

    def unreadable(self, entries: Iterable[tuple[Path, str]]) -> str:
        """Why one of the repository's readers could not read one of `entries` (path, name shown), or ''."""
        for path, shown in entries:
            status = os.lstat(path)
            wanted = READ | EXECUTE if stat.S_ISDIR(status.st_mode) else READ
            for reader in self.readers():
                if not reader.may(status, wanted):
                    return (
                        f"{reader.who} could not read {shown} (owner {_user(status.st_uid)[0]}, "
                        f"group {_group(status.st_gid)}, mode {stat.S_IMODE(status.st_mode):04o}); publish as the "
                        f"server's user, or give {self.path} a group the server is in (chgrp GROUP; chmod g+rx)"
                    )
        return ""


def tree(root: Path) -> Iterator[Path]:
    """`root` and, for a directory, everything under it (symbolic links not followed)."""
    yield root
    if root.is_dir() and not root.is_symlink():
        for directory, dirs, files in os.walk(root):
            for name in dirs + files:
                yield Path(directory) / name
