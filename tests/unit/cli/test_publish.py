"""publish's bookkeeping in the repository: stale staging directories, the request shape, the final fsync."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from server.cli import publish as publishing
from server.cli.publish import publish, remove_stale_staging, request_shape_change

ROOT = Path(__file__).resolve().parents[3]
DIGITS = ROOT / "models" / "digits"


def _gone_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_this_host_s_dead_publishers_staging_directories_are_removed(tmp_path: Path) -> None:
    host = socket.gethostname()
    names = {
        "dead": f".publish-{_gone_pid()}@{host}-abc123_x",
        "alive": f".publish-{os.getpid()}@{host}-def456_y",
        "elsewhere": f".publish-{_gone_pid()}@another-host.example-ghi789",
        "unnamed": ".publish-jkl012",  # an older publish's: whose it is cannot be told
    }
    for name in names.values():
        (tmp_path / name / "assets").mkdir(parents=True)
    (tmp_path / "1").mkdir()
    assert remove_stale_staging(tmp_path) == [names["dead"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["1", names["alive"], names["elsewhere"], names["unnamed"]])


def test_the_request_shape_changes_when_handler_py_comes_or_goes(tmp_path: Path) -> None:
    models = tmp_path / "models"
    shutil.copytree(DIGITS, models / "digits")  # 1 plain, 2 with a handler
    plain, handled = DIGITS / "1", DIGITS / "2"
    assert "has a handler.py and model.keras has none" in request_shape_change(models / "digits", plain / "model.keras", "file")
    assert "has a handler.py and 1 has none" in request_shape_change(models / "digits", plain, "directory")
    assert request_shape_change(models / "digits", handled, "directory") == ""
    shutil.rmtree(models / "digits" / "2")
    assert "2 has a handler.py and version 1 of digits has none" in request_shape_change(models / "digits", handled, "directory")
    assert request_shape_change(models / "digits", plain / "model.keras", "file") == ""
    assert request_shape_change(models / "new", handled, "directory") == ""  # a new model: no clients yet


def test_a_failed_fsync_after_the_rename_is_a_warning_not_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    models = tmp_path / "models"
    real_fsync = publishing._fsync

    def fsync(path: Path) -> None:  # the disk fails to flush the model directory once the version is in it
        if path == models / "digits" and (path / "1").exists():
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(path)

    monkeypatch.setattr(publishing, "_fsync", fsync)
    with caplog.at_level(logging.WARNING, logger="forkserve.publish"):
        version = publish("digits", DIGITS / "1" / "model.keras", models, check=False)
    assert version == 1 and (models / "digits" / "1" / "model.keras").is_file()
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: version 1 is published, but flushing {models / 'digits'} to disk failed (Input/output error): "
        "it may not survive a crash of this machine before the next sync"]
