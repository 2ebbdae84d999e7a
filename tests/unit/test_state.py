"""Worker state files: one writer (the worker), one reader (the master), atomic replacement."""

from __future__ import annotations

from pathlib import Path

from server.state import (
    LOADED,
    ModelReport,
    WorkerState,
    read_exit_reason,
    read_worker_states,
    remove_worker_state,
    workers_dir,
    write_exit_reason,
    write_worker_state,
)


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
