"""A published version's modes come from the repository's, and its readers are checked."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from server.cli.permissions import READ, EXECUTE, Reader, RepositoryAccess, tree

NOBODY = pwd.getpwnam("nobody")


def _access(mode: int, uid: int = 0, gid: int = 0) -> RepositoryAccess:
    return RepositoryAccess(Path("/repo"), uid, gid, mode)


@pytest.mark.parametrize(("repo", "directory", "file", "program"), [
    (0o755, 0o755, 0o644, 0o755),
    (0o750, 0o750, 0o640, 0o750),
    (0o700, 0o700, 0o600, 0o700),
    (0o777, 0o755, 0o644, 0o755),   # group and others never get write: versions are immutable
    (0o2775, 0o755, 0o644, 0o755),
    (0o711, 0o700, 0o600, 0o700),   # x alone lets a class in by name, not to scan: it is not a reader
])
def test_modes_follow_the_classes_the_repository_lets_in(repo: int, directory: int, file: int, program: int) -> None:
    access = _access(repo)
    assert access.mode_for(directory=True, executable=False) == directory
    assert access.mode_for(directory=False, executable=False) == file
    assert access.mode_for(directory=False, executable=True) == program


def test_apply_sets_the_group_and_modes_of_a_whole_tree(tmp_path: Path) -> None:
    root = tmp_path / "version"
    (root / "assets").mkdir(parents=True, mode=0o700)
    (root / "model.keras").write_bytes(b"x")
    (root / "assets" / "run.sh").write_text("#!/bin/sh\n")
    (root / "model.keras").chmod(0o600)
    (root / "assets" / "run.sh").chmod(0o700)
    _access(0o750, gid=NOBODY.pw_gid).apply(root)
    modes = {str(p.relative_to(root)): p.stat().st_mode & 0o7777 for p in tree(root)}
    assert modes == {".": 0o750, "assets": 0o750, "model.keras": 0o640, "assets/run.sh": 0o750}
    if os.geteuid() == 0:  # only root may give a file any group
        assert {p.stat().st_gid for p in tree(root)} == {NOBODY.pw_gid}


def test_readers_are_the_owner_the_group_and_anyone_as_the_mode_says() -> None:
    who = [r.who for r in _access(0o755, uid=NOBODY.pw_uid, gid=NOBODY.pw_gid).readers()]
    assert who == ["the repository's owner nobody (uid 65534)", "the repository's group nogroup (gid 65534)",
                   "any user (the repository is world-readable)"]
    assert [r.uid for r in _access(0o700, uid=12345).readers()] == [12345]  # no passwd entry: a uid still


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_reader_is_judged_by_the_owner_group_or_others_bits_that_apply(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x")
    path.chmod(0o640)
    shutil.chown(path, user="nobody", group="nogroup")
    status = path.stat()
    owner = Reader("owner", status.st_uid, frozenset())
    member = Reader("member", None, frozenset({status.st_gid}))
    stranger = Reader("stranger", 99999, frozenset({99999}))
    assert owner.may(status, READ) and member.may(status, READ) and not stranger.may(status, READ)
    assert not owner.may(status, READ | EXECUTE)
    assert Reader("root", 0, frozenset()).may(status, READ | EXECUTE)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_unreadable_names_the_reader_and_the_entry(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.keras").write_bytes(b"x")
    shutil.chown(repo, user="nobody", group="nogroup")
    repo.chmod(0o700)
    access = RepositoryAccess.of(repo)
    version = repo / "m" / "1"
    access.apply(version)
    entries = [(p, p.name) for p in tree(version)]
    assert access.unreadable(entries).startswith(
        "the repository's owner nobody (uid 65534) could not read 1 (owner root (uid 0), group nogroup (gid 65534), mode 0700)")
    shutil.chown(repo, user="root")  # a repository of root's: whatever publish (as root) writes, root reads
    assert RepositoryAccess.of(repo).unreadable(entries) == ""
