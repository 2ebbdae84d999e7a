"""The master's side of the zygote against real forked processes that play a zygote: ready, failing, hanging, dying."""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from server.master import zygote as master_zygote
from server.master.zygote import READY, STARTING, WAITING, Zygote
from tests.support.harness import pid_alive, wait_until


def ready_then_silent(arbiter: Any, channel: socket.socket, *_: Any) -> None:
    """Reports ready, then reads fork requests and never answers them (a hung zygote)."""
    channel.send(json.dumps({"ready": True, "seconds": 0.0, "threads": 1, "objects": 0}).encode())
    while channel.recv(65536):
        pass


def cannot_import(arbiter: Any, channel: socket.socket, *_: Any) -> None:
    channel.send(json.dumps({"error": "cannot import tensorflow: ImportError: no"}).encode())


def hangs_importing(*_: Any) -> None:
    while True:
        time.sleep(60)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def __call__(self, event: str, detail: str) -> None:
        self.events.append((event, detail))


@pytest.fixture()
def made() -> Any:
    """Zygotes made by a test, stopped after it (their processes killed and reaped)."""
    zygotes: list[Zygote] = []

    def make(entry: Any, **knobs: Any) -> Zygote:
        zygote = Zygote(SimpleNamespace(wakeup=lambda: None), (), {}, entry=entry, record=Recorder(), **knobs)
        zygotes.append(zygote)
        return zygote

    yield make
    for zygote in zygotes:
        zygote.stop()


def fake_worker() -> SimpleNamespace:
    return SimpleNamespace(age=1, forkserve_slot=None, forkserve_cpus=None, tmp=tempfile.TemporaryFile())


def renew_while_the_master_loops(zygote: Zygote) -> bool:
    """renew() from this thread while another plays the master's loop, which tends the zygote at each pass."""
    done = threading.Event()

    def main_loop() -> None:
        while not done.is_set():
            zygote.tend()
            time.sleep(0.02)

    loop = threading.Thread(target=main_loop)
    loop.start()
    try:
        return zygote.renew(10)
    finally:
        done.set()
        loop.join()


def test_a_zygote_that_reports_ready_is_ready(made: Any) -> None:
    zygote = made(ready_then_silent)
    zygote.start()
    assert zygote.state == STARTING
    assert zygote.wait_ready(10, interrupted=lambda: False)
    assert zygote.state == READY and zygote.starts == 1 and pid_alive(zygote.pid)


def test_an_import_failure_is_logged_once_and_retried_with_a_growing_backoff(made: Any, caplog: pytest.LogCaptureFixture) -> None:
    zygote = made(cannot_import)
    with caplog.at_level(logging.DEBUG, "forkserve.zygote"):
        zygote.start()
        assert not zygote.wait_ready(10, interrupted=lambda: False)
        assert zygote.state == WAITING and zygote.failures == 1
        first_delay = zygote.retry_at - time.monotonic()
        zygote.retry_at = 0.0  # the backoff has passed
        zygote.tend()  # starts it again
        zygote.wait_ready(10, interrupted=lambda: False)
    assert zygote.failures == 2 and zygote.retry_at - time.monotonic() > first_delay
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot import tensorflow: ImportError: no" in warnings[0].getMessage()
    assert zygote.record.events == [("fault", "import_failed")] * 2


def test_an_import_failure_reaped_before_its_report_was_read_is_still_an_import_failure(made: Any) -> None:
    zygote = made(cannot_import)
    zygote.start()
    wait_until(lambda: _exited(zygote.pid), 10, "its exit")
    zygote.reap()  # SIGCHLD first, as gunicorn's loop may take it before the channel is read
    assert zygote.state == WAITING and zygote.record.events == [("fault", "import_failed")]


def _exited(pid: int) -> bool:
    """Whether the child `pid` is a zombie now (exited, not yet reaped)."""
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_zygote_that_hangs_while_importing_is_killed_at_its_deadline(made: Any) -> None:
    zygote = made(hangs_importing, start_timeout=0.5)
    zygote.start()
    pid = zygote.pid
    assert not zygote.wait_ready(0.6, interrupted=lambda: False)
    wait_until(lambda: zygote.tend() or zygote.state == WAITING, 5, "the start deadline")
    assert not pid_alive(pid) and ("fault", "start_timeout") in zygote.record.events


def test_a_signal_for_the_master_ends_the_wait_for_a_starting_zygote(made: Any) -> None:
    zygote = made(hangs_importing)
    zygote.start()
    started = time.monotonic()
    assert not zygote.wait_ready(30, interrupted=lambda: True)
    assert time.monotonic() - started < 5 and zygote.state == STARTING


def test_a_ready_zygote_that_dies_is_noticed_and_its_exit_collected(made: Any) -> None:
    zygote = made(ready_then_silent)
    zygote.start()
    zygote.wait_ready(10, interrupted=lambda: False)
    pid = zygote.pid
    os.kill(pid, 9)
    wait_until(lambda: zygote.tend() or zygote.state == WAITING, 5, "the master to notice")
    assert ("fault", "exited") in zygote.record.events and not pid_alive(pid)
    assert zygote.fork(fake_worker(), take=lambda pid: None) is None  # the master forks itself meanwhile


def test_a_fork_request_without_answer_gives_up_and_never_lets_a_late_worker_run(made: Any) -> None:
    zygote = made(ready_then_silent, fork_timeout=0.3)
    zygote.start()
    zygote.wait_ready(10, interrupted=lambda: False)
    taken: list[int] = []
    assert zygote.fork(fake_worker(), take=taken.append) is None
    assert taken == [] and zygote.state == WAITING and ("fault", "fork_timeout") in zygote.record.events


def test_renew_replaces_a_ready_zygote_from_another_thread(made: Any) -> None:
    zygote = made(ready_then_silent)
    zygote.start()
    zygote.wait_ready(10, interrupted=lambda: False)
    old = zygote.pid
    assert renew_while_the_master_loops(zygote)
    assert zygote.pid != old and zygote.state == READY and not pid_alive(old)


def test_renew_answers_false_when_the_new_zygote_cannot_start(made: Any) -> None:
    zygote = made(cannot_import)
    assert renew_while_the_master_loops(zygote) is False
    assert zygote.state == WAITING


def test_a_subreaper_adopts_the_worker_its_zygote_double_forked() -> None:
    """In a child process (it changes the process it runs in): the grandchild's parent becomes the subreaper."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(read_end)
            ok = master_zygote.become_subreaper()
            middle = os.fork()
            if middle == 0:
                first_parent = os.getpid()
                if os.fork() == 0:  # the worker: waits until its first parent is gone, reports its parent
                    wait_until(lambda: os.getppid() != first_parent, 5, "reparenting", interval=0.01)
                    os.write(write_end, f"{ok} {os.getppid()}".encode())
                os._exit(0)
            os.waitpid(middle, 0)
            wait_until(lambda: _reap_any(), 5, "the adopted worker's exit")
        finally:
            os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 100).decode()
    os.close(read_end)
    os.waitpid(child, 0)
    assert answer == f"True {child}"


def _reap_any() -> bool:
    try:
        return os.waitpid(-1, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True
