"""The run directory: made private, checked when given, cleaned without following symlinks, pid files trusted only when ours."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from server.run_dir import RunDirError, candidates, prepare, remove_tree, reset_directory, trusted_pid

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
OTHER_UID = 54321


def victim(tmp_path: Path) -> Path:
    """Someone's directory with a file in it, that nothing here may touch."""
    directory = tmp_path / "victim"
    directory.mkdir()
    (directory / "keep.txt").write_text("mine")
    return directory


def test_a_missing_run_dir_is_made_private_with_its_metrics_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "a" / "run"
    prepare(run_dir, run_dir / "metrics")
    assert (run_dir / "metrics").is_dir() and os.stat(run_dir).st_mode & 0o777 == 0o700
    assert os.listdir(run_dir) == ["metrics"]  # the writability probe is gone


def test_a_run_dir_that_is_a_symlink_is_refused_and_left_alone(tmp_path: Path) -> None:
    target = victim(tmp_path)
    link = tmp_path / "run"
    link.symlink_to(target)
    with pytest.raises(RunDirError, match=f"run directory {link}: is a symbolic link"):
        prepare(link, link / "metrics")
    assert sorted(os.listdir(target)) == ["keep.txt"]


@needs_root
def test_a_run_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "run"
    planted.mkdir()
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(RunDirError, match=f"is owned by uid {OTHER_UID}, not by this user"):
        prepare(planted, planted / "metrics")
    assert os.listdir(planted) == []


def test_a_planted_metrics_symlink_is_replaced_never_followed(tmp_path: Path) -> None:
    target = victim(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics").symlink_to(target)
    prepare(run_dir, run_dir / "metrics")
    assert (run_dir / "metrics").is_dir() and not (run_dir / "metrics").is_symlink()
    (run_dir / "workers").symlink_to(target)
    for directory in (run_dir / "metrics", run_dir / "workers"):
        reset_directory(directory)
        assert directory.is_dir() and not directory.is_symlink() and os.listdir(directory) == []
    remove_tree(run_dir)
    assert not run_dir.exists() and sorted(os.listdir(target)) == ["keep.txt"]


def test_a_failed_prepare_leaves_nothing_it_made(tmp_path: Path) -> None:
    in_the_way = tmp_path / "prom"
    in_the_way.write_text("a file where the metrics directory should be")
    with pytest.raises(RunDirError, match=rf"run directory {tmp_path / 'new' / 'run'}: \[Errno 17\] File exists"):
        prepare(tmp_path / "new" / "run", in_the_way)
    assert sorted(os.listdir(tmp_path)) == ["prom"]


def test_only_pid_files_this_user_wrote_are_trusted(tmp_path: Path) -> None:
    ours = tmp_path / "gunicorn.pid"
    ours.write_text("1234\n")
    assert trusted_pid(ours) == 1234
    link = tmp_path / "link.pid"
    link.symlink_to(ours)
    assert trusted_pid(link) is None  # a symlink, even to a good pid file
    (tmp_path / "garbage.pid").write_text("not a pid")
    assert trusted_pid(tmp_path / "garbage.pid") is None and trusted_pid(tmp_path / "missing.pid") is None


@needs_root
def test_a_pid_file_of_another_user_is_not_trusted(tmp_path: Path) -> None:
    planted = tmp_path / "gunicorn.pid"
    planted.write_text(f"{os.getpid()}\n")
    os.chown(planted, OTHER_UID, OTHER_UID)
    assert trusted_pid(planted) is None


def test_candidates_are_this_users_real_directories(tmp_path: Path) -> None:
    (tmp_path / "forkserve-1-abc").mkdir()
    (tmp_path / "forkserve-2-link").symlink_to(tmp_path / "forkserve-1-abc")
    (tmp_path / "forkserve-3-file").write_text("")
    (tmp_path / "other").mkdir()
    assert candidates(tmp_path) == [tmp_path / "forkserve-1-abc"]
