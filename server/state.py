"""Per-worker state files in the run directory: how the master learns what a worker serves.

A worker writes `<run_dir>/workers/<pid>.json` once its models are loaded and warm; the master
(child_exit) removes it when the worker is gone. Written by rename, so a reader never sees half.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


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


def write_worker_state(run_dir: Path, pid: int, state: dict[str, Any]) -> Path:
    """Atomically publish one worker's state."""
    target = workers_dir(run_dir) / f"{pid}.json"
    write_json(target, state)
    return target


def remove_worker_state(run_dir: Path, pid: int) -> None:
    """Forget a worker that exited."""
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


def read_worker_states(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Every published worker state by pid."""
    states = {}
    directory = workers_dir(run_dir)
    if not directory.is_dir():
        return states
    for path in directory.glob("*.json"):
        state = read_json(path)  # None: removed while reading
        if state is not None and path.stem.isdigit():
            states[int(path.stem)] = state
    return states
