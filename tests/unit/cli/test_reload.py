"""`python -m server reload` signals only a master whose pid file this user wrote."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from server.cli.main import main
from server.cli.reload import running_masters


@pytest.fixture
def fake_master() -> Iterator[subprocess.Popen]:
    """A process that looks like a gunicorn master (its argv[0] is "gunicorn"); SIGHUP would end it."""
    process = subprocess.Popen(["bash", "-c", "exec -a gunicorn sleep 60"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")[0] != b"gunicorn":  # bash has not exec'd yet
        assert time.monotonic() < deadline, "the fake master never exec'd"
        time.sleep(0.01)
    yield process
    process.kill()
    process.wait()


def run_dir_with_pid_file(where: Path, pid: int) -> Path:
    where.mkdir(parents=True)
    (where / "gunicorn.pid").write_text(f"{pid}\n")
    return where


def test_a_pid_file_this_user_wrote_is_found(fake_master: subprocess.Popen, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("FORKSERVE_RUN_DIR", raising=False)
    run_dir = run_dir_with_pid_file(tmp_path / "forkserve-1-abc", fake_master.pid)
    assert running_masters(None) == {run_dir: fake_master.pid}


def test_a_symlinked_pid_file_is_refused(fake_master: subprocess.Popen, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("FORKSERVE_RUN_DIR", raising=False)
    elsewhere = run_dir_with_pid_file(tmp_path / "elsewhere", fake_master.pid)
    planted = tmp_path / "forkserve-2-abc"
    planted.mkdir()
    (planted / "gunicorn.pid").symlink_to(elsewhere / "gunicorn.pid")
    (tmp_path / "forkserve-3-abc").symlink_to(elsewhere)  # a run directory that is a symlink is no candidate
    assert running_masters(None) == {} and running_masters(str(planted)) == {}
    assert main(["reload", "--run-dir", str(planted)]) == 1
    assert "ignoring" in capsys.readouterr().err
    assert fake_master.poll() is None  # no SIGHUP was sent


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_pid_file_of_another_user_is_refused(fake_master: subprocess.Popen, tmp_path: Path) -> None:
    run_dir = run_dir_with_pid_file(tmp_path / "run", fake_master.pid)
    os.chown(run_dir / "gunicorn.pid", 54321, 54321)
    assert running_masters(str(run_dir)) == {}
    assert main(["reload", "--run-dir", str(run_dir)]) == 1
    assert fake_master.poll() is None
