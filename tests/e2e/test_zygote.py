"""Workers forked by the zygote, against a real gunicorn: they serve, are reaped, heartbeat and time out like any worker.

The zygote's faults (killed under load, an import that fails) cost no request: the master forks
workers itself meanwhile. HUP starts a new zygote before the new workers fork. The tests share
one server and leave it with two loaded workers and a ready zygote.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.harness import Server, pid_alive, wait_until
from tests.support.metrics import samples, settled_samples, value
from tests.support.models import copy_models
from tests.support.traffic import BODY, Traffic

TIMEOUT = 6  # gunicorn's heartbeat timeout for this server: a stopped worker is killed after it


@pytest.fixture(scope="module")
def server(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """2 workers forked by the zygote, serving the test MLP."""
    root = tmp_path_factory.mktemp("zygote")
    server = Server(models_dir=copy_models(model_repo, root / "models", "mlp"), run_dir=root / "run", workers=2,
                    extra_args=["--timeout", str(TIMEOUT)]).start()
    wait_until(server.zygote, 30, "the zygote")
    yield server
    server.stop()


def forks(server: Server, by: str) -> float:
    return value(samples(server), "forkserve_worker_forks_total", by=by)


def parent(pid: int) -> int:
    return int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("PPid:")))


def maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def predict(server: Server) -> list:
    response = server.post("/v1/models/mlp:predict", json=BODY)
    assert response.status_code == 200, response.text
    return response.json()["predictions"]


def zygote_ready_again(server: Server, old: int | None) -> int:
    """The pid of a zygote other than `old` once it said it is ready."""
    def ready() -> int | None:
        pid = server.zygote()
        return pid if pid not in (None, old) and f"zygote {pid} ready" in server.log() else None
    return wait_until(ready, 120, "a new zygote to be ready")


def test_workers_fork_from_the_zygote_are_the_masters_children_and_serve(server: Server) -> None:
    master, zygote = server.process.pid, server.zygote()
    assert zygote is not None and parent(zygote) == master
    assert forks(server, "zygote") >= 2 and forks(server, "master") == 0
    for pid in server.worker_pids():
        assert parent(pid) == master  # reparented at once: gunicorn waits on it as its own
        assert Path(f"/proc/{pid}/comm").read_text().strip() != "fs-zygote"
    assert "libtensorflow" in maps(zygote)
    for library in ("libtensorflow", "_pywrap_tensorflow", "cygrpc", "opentelemetry"):
        assert library not in maps(master)
    first = predict(server)
    assert len(first) == 2 and all(len(row) == len(first[0]) for row in first)
    assert all(predict(server) == first for _ in range(6))  # both workers answer, the same


def test_a_killed_worker_is_reaped_and_replaced_from_the_zygote(server: Server) -> None:
    before = forks(server, "zygote")
    victim = server.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    server.wait_reaped(victim)
    assert not pid_alive(victim)  # reaped by the master, no zombie left
    server.wait_workers_loaded(2, 60)
    wait_until(lambda: forks(server, "zygote") == before + 1, 15, "the replacement counted as the zygote's")
    assert "Worker (pid:%d) was sent SIGKILL" % victim in server.log()


def test_a_stalled_worker_times_out_like_any_other(server: Server) -> None:
    before = value(samples(server), "forkserve_worker_exits_total", reason="timeout")
    victim = server.worker_pids()[0]
    os.kill(victim, signal.SIGSTOP)  # its heartbeat stops: the master's murder_workers must see the zygote's worker's file
    try:
        wait_until(lambda: not pid_alive(victim), 6 * TIMEOUT, "the master to kill the stalled worker")
    finally:
        if pid_alive(victim):
            os.kill(victim, signal.SIGKILL)
    assert f"WORKER TIMEOUT (pid:{victim})" in server.log()
    settled_samples(server, lambda s: value(s, "forkserve_worker_exits_total", reason="timeout") == before + 1,
                    "the timeout counted")
    server.wait_workers_loaded(2, 60)


def test_ttin_and_ttou_add_and_remove_a_zygote_worker(server: Server) -> None:
    before, pids = forks(server, "zygote"), set(server.worker_pids())
    os.kill(server.process.pid, signal.SIGTTIN)
    extra = wait_until(lambda: set(server.worker_pids()) - pids, 60, "a third worker")
    assert forks(server, "zygote") == before + 1
    os.kill(server.process.pid, signal.SIGTTOU)
    wait_until(lambda: len(server.children()) == 2, 60, "back to two workers")
    assert all(not pid_alive(pid) for pid in extra) or set(server.worker_pids()) != pids | extra


def test_sigkill_of_the_zygote_under_load_loses_no_request(server: Server) -> None:
    zygote = server.zygote()
    before_master = forks(server, "master")
    traffic = Traffic(f"{server.url}/v1/models/mlp:predict")
    traffic.start(4)
    try:
        os.kill(zygote, signal.SIGKILL)
        wait_until(lambda: "forkserve: the zygote (pid %d) failed" % zygote in server.log(), 15, "the master to see it")
        server.restart_worker(signal.SIGTERM, 120)  # forked by the master while no zygote is ready
        assert forks(server, "master") == before_master + 1
        zygote_ready_again(server, zygote)
        server.restart_worker(signal.SIGTERM, 60)  # and from the new zygote again
    finally:
        traffic.finish()
    assert len(traffic.answers) > 20 and traffic.failures() == []
    assert forks(server, "master") == before_master + 1
    assert value(samples(server), "forkserve_zygote_faults_total", kind="exited") >= 1


def test_hup_starts_a_new_zygote_before_the_new_workers(server: Server) -> None:
    zygote, old_workers = server.zygote(), set(server.worker_pids())
    before = forks(server, "zygote")
    os.kill(server.process.pid, signal.SIGHUP)
    new = zygote_ready_again(server, zygote)
    wait_until(lambda: len(server.worker_pids()) == 2 and not set(server.worker_pids()) & old_workers, 120,
               "every worker replaced")
    assert not pid_alive(zygote)
    assert forks(server, "zygote") >= before + 2  # the new workers came from the new zygote
    log = server.log()
    assert log.index(f"zygote {new} ready") < log.index("rollout", log.index("rolling restart requested (SIGHUP)"))


@pytest.fixture()
def failing_module(tmp_path: Path) -> Path:
    """A module on the zygote's path whose import fails, as a broken TensorFlow install would."""
    (tmp_path / "forkserve_broken_preload.py").write_text("raise ImportError('libtensorflow_framework.so.2: cannot open shared object file')\n")
    return tmp_path


