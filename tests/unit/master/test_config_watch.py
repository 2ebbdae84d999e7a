"""The master's view of conf/models.toml: new content settles first; a broken edit keeps the last good one."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.config import load_config
from server.master.config_watch import ConfigWatch


def settle(watch: ConfigWatch):
    """Two polls: the first sees new bytes, the second finds them unchanged and takes them."""
    watch.refresh()
    return watch.refresh()


def test_a_broken_edit_keeps_the_last_good_configuration_and_is_reported_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "models.toml"
    path.write_text("[defaults]\nmax_batch_size = 16\n")
    reports: list[bool] = []
    watch = ConfigWatch(path, load_config(path), reports.append)
    path.write_text('[models.digits]\nmax_batch_size = "eight"\n')
    for _ in range(3):
        assert watch.refresh().defaults.max_batch_size == 16
    assert watch.problem is not None and watch.problem.model == "digits"
    assert len([r for r in caplog.records if "keeping the last good configuration" in r.message]) == 1
    path.write_text("[defaults]\nmax_batch_size = 4\n")
    assert settle(watch).defaults.max_batch_size == 4 and watch.problem is None
    assert reports == [True, False, True]


def test_content_still_changing_is_not_taken(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text("[defaults]\nmax_batch_size = 16\n")
    watch = ConfigWatch(path, load_config(path))
    # An editor that truncates then writes: each poll sees other bytes, a valid prefix among them.
    for text in ("", "[defaults]\n", "[defaults]\nmax_batch_size = 4"):
        path.write_text(text)
        assert watch.refresh().defaults.max_batch_size == 16 and watch.problem is None
    assert watch.refresh().defaults.max_batch_size == 4


def test_a_syntax_error_or_bytes_that_are_not_utf8_affect_every_model(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text("")
    watch = ConfigWatch(path, load_config(path))
    path.write_text("[defaults\n")
    settle(watch)
    assert watch.problem is not None and watch.problem.model is None and watch.problem.affects("anything")
    path.write_bytes(b"[defaults]\nimage_mode = \"\xff\"\n")
    settle(watch)
    assert watch.problem is not None and "not UTF-8" in watch.problem.message


def test_a_file_removed_after_it_was_read_is_a_problem_but_none_at_the_start_means_defaults(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text("[defaults]\nmax_batch_size = 16\n")
    watch = ConfigWatch(path, load_config(path))
    path.unlink()  # an editor's rename-and-rewrite caught half-way, or a mistake
    assert watch.refresh().defaults.max_batch_size == 16
    assert watch.problem is not None and "is missing" in watch.problem.message
    path.write_text("[defaults]\nmax_batch_size = 16\n")
    settle(watch)
    assert watch.problem is None
    absent = ConfigWatch(tmp_path / "none.toml", load_config(tmp_path / "none.toml"))
    assert settle(absent).defaults.max_batch_size == 64 and absent.problem is None
