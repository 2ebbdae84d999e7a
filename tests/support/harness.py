"""Start and stop a real forkserve (gunicorn) process for end-to-end tests."""

from __future__ import annotations

import os
import pwd
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests

from server.state import read_worker_states

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = Path(sys.executable).with_name("gunicorn")
ZYGOTE_NAME = "fs-zygote"  # server.spawn.zygote.NAME


PORTS_PER_PROCESS = 2000  # each pytest-xdist worker draws from a block of its own, below the kernel's ephemeral range
FIRST_PORT = 12000


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody uses right now, that no outgoing connection and no other test process will take.

    A port the kernel hands out (bind to 0) comes from the ephemeral range, which every outgoing
    connection draws from too: one could take it in the second between the choice and gunicorn's
    bind. Below that range (32768 here) and in this process's own block, nothing else does.
    """
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    first = FIRST_PORT + worker * PORTS_PER_PROCESS
    for port in random.sample(range(first, first + PORTS_PER_PROCESS), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port with connections in TIME_WAIT is skipped too
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}..{first + PORTS_PER_PROCESS - 1}")


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `condition` until it returns something truthy or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def memory_kib(pid: int, field: str = "VmRSS") -> int:
    """A /proc/PID/status memory field in KiB: VmRSS now, VmHWM the peak (since `echo 5 > /proc/PID/clear_refs`)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith(f"{field}:")))


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """Live processes (zombies excluded) of the process group `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


@dataclass
class Server:
    """One gunicorn master started from the repository root with gunicorn.conf.py."""

    models_dir: Path
    run_dir: Path
    conf_path: Path | None = None
    workers: int = 2
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None  # run as this user (setpriv; its directories must be reachable by it)
    port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)  # FORKSERVE_GRPC_BIND (env can override it, "" turns gRPC off)
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    root: Path = ROOT  # the checkout whose gunicorn.conf.py and server package run (bench.grpc_ab: another commit's)
    tls_ca: Path | None = None  # the server speaks TLS (FORKSERVE_TLS_* in env): get() and post() verify against this CA
    tls_client: tuple[str, str] | None = None  # ... and present this client certificate and key (mutual TLS)
    tfserving_flags: list[str] | None = None  # start with `python -m server tfserving` and these flags (ports added)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_ca else 'http'}://127.0.0.1:{self.port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout: float = 180.0) -> "Server":
        """Start gunicorn in a session of its own and wait until every worker has loaded (timeout 0: do not wait).

        Its own session makes the master's pid the group of every worker, so a failed start and stop() can
        kill them all; a start that fails or times out kills the group before it raises.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_path or self.run_dir / "gunicorn.log"
        env = {
            **os.environ,
            "FORKSERVE_MODELS": str(self.models_dir),
            "FORKSERVE_RUN_DIR": str(self.run_dir),
            "FORKSERVE_CONF": str(self.conf_path or self.run_dir / "no-models.toml"),
            "FORKSERVE_GRPC_BIND": f"127.0.0.1:{self.grpc_port}",
            **self.env,
        }
        command = [
            str(GUNICORN), "-c", "gunicorn.conf.py",
            "-b", f"127.0.0.1:{self.port}", "-w", str(self.workers), *self.extra_args,
        ]
        if self.tfserving_flags is not None:  # NOTE: the launcher execs gunicorn: self.process is the master
            command = [sys.executable, "-m", "server", "tfserving", f"--port={self.grpc_port}",
                       f"--rest_api_port={self.port}", *self.tfserving_flags]
            env["FORKSERVE_WORKERS"] = str(self.workers)
        if self.user is not None:
            account = pwd.getpwnam(self.user)
            command = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups", *command]
            env["HOME"] = str(self.run_dir)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        if timeout:
            try:
                self.wait_workers_loaded(self.workers, timeout)
            except BaseException:
                self.kill()
                raise
        return self

    def worker_pids(self) -> list[int]:
        """Live workers that finished loading (and so accept requests)."""
        return sorted(pid for pid, state in read_worker_states(self.run_dir).items() if state.loaded and pid_alive(pid))

    def serving(self, model: str) -> dict[int, list[int]]:
        """pid -> the versions of `model` each live, loaded worker serves."""
        states = read_worker_states(self.run_dir)
        return {pid: states[pid].serving(model) for pid in self.worker_pids() if pid in states}

    def all_serve(self, model: str, versions: list[int], count: int | None = None) -> bool:
        """Exactly `count` (default: self.workers) live workers, each serving exactly `versions` of `model`."""
        serving = self.serving(model)
        return len(serving) == (self.workers if count is None else count) and all(v == versions for v in serving.values())

    def children(self) -> list[int]:
        """Every live worker process of the master (workers still loading included), not its zygote."""
        return sorted(pid for pid, name in self._live_children() if name != ZYGOTE_NAME)

    def zygote(self) -> int | None:
        """The live zygote (server.spawn.zygote), the master's child named fs-zygote; None when there is none."""
        return next((pid for pid, name in self._live_children() if name == ZYGOTE_NAME), None)

    def _live_children(self) -> list[tuple[int, str]]:
        """(pid, /proc comm name) of every live child of the master."""
        assert self.process is not None
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name, _, rest = stat.partition(" (")[2].rpartition(")")
            fields = rest.split()
            if int(fields[1]) == self.process.pid and fields[0] != "Z":
                found.append((int(entry.name), name))
        return found

    def wait_reaped(self, pid: int, timeout: float = 30.0) -> None:
        """Wait until the master has handled the worker's exit (child_exit removed its state file)."""
        wait_until(lambda: pid not in read_worker_states(self.run_dir), timeout, f"the master to reap worker {pid}")

    def restart_worker(self, sig: int = signal.SIGTERM, timeout: float = 180.0) -> int:
        """Stop one worker with `sig`, wait for gunicorn's replacement to load; returns the new pid."""
        before = self.worker_pids()
        victim = before[0]
        os.kill(victim, sig)
        self.wait_reaped(victim)
        pids = self.wait_workers_loaded(len(before), timeout)
        return next(pid for pid in pids if pid not in before)

    def wait_workers_loaded(self, count: int, timeout: float = 180.0) -> list[int]:
        """Wait until `count` live workers have loaded, failing early if the master died."""

        def loaded() -> list[int] | None:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.process.returncode}:\n{self.log()}")
            pids = self.worker_pids()
            return pids if len(pids) >= count else None

        return wait_until(loaded, timeout, f"{count} forkserve workers to load")

    def log(self) -> str:
        """Everything gunicorn wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int | None:
        """Graceful stop (TERM to the master), KILL if it does not exit in time; then KILL what is left of its group."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        self._kill_group()  # workers that outlive their master (stopped, killed master) would leak otherwise
        return self.process.returncode

    def kill(self) -> None:
        """KILL the master and every process of its group at once, and reap the master."""
        if self.process is None:
            return
        self._kill_group()
        self.process.wait(30)

    def _kill_group(self) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group is empty: every process of it has exited
            return
        wait_until(lambda: not group_members(self.process.pid), 30, f"process group {self.process.pid} to exit")

    def _options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs.setdefault("timeout", 30)
        if self.tls_ca is not None:
            kwargs.setdefault("verify", str(self.tls_ca))
            kwargs.setdefault("cert", self.tls_client)
        return kwargs

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.get(self.url + path, **self._options(kwargs))

    def post(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.post(self.url + path, **self._options(kwargs))
