"""Starting and stopping as people do it: Ctrl-C, a wrong path, a bad config, a busy port, slow loads, stalled clients."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from server.target import read_failed
from tests.support.harness import GUNICORN, ROOT, Server, free_port, pid_alive, wait_until
from tests.support.models import copy_models


def _start_and_fail(tmp_path: Path, env: dict[str, str], args: list[str] = ()) -> tuple[int, str]:
    """Run gunicorn that should refuse to start; (exit code, everything it printed)."""
    run_dir = tmp_path / "run"
    full_env = {**os.environ, "FORKSERVE_RUN_DIR": str(run_dir), "FORKSERVE_MODELS": str(tmp_path), **env}
    done = subprocess.run([str(GUNICORN), "-c", "gunicorn.conf.py", "-b", f"127.0.0.1:{free_port()}", *args],
                          cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def test_a_missing_model_repository_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    code, output = _start_and_fail(tmp_path, {"FORKSERVE_MODELS": str(tmp_path / "nowhere")})
    assert code == 1 and "Traceback" not in output
    assert f"cannot start: model repository {tmp_path / 'nowhere'} is not a directory" in output
    assert not (tmp_path / "run").exists()  # no stale gunicorn.pid left behind


def test_a_bad_config_at_start_is_one_line_and_leaves_no_run_directory(tmp_path: Path) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text('[defaults]\nmax_batch_size = "eight"\n')
    code, output = _start_and_fail(tmp_path, {"FORKSERVE_CONF": str(conf)})
    assert code == 1 and "Traceback" not in output
    assert "cannot start: [defaults]: max_batch_size must be an integer" in output
    assert not (tmp_path / "run").exists()


def test_a_port_in_use_leaves_no_run_directory(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, output = _start_and_fail(tmp_path, {"FORKSERVE_MODELS": str(tmp_path)}, ["-b", f"127.0.0.1:{port}"])
    assert code != 0 and "Connection in use" in output
    assert not (tmp_path / "run").exists()


def test_ctrl_c_stops_everything_at_once_and_a_worker_ignores_sigint(model_repo: Path, tmp_path: Path) -> None:
    server = Server(models_dir=copy_models(model_repo, tmp_path / "models", "mlp"), run_dir=tmp_path / "run",
                    workers=2).start()  # in its own session, as a terminal's foreground job
    try:
        worker = server.worker_pids()[0]
        os.kill(worker, signal.SIGINT)  # alone, a worker leaves SIGINT to the master
        for _ in range(20):
            assert server.post("/v1/models/mlp:predict", json={"instances": [[0.5] * 20]}).status_code == 200
        assert pid_alive(worker) and worker in server.worker_pids()
        started = time.monotonic()
        os.killpg(server.process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        assert server.process.wait(20) == 0
        assert time.monotonic() - started < 10
        log = server.log()
        assert "SIGKILL" not in log and "WORKER TIMEOUT" not in log, log[-2000:]
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["gunicorn.log"]  # the test's own log
    finally:
        server.stop()


def test_loads_longer_than_gunicorn_s_timeout_keep_their_heartbeat(model_repo: Path, tmp_path: Path) -> None:
    # Importing TensorFlow alone takes longer than 2 s here: without the load heartbeat, gunicorn
    # kills every worker it boots.
    server = Server(models_dir=copy_models(model_repo, tmp_path / "models", "mlp", "k3cnn"), run_dir=tmp_path / "run",
                    workers=2, extra_args=["--timeout", "2"]).start()
    try:
        assert server.post("/v1/models/mlp:predict", json={"instances": [[0.5] * 20]}).status_code == 200
        assert "WORKER TIMEOUT" not in server.log()
        assert server.log().count("Booting worker") == 2
    finally:
        server.stop()


def test_a_version_that_hangs_at_first_boot_is_stopped_and_failed(model_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    shutil.copytree(model_repo / "half_plus_two" / "00000123", repo / "hp" / "1")
    shutil.copytree(repo / "hp" / "1", repo / "hp" / "2")
    index = repo / "hp" / "2" / "variables" / "variables.index"
    index.unlink()
    os.mkfifo(index)  # reading it blocks for ever: the load hangs (a hung NFS mount, say)
    server = Server(models_dir=repo, run_dir=tmp_path / "run", workers=1, extra_args=["--timeout", "3"],
                    env={"FORKSERVE_BOOT_TIMEOUT": "12", "FORKSERVE_ROLLOUT_ATTEMPTS": "2",
                         "FORKSERVE_POLL_INTERVAL": "0.5"})
    try:
        server.start(timeout=150)
        assert "died loading it" in read_failed(server.run_dir)["hp"][2].reason
        answer = server.post("/v1/models/hp:predict", json={"instances": [1.0]})
        assert answer.json() == {"predictions": [2.5]} and answer.headers["X-Model-Version"] == "1"
        assert "WORKER TIMEOUT" in server.log()  # gunicorn stopped the stuck workers
    finally:
        server.stop()


def test_a_client_stalled_mid_body_does_not_hold_a_retiring_worker(model_repo: Path, tmp_path: Path) -> None:
    server = Server(models_dir=copy_models(model_repo, tmp_path / "models", "mlp"), run_dir=tmp_path / "run",
                    workers=1, env={"FORKSERVE_CLIENT_TIMEOUT": "2"}).start()
    try:
        stalled = socket.create_connection(("127.0.0.1", server.port))
        stalled.sendall(b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 1000\r\n\r\n{\"instances\": [")
        old = server.worker_pids()
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "server", "reload", "--run-dir", str(server.run_dir)], cwd=ROOT, check=True,
                       capture_output=True, timeout=30)
        wait_until(lambda: server.worker_pids() and not set(old) & set(server.worker_pids()), 120, "the reload")
        assert time.monotonic() - started < 30  # was graceful_timeout (30 s) + gunicorn's kill
        stalled.settimeout(10)
        assert stalled.recv(100).startswith(b"HTTP/1.1 408")
        stalled.close()
        assert "WORKER TIMEOUT" not in server.log()
    finally:
        server.stop()


def test_reload_signals_only_a_forkserve_master(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        refused = subprocess.run([sys.executable, "-m", "server", "reload", "--pid", str(sleeper.pid)],
                                 cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert refused.returncode == 1 and "not a running forkserve master" in refused.stderr
        assert sleeper.poll() is None  # still alive: no SIGHUP was sent
        nothing = subprocess.run([sys.executable, "-m", "server", "reload"], cwd=tmp_path, capture_output=True, text=True,
                                 timeout=30, env={**os.environ, "FORKSERVE_RUN_DIR": str(tmp_path / "none")})
        assert nothing.returncode == 1 and "no running forkserve master" in nothing.stderr
    finally:
        sleeper.kill()
