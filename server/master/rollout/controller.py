"""The master's repository watcher and readiness-gated rolling restart: its thread and the main thread's API (no TensorFlow).

Runs in one thread of the gunicorn master, started by when_ready. Every poll it counts the
deaths of workers that were loading a version (.ledger), works out the desired target
(.desired) and, when that differs from what the workers run (versions and configuration: the
target's generation), or a reload was asked for (`python -m server reload`, SIGHUP), or the TLS
files changed (server.master.tls_watch), rolls the workers over to it (.driver) as the rules of
.policy say. Signals to the master are handled by gunicorn's loop in the main thread; this
thread changes the worker count and waits (server.master.fleet).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from server import control
from server.config import ServerConfig
from server.master.fleet import Fleet
from server.master.rollout.control import ModelControl
from server.master.rollout.desired import DesiredState
from server.master.rollout.driver import RollingRestart, RolloutSettings
from server.master.rollout.exits import ExitLog
from server.master.rollout.ledger import FailureLedger
from server.master.rollout.policy import Step, WorkerExit, Workers
from server.master.rollout.record import record_metric
from server.master.strikes import VersionKey
from server.master.tls_watch import TlsWatch
from server.settings import Settings
from server.state import read_worker_states, run_dir_writable
from server.target import Target

if TYPE_CHECKING:  # NOTE: imported only with TF Serving's configuration: protobuf stays out of the master otherwise
    from server.master.model_server_config import ModelServerConfigSource

log = logging.getLogger("forkserve.rollout")

CALL_POLL = 0.25  # seconds between looks for load and unload calls while the thread waits for its next pass


class RolloutController:
    """Watcher and rolling restart, in one thread of the master."""

    def __init__(
        self, fleet: Fleet, models_dir: Path | None, conf_path: Path, run_dir: Path, knobs: RolloutSettings,
        config: ServerConfig, tls_settings: Settings | None = None, model_control: str = "poll",
        load_models: tuple[str, ...] = (), model_server: ModelServerConfigSource | None = None,
        renew_zygote: Callable[[], bool] | None = None,
    ) -> None:
        self.renew_zygote = renew_zygote  # before a rollout of every worker: new workers fork from new code
        self.fleet = fleet  # server.master.hooks pre_fork marks newborn workers through it
        self.run_dir = run_dir
        self.knobs = knobs
        self.tls = TlsWatch(tls_settings, lambda ok: record_metric(
            lambda m: m.TLS_LAST_RELOAD_SUCCESSFUL.set(1 if ok else 0))) if tls_settings is not None and tls_settings.tls else None
        settings_file = "TF Serving's model configuration" if model_server is not None else conf_path.name
        self.ledger = FailureLedger(run_dir, models_dir, settings_file, knobs.attempts)
        self.desired = DesiredState(models_dir, conf_path, config, run_dir, self.ledger, knobs.poll_interval, model_server,
                                    knobs.new_versions)
        self.exits = ExitLog()  # shared with the main thread (worker_exited)
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self.driver = RollingRestart(fleet, run_dir, knobs, self.desired, self.ledger, self.exits, self._stopping)
        self.control = ModelControl(run_dir, models_dir, model_control, load_models, model_server,
                                    self.desired.config.composable if model_server is not None else lambda: "")
        self.driver.before_retire = self.control.before_retire
        self.driver.holding = self.control.holding_untaken
        self._last_pass = 0.0  # monotonic start of the last pass
        self._lock = threading.Lock()  # guards the reload counts, shared with the main thread
        self._reloads_requested = 0
        self._reloads_handled = 0
        self._given_up = ""  # generation a rollout gave up on: not retried until something changes
        self.current = Target()  # what the workers run: nothing yet
        self.current = self.desired.compute("start", self._serving(self.driver.observe()), trust_all=True,
                                            loaded=self.control.selection())
        self._tell_about_the_startup_list()
        self._thread = threading.Thread(target=self._loop, name="forkserve-rollout", daemon=True)

    # --- called from gunicorn hooks (master main thread) ---

    def publish_initial_target(self) -> None:
        """Before the first workers fork: they load exactly this."""
        self.desired.publish(self.current)
        self.control.write_index(self.current, set(self.desired.settled), self.desired.unservable)

    def _tell_about_the_startup_list(self) -> None:
        """FORKSERVE_LOAD_MODELS naming models the repository cannot serve: logged, the rest serves."""
        for name in self.control.loaded:
            if name in self.desired.unservable:
                log.error("forkserve: FORKSERVE_LOAD_MODELS names model %r, which cannot be served: %s",
                          name, self.desired.unservable[name])

    def start(self) -> None:
        self._thread.start()

    def request_reload(self, why: str) -> None:
        """Replace every worker even if the target did not change (HUP, `python -m server reload`)."""
        log.info("forkserve: rolling restart requested (%s)", why)
        with self._lock:
            self._reloads_requested += 1  # NOTE: a count, not a flag: a request during a pass is never lost
        self._wake.set()

    def worker_exited(self, pid: int, reason: str, age: int = 0) -> None:
        """child_exit, before the worker's state file goes: remember where it was."""
        state = read_worker_states(self.run_dir).get(pid)
        loading = state.loading if state is not None and not state.loaded else None
        self.exits.record(pid, WorkerExit(reason, loading, age))
        if loading is not None and reason != "graceful":
            self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    # --- the thread ---

    def _loop(self) -> None:
        """Poll, and roll when the target changed or a reload was asked for."""
        while not self._stopping.is_set():
            self._wait_for_a_pass()
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.poll()
            except Exception:  # NOTE: the watcher must outlive any bug in one pass
                log.exception("forkserve: rollout pass failed; old workers keep serving")

    def _wait_for_a_pass(self) -> None:
        """Sleep one poll interval, less when woken or when a new load or unload call waits (looked at every 0.25 s).

        NOTE: never two passes less than CALL_POLL apart, and only a call no pass took wakes it: a call
        held by a rollout that waits for a copy, or a run directory that cannot be written, must not
        turn the thread into a busy loop (nor shorten the scanner's "unchanged between two polls").
        """
        deadline = time.monotonic() + self.knobs.poll_interval
        self._wake.wait(max(0.0, self._last_pass + CALL_POLL - time.monotonic()))
        while not self._wake.is_set() and time.monotonic() < deadline:
            if control.waiting(self.run_dir, self.control.taken()):
                break
            self._wake.wait(min(CALL_POLL, max(0.0, deadline - time.monotonic())))
        self._last_pass = time.monotonic()

    def poll(self) -> None:
        """One pass: the load and unload calls waiting, then the rollout if needed; every call taken is answered."""
        if not run_dir_writable(self.run_dir):  # reported once; reloads asked for meanwhile wait for it
            return
        self.control.take(self.desired.config.accepted, self._serving(self.driver.observe()))
        if self.control.calls:
            self._given_up = ""  # NOTE: a load is a new try, as a change of the files would be
            self.control.write_index(self.current, set(self.desired.settled), self.desired.unservable)
        self.driver.callers = self.control.callers()
        deferred = False
        try:
            deferred = self._pass()
        finally:
            self.driver.callers = set()
            if not deferred:
                self.control.settle(self.current, self.desired.unservable, self.driver.last_detail)
            self.control.write_index(self.current, set(self.desired.settled), self.desired.unservable)

    def _pass(self) -> bool:
        """Count deaths, re-read the configuration and the repository, roll if needed; True when the rollout waits."""
        with self._lock:
            forced = self._reloads_requested != self._reloads_handled
            self._reloads_handled = self._reloads_requested
        # NOTE: a new certificate replaces every worker, as a reload does: workers serve the set they were forked with.
        renewed = self.tls is not None and self.tls.refresh(at_once=forced) is not None
        workers = self.driver.observe()
        self.driver.count_deaths({}, workers)
        reason = ("reload" if forced else "TLS certificate changed" if renewed else
                  "load or unload called" if self.control.calls else "repository or configuration changed")
        desired = self.desired.compute(reason, self._serving(workers), loaded=self.control.selection())
        if self.control.refuse_hopeless_reloads(desired):  # NOTE: no rollout there and back for a model without versions
            desired = self.desired.compute(reason, self._serving(workers), loaded=self.control.selection())
        forced = forced or renewed
        if not forced and desired.generation == self.current.generation \
                and not workers.stragglers(self.current.generation, self._given_up):
            if self.desired.reports_changed():
                self.desired.publish(self.current)  # workers show the problems in /readyz and model status
            return False
        if not forced and desired.generation == self._given_up:
            return False
        if not forced and self.desired.settling(desired):
            return True
        if forced and self.renew_zygote is not None and not self.renew_zygote():
            log.warning("forkserve: no new zygote for this rollout; the master forks its workers itself")
        step = self.driver.roll(desired, self.current, everyone=forced)
        if step is Step.DONE:
            self.current, self._given_up = desired, ""
        elif step is Step.GIVE_UP:
            self._given_up = desired.generation
        return False

    def _serving(self, workers: Workers) -> set[VersionKey]:
        """Versions live workers serve, and those the current target has them serve."""
        return workers.served() | {(m, v) for m, versions in self.current.intended().items() for v in versions}
