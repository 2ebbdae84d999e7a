"""The master's repository watcher and readiness-gated rolling restart (no TensorFlow here).

Runs in a thread of the gunicorn master, started by when_ready. Every poll it scans the model
repository, keeps only version directories whose contents did not change since the previous
poll (settled), applies the version policies and, when the result differs from what the
workers serve (or a reload was asked for: `python -m server reload`, or SIGHUP), rolls the
workers one at a time:

    TTIN (one more worker) -> wait until it reports the new target loaded and warm ->
    TTOU (gunicorn retires the oldest worker) -> repeat for every old worker.

A new worker that does not serve the intended versions by the deadline is stopped, the
versions it could not serve are marked failed (failed.json, metric, log line) and the old
workers keep serving. Never more than one extra worker at a time. Signals to the master are
handled by gunicorn's own loop in the main thread; this thread only sends them and waits.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.config import ConfigError, load_config
from server.repository import VersionSource, scan
from server.state import read_worker_states
from server.target import Target, compute_target, mark_failed, read_failed, write_target

log = logging.getLogger("forkserve.rollout")

# NOTE: gunicorn forks workers from the master's main thread while this thread may be writing a
# metric under prometheus_client's global lock; a child forked at that moment would inherit the
# lock held and hang at its first metric. Forks wait for this lock, held around every write here.
_metric_writes = threading.Lock()
os.register_at_fork(before=_metric_writes.acquire, after_in_parent=_metric_writes.release,
                    after_in_child=_metric_writes.release)


def tree_signature(path: Path) -> tuple:
    """What changes when anything under a version directory is written: names, sizes, mtimes."""
    entries = []
    for directory, subdirs, files in os.walk(path):
        subdirs.sort()
        for name in sorted(files):
            try:
                stat = os.stat(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            entries.append((os.path.relpath(os.path.join(directory, name), path), stat.st_size, stat.st_mtime_ns))
    return tuple(entries)


class SettledScanner:
    """Scans the repository and reports only versions unchanged since the previous scan."""

    def __init__(self, models_dir: Path) -> None:
        self.models_dir = models_dir
        self._previous: dict[Path, tuple] = {}

    def scan(self, trust_all: bool = False) -> dict[str, list[VersionSource]]:
        """Versions per model; `trust_all` (first start) takes every directory as settled."""
        found = scan(self.models_dir)
        current = {source.path: tree_signature(source.path) for sources in found.values() for source in sources}
        settled = {
            name: [s for s in sources if trust_all or self._previous.get(s.path) == current[s.path]]
            for name, sources in found.items()
        }
        self._previous = current
        return {name: sources for name, sources in settled.items() if sources or not found[name]}


@dataclass
class RolloutSettings:
    """Knobs of the controller, from Settings."""

    poll_interval: float
    boot_timeout: float


class RolloutController:
    """Watcher and rolling restart, in one thread of the master."""

    def __init__(self, arbiter: Any, models_dir: Path, conf_path: Path, run_dir: Path, knobs: RolloutSettings) -> None:
        self.arbiter = arbiter
        self.models_dir = models_dir
        self.conf_path = conf_path
        self.run_dir = run_dir
        self.knobs = knobs
        self.scanner = SettledScanner(models_dir)
        self.config = load_config(conf_path)
        self.settled: dict[str, list[VersionSource]] = {}
        self.current = self._desired(trust_all=True, reason="start")
        self._wake = threading.Event()
        self._reload_requested = False
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="forkserve-rollout", daemon=True)

    # --- called from gunicorn hooks (master main thread) ---

    def publish_initial_target(self) -> None:
        """Before the first workers fork: they load exactly this."""
        write_target(self.run_dir, self.current)

    def start(self) -> None:
        self._thread.start()

    def request_reload(self, why: str) -> None:
        """Roll every worker even if the target did not change (HUP, `python -m server reload`)."""
        log.info("forkserve: rolling restart requested (%s)", why)
        self._reload_requested = True
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    # --- the thread ---

    def _loop(self) -> None:
        """Poll, and roll when the target changed or a reload was asked for."""
        while not self._stopping:
            self._wake.wait(self.knobs.poll_interval)
            self._wake.clear()
            if self._stopping:
                return
            try:
                desired = self._desired(trust_all=False, reason="repository changed")
                forced, self._reload_requested = self._reload_requested, False
                if forced or desired.generation != self.current.generation:
                    self._roll(desired if not forced else Target(desired.models, "reload"))
            except Exception:  # NOTE: the watcher must outlive any bug in one pass
                log.exception("forkserve: rollout pass failed; old workers keep serving")

    def _desired(self, trust_all: bool, reason: str) -> Target:
        """What the policies select now from settled versions, minus failed ones."""
        try:
            self.config = load_config(self.conf_path)
        except ConfigError as exc:
            log.error("forkserve: %s; keeping the previous configuration", exc)
        self.settled = self.scanner.scan(trust_all)
        return compute_target(self.settled, self.config, read_failed(self.run_dir), reason)

    def _worker_pids(self) -> list[int]:
        """The arbiter's workers, oldest first (read from another thread: copy, retry on change)."""
        while True:
            try:
                workers = list(self.arbiter.WORKERS.items())
                return [pid for pid, worker in sorted(workers, key=lambda item: item[1].age)]
            except RuntimeError:
                continue

    def _roll(self, target: Target) -> None:
        """Replace every worker of the previous target by one of the new, one at a time."""
        from server import metrics

        with _metric_writes:
            metrics.record(lambda: metrics.ROLLOUT_IN_PROGRESS.set(1))
        try:
            result = self._roll_workers(target)
        finally:
            with _metric_writes:
                metrics.record(lambda: metrics.ROLLOUT_IN_PROGRESS.set(0))
                metrics.record(lambda: metrics.ROLLOUTS.labels(result).inc())

    def _roll_workers(self, target: Target) -> str:
        """The rollout itself; returns "succeeded" or "failed"."""
        started = time.monotonic()
        previous = self.current
        log.info(
            "forkserve: rollout %s -> %s (%s): %s", previous.generation, target.generation, target.reason, target.intended()
        )
        write_target(self.run_dir, target)
        for old_pid in self._worker_pids():
            if old_pid not in self._worker_pids():
                continue  # it exited on its own meanwhile; gunicorn's replacement loaded the new target
            new_pid, problem = self._start_new_worker(target)
            if problem:
                self._abort(target, previous, new_pid, problem)
                return "failed"
            self._retire_oldest(old_pid)
        self.current = target
        log.info("forkserve: rollout to %s finished in %.1fs", target.generation, time.monotonic() - started)
        return "succeeded"

    def _start_new_worker(self, target: Target) -> tuple[int | None, str]:
        """TTIN, then wait for the new worker's state; (pid, "") when it serves the target."""
        before = set(self._worker_pids())
        os.kill(os.getpid(), signal.SIGTTIN)
        deadline = time.monotonic() + self.knobs.boot_timeout
        new_pid = None
        while time.monotonic() < deadline and not self._stopping:
            if new_pid is None:
                fresh = set(self._worker_pids()) - before
                new_pid = min(fresh) if fresh else None
            elif new_pid not in self._worker_pids():
                return new_pid, f"new worker {new_pid} exited while loading"
            else:
                state = read_worker_states(self.run_dir).get(new_pid)
                if state is not None and state.get("generation") == target.generation:
                    return new_pid, self._serving_problem(state, target)
            time.sleep(0.2)
        return new_pid, f"new worker {new_pid} was not ready within {self.knobs.boot_timeout:.0f}s"

    @staticmethod
    def _serving_problem(state: dict, target: Target) -> str:
        """'' when the worker serves every intended version, else which ones it does not and why."""
        problems = []
        for model, versions in target.intended().items():
            serving = state.get("serving", {}).get(model, [])
            errors = state.get("models", {}).get(model, {}).get("failed", {})
            for version in versions:
                if version not in serving:
                    problems.append(f"{model} version {version}: {errors.get(str(version), 'not serving')}")
        return "; ".join(problems)

    def _retire_oldest(self, old_pid: int) -> None:
        """TTOU: gunicorn stops its oldest worker gracefully; wait until the master reaped it."""
        os.kill(os.getpid(), signal.SIGTTOU)
        deadline = time.monotonic() + self.arbiter.cfg.graceful_timeout + 10
        while old_pid in self._worker_pids() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _abort(self, target: Target, previous: Target, new_pid: int | None, problem: str) -> None:
        """Stop the new worker, mark what it could not serve as failed, keep the old workers."""
        from server import metrics

        log.error("forkserve: rollout to %s aborted, old workers keep serving: %s", target.generation, problem)
        if new_pid is not None and new_pid in self._worker_pids():
            # NOTE: TTOU stops the worker with the lowest age; make the new one the "oldest".
            self.arbiter.WORKERS[new_pid].age = -1
            os.kill(os.getpid(), signal.SIGTTOU)
            deadline = time.monotonic() + 10  # a worker stuck in a load does not see SIGTERM
            while new_pid in self._worker_pids() and time.monotonic() < deadline:
                time.sleep(0.1)
            if new_pid in self._worker_pids():  # stuck loading: gunicorn's graceful stop cannot reach it
                os.kill(new_pid, signal.SIGKILL)
        old_intended = previous.intended()
        for model, versions in target.intended().items():
            for version in versions:
                if version not in old_intended.get(model, []):
                    mark_failed(self.run_dir, model, version, f"rollout aborted: {problem}")
                    with _metric_writes:
                        metrics.record(lambda m=model, v=version: metrics.ROLLOUT_FAILED_VERSIONS.labels(m, str(v)).inc())
        # The target without the failed versions: workers that start later load what the old ones serve.
        self.current = compute_target(self.settled, self.config, read_failed(self.run_dir), "after aborted rollout")
        write_target(self.run_dir, self.current)
