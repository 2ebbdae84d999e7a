"""The files through which the master and the workers talk, in the run directory (no TensorFlow here).

| file | written by | read by |
|---|---|---|
| `target.json` (server.target) | master: what to serve, with the accepted configuration | workers, at boot |
| `failed.json` (server.target) | master: versions a rollout or repeated deaths marked failed | master; workers, for status |
| `workers/<pid>.json` (here) | worker: loading progress, then what it serves | master (rollouts, strikes) |
| `workers/<pid>.exit` (here) | worker: the reason of an orderly exit | master (child_exit) |

Every JSON file is replaced by rename, so a reader sees the old content or the new, never half.
A write the run directory refuses (full, read-only, not permitted) is reported once per kind
(server.write_errors) and costs that file only: the worker state files are best effort
(a worker serves without one), the master's files raise for the caller to decide.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server import run_dir as run_directory
from server import write_errors

LOADING, LOADED = "loading", "loaded"


def workers_dir(run_dir: Path) -> Path:
    """Where the worker state files live."""
    return run_dir / "workers"


def write_json(path: Path, data: Any, file: str | None = None) -> None:
    """Replace a JSON file atomically (a reader sees the old content or the new, never half).

    A failure is reported as a failed write of `file` (default: the file's stem, "target" or
    "failed") and raised. The temporary file is made with mkstemp (O_EXCL): a name planted in
    the directory is never followed.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                os.fchmod(handle.fileno(), 0o644)
                handle.write(json.dumps(data, sort_keys=True))
            os.replace(temporary, path)
        except BaseException:
            run_directory.remove_file(Path(temporary))
            raise
    except OSError as exc:
        write_errors.report(file or path.stem, path, exc)
        raise


def run_dir_writable(run_dir: Path) -> bool:
    """Master, before a rollout pass: whether target.json and failed.json could be written now (reported if not)."""
    try:
        run_directory.probe(run_dir)
    except OSError as exc:
        write_errors.report(write_errors.TARGET, run_dir / "target.json", exc)
        return False
    return True


def read_json(path: Path) -> Any:
    """A JSON file's content, or None when it is missing, being replaced or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class ModelReport:
    """What one worker made of one model: the versions it serves and why others failed."""

    serving: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerState:
    """One worker's progress: loading (which version now), then loaded (what it serves)."""

    pid: int
    generation: str  # the target it loads or loaded ("" when no master published one)
    phase: str = LOADING
    loading: tuple[str, int] | None = None  # the model version being loaded right now
    ready: bool = False
    models: dict[str, ModelReport] = field(default_factory=dict)

    @property
    def loaded(self) -> bool:
        """Loading is over (whatever its outcome): the worker accepts requests."""
        return self.phase == LOADED

    def serving(self, model: str) -> list[int]:
        """Versions of `model` this worker serves."""
        report = self.models.get(model)
        return list(report.serving) if report else []

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "generation": self.generation,
            "phase": self.phase,
            "loading": list(self.loading) if self.loading else None,
            "ready": self.ready,
            "models": {
                name: {"serving": report.serving, "failed": {str(v): why for v, why in report.failed.items()}}
                for name, report in self.models.items()
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "WorkerState":
        loading = data.get("loading")
        return cls(
            pid=int(data["pid"]),
            generation=str(data.get("generation", "")),
            phase=str(data.get("phase", LOADING)),
            loading=(str(loading[0]), int(loading[1])) if loading else None,
            ready=bool(data.get("ready", False)),
            models={
                name: ModelReport([int(v) for v in report.get("serving", [])],
                                  {int(v): str(why) for v, why in report.get("failed", {}).items()})
                for name, report in data.get("models", {}).items()
            },
        )


def write_worker_state(run_dir: Path, state: WorkerState) -> bool:
    """Worker: publish its progress or outcome; False (reported) when the run directory refused it.

    NOTE: a refused write also removes what the file said before (when it can): the master would
    take a stale "loading" for where the worker is, and blame that version for its death.
    """
    path = workers_dir(run_dir) / f"{state.pid}.json"
    try:
        write_json(path, state.to_json(), write_errors.WORKER_STATE)
    except OSError:
        run_directory.remove_file(path)
        return False
    return True


def publish_worker_state(run_dir: Path, state: WorkerState, retry_every: float = 5.0) -> None:
    """Worker, once loaded: publish the outcome, and if the run directory refuses, keep trying in a thread until it takes it.

    NOTE: an unpublished worker serves, but the master does not see it loaded (a rollout waits
    for it, and child_exit counts its death against no version).
    """
    if write_worker_state(run_dir, state):
        return

    def retry() -> None:
        while True:
            time.sleep(retry_every)
            if write_worker_state(run_dir, state):
                write_errors.log.warning("forkserve: worker %s published its state at last: the master sees it loaded",
                                         state.pid)
                return

    threading.Thread(target=retry, name="forkserve-state-retry", daemon=True).start()


def read_worker_states(run_dir: Path) -> dict[int, WorkerState]:
    """Master (and tests): every published worker state by pid."""
    states: dict[int, WorkerState] = {}
    directory = workers_dir(run_dir)
    if not directory.is_dir():
        return states
    for path in directory.glob("*.json"):
        data = read_json(path)  # None: removed while reading
        if isinstance(data, dict) and path.stem.isdigit():
            try:
                states[int(path.stem)] = WorkerState.from_json(data)
            except (KeyError, TypeError, ValueError):
                continue  # written by another forkserve version: treat as not reported yet
    return states


def remove_worker_state(run_dir: Path, pid: int) -> None:
    """Master: forget a worker that exited (a directory that refuses is reported, never raised)."""
    for suffix in (".json", ".exit"):
        path = workers_dir(run_dir) / f"{pid}{suffix}"
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            write_errors.report(write_errors.CLEANUP, path, exc)


def write_exit_reason(run_dir: Path, pid: int, reason: str) -> None:
    """Worker: leave the reason of an orderly exit for the master to read (the master counts "killed" without it)."""
    path = workers_dir(run_dir) / f"{pid}.exit"
    try:
        path.write_text(reason)
    except OSError as exc:
        write_errors.report(write_errors.WORKER_EXIT, path, exc)


def read_exit_reason(run_dir: Path, pid: int) -> str:
    """Master: the reason a worker left, or "" if it left none (SIGKILL, crash, OOM)."""
    try:
        return (workers_dir(run_dir) / f"{pid}.exit").read_text().strip()
    except OSError:
        return ""