def test_a_zygote_that_cannot_import_falls_back_and_logs_once(server: Server, model_repo: Path, tmp_path: Path,
                                                              failing_module: Path) -> None:
    fallback = Server(models_dir=copy_models(model_repo, tmp_path / "models", "mlp"), run_dir=tmp_path / "run", workers=1,
                      env={"FORKSERVE_ZYGOTE_PRELOAD": "forkserve_broken_preload",
                           "PYTHONPATH": os.pathsep.join(filter(None, [str(failing_module), os.environ.get("PYTHONPATH")]))})
    try:
        fallback.start()
        assert fallback.get("/readyz").status_code == 200
        assert predict(fallback) == predict(server)  # a master-forked worker answers as a zygote-forked one
        wait_until(lambda: value(samples(fallback), "forkserve_zygote_faults_total", kind="import_failed") >= 2, 60,
                   "the zygote tried again after its backoff")
        assert value(samples(fallback), "forkserve_worker_forks_total", by="master") == 1
        assert fallback.log().count("the zygote (pid") == 1  # logged once, not at every retry
        assert "cannot import forkserve_broken_preload: ImportError: libtensorflow_framework.so.2" in fallback.log()
    finally:
        fallback.stop()


def test_zygote_off_forks_every_worker_from_the_master(model_repo: Path, tmp_path: Path) -> None:
    plain = Server(models_dir=copy_models(model_repo, tmp_path / "models", "mlp"), run_dir=tmp_path / "run", workers=1,
                   env={"FORKSERVE_ZYGOTE": "0"}).start()
    try:
        assert plain.zygote() is None
        scrape = samples(plain)
        assert value(scrape, "forkserve_worker_forks_total", by="zygote") == 0
        assert value(scrape, "forkserve_worker_forks_total", by="master") == 1
        worker = plain.worker_pids()[0]
        assert "libtensorflow" not in maps(plain.process.pid) and "libtensorflow" in maps(worker)
    finally:
        plain.stop()
