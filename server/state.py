"""The files through which the master and the workers talk, in the run directory (no TensorFlow here).

| file | written by | read by |
|---|---|---|
| `target.json` (server.target) | master: what to serve, with the accepted configuration | workers, at boot |
| `failed.json` (server.target) | master: versions a rollout or repeated deaths marked failed | master; workers, for status |
| `workers/<pid>.json` (here) | worker: loading progress, then what it serves | master (rollouts, strikes) |
| `workers/<pid>.exit` (here) | worker: the reason of an orderly exit | master (child_exit) |

Every JSON file is replaced by rename, so a reader sees the old content or the new, never half.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOADING, LOADED = "loading", "loaded"


def workers_dir(run_dir: Path) -> Path:
    """Where the worker state files live."""
    return run_dir / "workers"


def write_json(path: Path, data: Any) -> None:
    """Replace a JSON file atomically (a reader sees the old content or the new, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, sort_keys=True))
    os.replace(temporary, path)


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


def write_worker_state(run_dir: Path, state: WorkerState) -> None:
    """Worker: publish its progress or outcome."""
    write_json(workers_dir(run_dir) / f"{state.pid}.json", state.to_json())


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
    """Master: forget a worker that exited."""
    for suffix in (".json", ".exit"):
        try:
            (workers_dir(run_dir) / f"{pid}{suffix}").unlink()
        except FileNotFoundError:
            pass


def write_exit_reason(run_dir: Path, pid: int, reason: str) -> None:
    """Worker: leave the reason of an orderly exit for the master to read."""
    try:
        (workers_dir(run_dir) / f"{pid}.exit").write_text(reason)
    except OSError:
        pass  # the master then counts the exit as "killed"


def read_exit_reason(run_dir: Path, pid: int) -> str:
    """Master: the reason a worker left, or "" if it left none (SIGKILL, crash, OOM)."""
    try:
        return (workers_dir(run_dir) / f"{pid}.exit").read_text().strip()
    except OSError:
        return ""
