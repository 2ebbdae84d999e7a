"""The master's view of conf/models.toml: the last good configuration survives a broken edit."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.config import load_config
from server.config_watch import ConfigWatch


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
    assert watch.refresh().defaults.max_batch_size == 4 and watch.problem is None
    assert reports == [True, False, True]


def test_a_syntax_error_affects_every_model(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text("")
    watch = ConfigWatch(path, load_config(path))
    path.write_text("[defaults\n")
    watch.refresh()
    assert watch.problem is not None and watch.problem.model is None and watch.problem.affects("anything")
