"""Explicit model control's files in the run directory: load and unload requests, their answers, the repository index.

A worker that takes a load or unload call writes a request (one file per call: no two writers
share a file) and waits for the master's answer; the master reads the requests at its next pass,
rolls the workers over, answers each and removes it. The master also writes the repository index
(every model of the repository with its state) after each pass, in either control mode. Every write
is atomic (server.state.write_json); nothing here imports TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server import run_dir as run_directory
from server import write_errors
from server.state import write_json

REQUESTS = Path("control") / "requests"
ANSWERS = Path("control") / "answers"
INDEX = "repository.json"
RELOAD_CONFIG = "reload_config"  # TF Serving's HandleReloadConfigRequest: override {"model_config": its text form}
ACTIONS = ("load", "unload", RELOAD_CONFIG)
REQUEST_NAME = re.compile(r"^[0-9]{20}-[0-9]+-[0-9a-f]{8}\.json$")  # anything else in the directory is not ours
MAX_FILE_BYTES = 4 * 1024 * 1024  # a request holds a load's config (64 KiB at most) or a reload's; the index, a line per model
MAX_REQUEST_CONFIG_BYTES = MAX_FILE_BYTES - 64 * 1024  # a reload's ModelServerConfig, JSON-encoded (the rest: the request)

# Worker: set by server.worker.gthread once this worker stopped accepting connections for good (a retiring
# worker's load or unload call answers then: server.dataplane.repository). NOTE: here, in the core, because
# gunicorn imports the worker class in the master, which must not import the metrics before on_starting.
STOPPED_ACCEPTING = threading.Event()

# the states Triton's repository index reports
READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"


@dataclass(frozen=True)
class ControlRequest:
    """One load, unload or reload_config call, as its worker asked for it."""

    id: str
    action: str  # "load", "unload" or "reload_config"
    model: str
    override: dict[str, Any] = field(default_factory=dict)  # a models.toml table over the model's settings
    pid: int = 0  # the worker holding the call (the rollout replaces it last)


def ask(run_dir: Path, action: str, model: str, override: dict[str, Any]) -> str:
    """Worker: write a request for the master; returns its id. Raises OSError when the run directory refuses it."""
    request_id = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(4)}"
    write_json(run_dir / REQUESTS / f"{request_id}.json",
               {"action": action, "model": model, "override": override, "pid": os.getpid()}, write_errors.CONTROL)
    return request_id


def waiting(run_dir: Path, taken: set[str]) -> bool:
    """Master: whether a request it has not taken yet waits (one directory read)."""
    try:
        return any(REQUEST_NAME.match(name) and name.removesuffix(".json") not in taken
                   for name in os.listdir(run_dir / REQUESTS))
    except OSError:
        return False


def _read(path: Path) -> Any:
    """A control file's JSON: None unless it is a regular file (no symlink, FIFO or device) of at most MAX_FILE_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            return None
        return json.loads(os.read(fd, MAX_FILE_BYTES + 1))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def pending(run_dir: Path) -> list[ControlRequest]:
    """Master: the requests waiting, oldest first; a file that is not a well-formed request is removed."""
    directory = run_dir / REQUESTS
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        if not REQUEST_NAME.match(name):
            continue
        request = _request(name.removesuffix(".json"), _read(directory / name))
        if request is None:  # NOTE: planted or malformed (a directory, a FIFO, a link): gone, whatever it is
            run_directory.remove_tree(directory / name)
            continue
        found.append(request)
    return found


def _request(request_id: str, data: Any) -> ControlRequest | None:
    """A request read back, or None when it is malformed."""
    if not isinstance(data, dict) or data.get("action") not in ACTIONS or not isinstance(data.get("model"), str):
        return None
    override, pid = data.get("override") or {}, data.get("pid")
    if not isinstance(override, dict) or type(pid) is not int:
        return None
    return ControlRequest(request_id, data["action"], data["model"], override, pid)


def answer(run_dir: Path, request: ControlRequest, ok: bool, message: str, retiring: bool = False) -> None:
    """Master: answer a request, then remove it (a master that stops in between answers it again).

    `retiring`: the worker holding the call is being replaced now (it answers once it stopped accepting).
    """
    write_json(run_dir / ANSWERS / f"{request.id}.json", {"ok": ok, "message": message, "retiring": retiring},
               write_errors.CONTROL)
    run_directory.remove_file(run_dir / REQUESTS / f"{request.id}.json")


def take_answer(run_dir: Path, request_id: str) -> tuple[bool, str, bool] | None:
    """Worker: the master's answer to a request, (ok, message, retiring), removed once read; None while there is none."""
    path = run_dir / ANSWERS / f"{request_id}.json"
    data = _read(path)
    if not isinstance(data, dict):
        return None
    run_directory.remove_file(path)
    return bool(data.get("ok")), str(data.get("message", "")), bool(data.get("retiring"))


def withdraw(run_dir: Path, request_id: str) -> None:
    """Worker, giving up on an answer: the request's files go (the master may still act on it if it read it)."""
    run_directory.remove_file(run_dir / REQUESTS / f"{request_id}.json")
    run_directory.remove_file(run_dir / ANSWERS / f"{request_id}.json")


def clear(run_dir: Path) -> None:
    """Master, at start: requests and answers of a previous master in this run directory are not this one's."""
    run_directory.remove_tree(run_dir / REQUESTS.parent)


def drop_stale_answers(run_dir: Path, max_age: float) -> None:
    """Master: answers no worker took within `max_age` seconds (its worker died or gave up) are removed."""
    directory = run_dir / ANSWERS
    try:
        names = os.listdir(directory)
    except OSError:
        return
    now = time.time()
    for name in names:
        try:
            if REQUEST_NAME.match(name) and now - (directory / name).lstat().st_mtime > max_age:
                run_directory.remove_file(directory / name)
        except OSError:
            continue


def write_index(run_dir: Path, mode: str, models: dict[str, dict[str, Any]]) -> None:
    """Master: every model of the repository: {"state", "reason", "versions"} (state "" for never loaded)."""
    write_json(run_dir / INDEX, {"mode": mode, "models": models}, write_errors.REPOSITORY)


def read_index(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Worker: the models of the repository index as the master last wrote it ({} before its first pass)."""
    data = _read(run_dir / INDEX)
    models = data.get("models") if isinstance(data, dict) else None
    return models if isinstance(models, dict) else {}
