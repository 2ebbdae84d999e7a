"""A full or read-only run directory costs state files and metrics, never the master or a worker's boot.

The run directory is a small tmpfs of its own (tests.support.filesystems: root only), shared by one
2-worker server for the module; each test leaves it writable and with space again.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.filesystems import filled, mount_tmpfs, read_only, tmpfs, unmount
from tests.support.harness import GUNICORN, ROOT, Server, free_port, pid_alive, wait_until
from tests.support.models import copy_models

BODY = {"instances": [[0.5] * 20]}
BOOT_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("tmpfs") / "run"
    mount_tmpfs(where, "24m")
    yield where
    unmount(where)


@pytest.fixture(scope="module")
def server(model_repo: Path, run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("run-dir-faults")
    instance = Server(models_dir=copy_models(model_repo, home / "models", "mlp"), run_dir=run_dir, workers=2)
    instance.log_path = home / "gunicorn.log"  # outside the run directory: the log must always work
    instance.start()
    yield instance
    assert instance.stop() == 0, instance.log()[-3000:]


def booted_worker(server: Server, before: set[int]) -> int:
    """The worker forked after `before` once it logged that it loaded its models (it may have no state file)."""

    def ready() -> int | None:
        assert server.process is not None
        if server.process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {server.process.returncode}:\n{server.log()[-5000:]}")
        for pid in set(server.children()) - before:
            if f"forkserve worker {pid} ready" in server.log():
                return pid
        return None

    return wait_until(ready, BOOT_TIMEOUT, "a new worker to load its models")


@contextmanager
def only(server: Server, pid: int) -> Iterator[None]:
    """Every other worker stopped (SIGSTOP) for the duration: `pid` alone accepts connections."""
    others = [other for other in server.children() if other != pid]
    for other in others:
        os.kill(other, signal.SIGSTOP)
    try:
        yield
    finally:
        for other in others:
            os.kill(other, signal.SIGCONT)


def problem_lines(server: Server) -> list[str]:
    """The run-directory problems the server logged, without their time stamps."""
    return [re.sub(r"^\[[^]]*\] ", "", line) for line in server.log().splitlines() if "cannot write" in line]


def assert_serves_until_booted(server: Server, before: set[int]) -> int:
    """Requests succeed (on the workers left) while a new worker boots; returns the new worker once it is ready."""
    new: list[int] = []

    def answered_and_booted() -> bool:
        answer = server.post("/v1/models/mlp:predict", json=BODY)
        assert answer.status_code == 200, answer.text
        booted = [pid for pid in set(server.children()) - before if f"forkserve worker {pid} ready" in server.log()]
        new.extend(booted)
        return bool(booted)

    wait_until(answered_and_booted, BOOT_TIMEOUT, "a new worker to load its models", interval=0.05)
    return new[0]


def test_full_run_dir_then_kill_9_a_worker(server: Server, run_dir: Path) -> None:
    """The master folds the dead worker's metrics into a full tmpfs and lives; the replacement boots and serves."""
    victim, other = server.children()
    with filled(run_dir):
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: victim not in server.children(), 30, "the master to reap the worker")
        replacement = assert_serves_until_booted(server, {victim, other})
        assert server.process.poll() is None
        with only(server, replacement):
            for _ in range(3):
                assert server.post("/v1/models/mlp:predict", json=BODY).status_code == 200
        assert pid_alive(replacement) and pid_alive(other) and server.process.poll() is None
    lines = problem_lines(server)
    assert any(f"workers/{replacement}.json" in line and "No space left on device" in line for line in lines), lines
    assert len(lines) == len(set(lines)), lines  # once per kind of problem in each process
    # Space again: the replacement's state file follows, and the master sees both workers loaded.
    assert replacement in server.wait_workers_loaded(2, 60)
    assert server.get("/metrics").status_code == 200


def test_full_run_dir_when_a_worker_boots_ttin(server: Server, run_dir: Path) -> None:
    """One more worker (TTIN) on a full run directory boots once, serves and stays: no crash loop."""
    assert server.process is not None
    before = set(server.children())
    with filled(run_dir):
        os.kill(server.process.pid, signal.SIGTTIN)
        extra = booted_worker(server, before)
        with only(server, extra):
            for _ in range(3):
                assert server.post("/v1/models/mlp:predict", json=BODY).status_code == 200
        assert set(server.children()) == before | {extra}  # nothing else forked: it never died
        assert server.process.poll() is None
        os.kill(server.process.pid, signal.SIGTTOU)
        wait_until(lambda: len(server.children()) == len(before), 60, "the master to retire a worker")
    assert server.process.poll() is None
    assert sorted(server.wait_workers_loaded(2, 60)) == server.children()


def test_read_only_run_dir_then_kill_9_a_worker(server: Server, run_dir: Path) -> None:
    """EROFS everywhere in the run directory: the master reaps, forks a replacement that serves, and lives."""
    victim, other = server.children()
    with read_only(run_dir):
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: victim not in server.children(), 30, "the master to reap the worker")
        replacement = assert_serves_until_booted(server, {victim, other})
        with only(server, replacement):
            assert server.post("/v1/models/mlp:predict", json=BODY).status_code == 200
        assert server.process.poll() is None
    lines = problem_lines(server)
    assert any(f"workers/{replacement}.json" in line and "Read-only file system" in line for line in lines), lines
    assert len(lines) == len(set(lines)), lines
    assert replacement in server.wait_workers_loaded(2, 60)


def target_errors(server: Server) -> float:
    """forkserve_run_dir_write_errors_total{file="target"}: the master's rollout passes the run directory refused."""
    for line in server.get("/metrics").text.splitlines():
        if line.startswith('forkserve_run_dir_write_errors_total{file="target"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_reload_while_the_run_dir_is_full_waits_for_space(server: Server, run_dir: Path) -> None:
    """No rollout starts while the master cannot publish its target; the reload asked for meanwhile runs after."""
    assert server.process is not None
    old = server.wait_workers_loaded(2, BOOT_TIMEOUT)
    with filled(run_dir):
        before = target_errors(server)
        os.kill(server.process.pid, signal.SIGHUP)
        wait_until(lambda: target_errors(server) >= before + 3, 60, "three rollout passes held back")
        assert "forkserve: rollout " not in server.log() and server.children() == old
    wait_until(lambda: not set(old) & set(server.worker_pids()) and len(server.worker_pids()) == 2, BOOT_TIMEOUT,
               "the reload to replace both workers")
    assert "forkserve: rollout " in server.log() and server.process.poll() is None


@pytest.mark.parametrize("state", ["read-only", "full"])
def test_start_on_an_unwritable_run_dir_is_one_line(tmp_path: Path, state: str) -> None:
    """Refused in one line naming the directory and the error, with nothing left behind."""
    with tmpfs(tmp_path / "small") as where, filled(where) if state == "full" else read_only(where):
        for given in (where, where / "run"):
            env = {**os.environ, "FORKSERVE_RUN_DIR": str(given), "FORKSERVE_MODELS": str(tmp_path)}
            done = subprocess.run([str(GUNICORN), "-c", "gunicorn.conf.py", "-b", f"127.0.0.1:{free_port()}"],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
            output = done.stdout + done.stderr
            assert done.returncode != 0 and "Traceback" not in output, output
            assert f"cannot start: run directory {given}" in output, output
            error = "Read-only file system" if state == "read-only" else "No space left on device"
            assert error in output and len(output.strip().splitlines()) == 1, output
            assert sorted(p.name for p in where.iterdir()) == (["filler"] if state == "full" else [])
