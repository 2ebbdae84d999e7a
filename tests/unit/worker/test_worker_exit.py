"""How a worker leaves: never with gunicorn's boot codes once its app loaded, and with the real reason for the master."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from server.worker.hooks import exit_code, exit_reason

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("code", [3, 4, 259, 260, -253])  # the exit status is the low byte: 259 leaves as 3
def test_a_worker_past_its_boot_never_leaves_with_a_boot_error_code(code: int) -> None:
    assert exit_code(SystemExit(code), booted=True) == 1
    assert exit_code(SystemExit(code), booted=False) == code  # the app itself cannot load: gunicorn halts, as it should


def test_other_codes_are_kept_after_boot() -> None:
    assert exit_code(SystemExit(0), booted=True) == 0 and exit_code(SystemExit(-1), booted=True) == -1
    assert exit_code(SystemExit(2), booted=True) == 2 and exit_code(KeyboardInterrupt(), booted=True) == 1


def raised_while_handling(error: BaseException, code: int = -1) -> SystemExit:
    """gunicorn's spawn_worker: an exception in the worker becomes sys.exit(-1) (or 3 before boot)."""
    try:
        try:
            raise error
        except BaseException:
            sys.exit(code)
    except SystemExit as exit_:
        return exit_


@pytest.mark.parametrize(("error", "stopping", "reason"), [
    (SystemExit(0), True, "graceful"),  # TERM, QUIT, max_requests: alive is False, then sys.exit(0)
    (None, True, "graceful"),
    (SystemExit(0), False, "exit(0)"),  # nobody asked it to stop
    (SystemExit(3), False, "exit(3)"),
    (SystemExit(1), True, "exit(1)"),
    (SystemExit("bye"), False, "exit(1)"),
    (KeyboardInterrupt(), False, "error"),
    (raised_while_handling(RuntimeError("main loop")), False, "error"),
    (raised_while_handling(RuntimeError("main loop")), True, "error"),
    (raised_while_handling(OSError("a stop's sys.exit(0) came while this was handled"), 0), True, "graceful"),
])
def test_the_reason_says_what_happened_graceful_only_for_an_orderly_stop(error, stopping: bool, reason: str) -> None:
    assert exit_reason(error, stopping) == reason


WORKER = """
import os, sys, types
from server.worker.hooks import worker_exit

log = types.SimpleNamespace(error=lambda *args: print("logged:", args[0] % args[1:], flush=True))
worker = types.SimpleNamespace(pid={pid}, alive={alive}, wsgi=object(), log=log)
"""
IN_FLIGHT = """
try:
    {statement}
finally:
    worker_exit(None, worker)  # gunicorn's spawn_worker, with the worker's exit in flight
"""
KILL_WORKER_ESRCH = """
try:
    os.kill(worker.pid, 0)
except OSError:
    worker_exit(None, worker)  # gunicorn's kill_worker, in the master, for a pid that is gone
print("the master goes on", flush=True)
"""


def run_worker_exit(tmp_path: Path, code: str, alive: bool = True, pid: str = "os.getpid()") -> subprocess.CompletedProcess:
    (tmp_path / "workers").mkdir(exist_ok=True)
    script = WORKER.format(pid=pid, alive=alive) + textwrap.dedent(code)
    env = {**os.environ, "FORKSERVE_RUN_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def exit_files(tmp_path: Path) -> list[str]:
    return [path.read_text() for path in (tmp_path / "workers").glob("*.exit")]


def test_a_handlers_sys_exit_3_escaping_a_worker_costs_that_worker_only(tmp_path: Path) -> None:
    done = run_worker_exit(tmp_path, IN_FLIGHT.format(statement="sys.exit(3)"))
    assert done.returncode == 1, done.stderr
    assert exit_files(tmp_path) == ["exit(3)"]
    assert "leaves with exit code 1 (exit(3)): SystemExit: 3" in done.stdout


def test_an_orderly_stop_is_graceful(tmp_path: Path) -> None:
    done = run_worker_exit(tmp_path, IN_FLIGHT.format(statement="sys.exit(0)"), alive=False)
    assert done.returncode == 0 and exit_files(tmp_path) == ["graceful"] and "logged" not in done.stdout


def test_the_master_calling_the_hook_for_a_worker_already_gone_goes_on(tmp_path: Path) -> None:
    done = run_worker_exit(tmp_path, KILL_WORKER_ESRCH, pid="2 ** 22 + 1")  # above pid_max: no such process
    assert done.returncode == 0 and "the master goes on" in done.stdout, (done.returncode, done.stderr)
    assert exit_files(tmp_path) == []
