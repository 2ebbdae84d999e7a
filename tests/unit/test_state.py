"""Worker state files: one writer (the worker), one reader (the master), atomic replacement."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from server import write_errors
from server.state import (
    LOADED,
    ModelReport,
    WorkerState,
    publish_worker_state,
    read_exit_reason,
    read_json,
    read_worker_states,
    remove_worker_state,
    workers_dir,
    write_exit_reason,
    write_json,
    write_worker_state,
)
from tests.support.harness import wait_until


def test_a_state_round_trips_loading_then_loaded(tmp_path: Path) -> None:
    write_worker_state(tmp_path, WorkerState(7, "g1", loading=("mlp", 2)))
    loading = read_worker_states(tmp_path)[7]
    assert not loading.loaded and loading.loading == ("mlp", 2) and loading.generation == "g1"
    done = WorkerState(7, "g1", LOADED, None, False, {"mlp": ModelReport([1], {2: "failed to load: x"})})
    write_worker_state(tmp_path, done)
    assert read_worker_states(tmp_path) == {7: done}
    assert done.serving("mlp") == [1] and done.serving("other") == []


def test_unreadable_or_foreign_files_are_skipped(tmp_path: Path) -> None:
    directory = workers_dir(tmp_path)
    directory.mkdir(parents=True)
    (directory / "8.json").write_text("{half")
    (directory / "9.json").write_text('{"generation": "g"}')  # no pid: written by something else
    (directory / "notes.json").write_text('{"pid": 1, "generation": "g"}')
    write_worker_state(tmp_path, WorkerState(10, "g"))
    assert list(read_worker_states(tmp_path)) == [10]


def test_exit_reasons_and_removal(tmp_path: Path) -> None:
    write_worker_state(tmp_path, WorkerState(5, "g"))
    write_exit_reason(tmp_path, 5, "graceful")
    assert read_exit_reason(tmp_path, 5) == "graceful" and read_exit_reason(tmp_path, 6) == ""
    remove_worker_state(tmp_path, 5)
    assert read_worker_states(tmp_path) == {} and read_exit_reason(tmp_path, 5) == ""


@pytest.fixture
def fresh_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kind of run-directory problem not yet logged in this process."""
    monkeypatch.setattr(write_errors, "_told", set())


def errors_counted(file: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("forkserve_run_dir_write_errors_total", {"file": file}) or 0.0


def test_a_refused_state_file_is_reported_once_and_counted_each_time(
    tmp_path: Path, fresh_reports: None, caplog: pytest.LogCaptureFixture,
) -> None:
    workers_dir(tmp_path).write_text("a file where the workers directory should be")
    before = errors_counted(write_errors.WORKER_STATE)
    for _ in range(3):
        assert not write_worker_state(tmp_path, WorkerState(7, "g", loading=("mlp", 1)))
    lines = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(lines) == 1 and f"{workers_dir(tmp_path) / '7.json'} (worker_state): [Errno 17] File exists" in lines[0]
    assert errors_counted(write_errors.WORKER_STATE) == before + 3
    write_exit_reason(tmp_path, 7, "graceful")  # never raises either
    remove_worker_state(tmp_path, 7)


def test_a_loaded_state_the_directory_refused_is_published_once_it_can_be(
    tmp_path: Path, fresh_reports: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_worker_state(tmp_path, WorkerState(7, "g", loading=("mlp", 1)))

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tempfile, "mkstemp", full)  # the run directory is full from now on
    loaded = WorkerState(7, "g", LOADED, None, True, {"mlp": ModelReport([1])})
    publish_worker_state(tmp_path, loaded, retry_every=0.05)
    assert read_worker_states(tmp_path) == {}  # not "loading mlp 1" any more: the master would blame mlp 1 for its death
    monkeypatch.undo()  # space again
    wait_until(lambda: read_worker_states(tmp_path) == {7: loaded}, 10, "the state to be published")


def test_a_planted_temporary_name_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    for planted in (f".target.json.{os.getpid()}.tmp", "target.json"):  # the old temporary name, and the file itself
        (tmp_path / planted).symlink_to(victim)
    write_json(tmp_path / "target.json", {"generation": "g"})
    assert victim.read_text() == "mine" and read_json(tmp_path / "target.json") == {"generation": "g"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".target.json.") and not p.is_symlink()] == []


NOT_PERMITTED = """
import logging, os, sys
from pathlib import Path
from server.state import WorkerState, remove_worker_state, write_exit_reason, write_worker_state
from server.telemetry import metrics  # noqa: F401  (imported while it still can be)
logging.basicConfig(format="%(message)s")
os.setgid(65534)
os.setuid(65534)  # nobody: the run directory is root's, mode 0755
run_dir = Path(sys.argv[1])
print(write_worker_state(run_dir, WorkerState(7, "g")), write_worker_state(run_dir, WorkerState(7, "g")))
write_exit_reason(run_dir, 7, "graceful")
remove_worker_state(run_dir, 8)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="changing user needs root")
def test_a_run_dir_this_user_may_not_write_is_reported_never_raised(tmp_path: Path) -> None:
    """EACCES (root bypasses permissions, so the writer drops to nobody): every write is reported once, none raises."""
    write_worker_state(tmp_path, WorkerState(8, "g"))
    os.chmod(tmp_path, 0o755)
    done = subprocess.run([sys.executable, "-c", NOT_PERMITTED, str(tmp_path)], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["False", "False"], done.stderr
    lines = [line for line in done.stderr.splitlines() if "cannot write" in line]
    assert [line.split("(")[1].split(")")[0] for line in lines] == ["worker_state", "worker_exit", "cleanup"], lines
    assert all("[Errno 13] Permission denied" in line for line in lines)
    assert list(read_worker_states(tmp_path)) == [8]
