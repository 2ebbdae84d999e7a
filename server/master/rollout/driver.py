"""The rolling restart over the gunicorn arbiter (master rollout thread, no TensorFlow).

Replaces the workers one at a time (server.master.fleet drives the arbiter):

    one more worker -> wait until it reports the new target loaded and warm ->
    retire the oldest worker of an older target -> repeat until none is left.

A try ends as server.master.rollout.policy judges it; a lost worker is tried again after a
back-off, versions to blame are marked failed (.ledger) and the fleet falls back to the target
the old workers run. Never more than one extra worker, and never one left behind.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from server.master.fleet import Fleet
from server.master.rollout import policy
from server.master.rollout.desired import DesiredState
from server.master.rollout.exits import ExitLog
from server.master.rollout.ledger import FailureLedger
from server.master.rollout.policy import SUCCEEDED, VERSIONS_FAILED, WORKER_LOST, Outcome, Step, Workers
from server.master.rollout.record import record_metric
from server.master.strikes import VersionKey
from server.state import WorkerState, read_worker_states
from server.target import Target

LOOK_INTERVAL = 0.05  # seconds between looks at a new worker's state file: one from the zygote is ready in ~0.8 s
log = logging.getLogger("forkserve.rollout")


@dataclass(frozen=True)
class RolloutSettings:
    """Knobs of the rollout, from Settings."""

    poll_interval: float
    boot_timeout: float
    graceful_timeout: float
    attempts: int = 3
    backoff: float = 5.0
    new_versions: bool = True  # look for new version directories (False: the versions a model had when first seen)


class RollingRestart:
    """Brings every worker to a target, or back to the previous one."""

    def __init__(self, fleet: Fleet, run_dir: Path, knobs: RolloutSettings, desired: DesiredState,
                 ledger: FailureLedger, exits: ExitLog, stopping: threading.Event) -> None:
        self.fleet = fleet
        self.run_dir = run_dir
        self.knobs = knobs
        self.desired = desired
        self.ledger = ledger
        self.exits = exits
        self.stopping = stopping
        self.callers: set[int] = set()  # workers holding a load or unload call: replaced last (.control)
        self.holding: Callable[[], set[int]] | None = None  # workers holding a call a later pass takes: left alone
        self.before_retire: Callable[[int, Target], None] | None = None  # told before a worker is retired
        self.last_detail = ""  # why the last rollout did not finish ("" when it did)

    def observe(self, pids: list[int] | None = None) -> Workers:
        """One read of the worker state files, with the arbiter's workers (`pids` if just listed)."""
        return Workers(read_worker_states(self.run_dir), tuple(self.fleet.pids() if pids is None else pids))

    def count_deaths(self, details: dict[int, str], workers: Workers | None = None) -> set[VersionKey]:
        """Count the exits recorded since last time against the versions being loaded: the versions marked failed."""
        served = (workers or self.observe()).served()
        return self.ledger.count_deaths(self.exits.take(), served, self.desired.view(), details)

    def roll(self, target: Target, previous: Target, everyone: bool) -> Step:
        """Bring every worker to `target` (`everyone`: replace each, same target or not); record the result."""
        record_metric(lambda m: m.ROLLOUT_IN_PROGRESS.set(1))
        step = Step.ABORT
        self.last_detail = ""
        try:
            step = self._try(target, previous, everyone)
        finally:
            record_metric(lambda m: m.ROLLOUT_IN_PROGRESS.set(0))
            record_metric(lambda m, result=step.value: m.ROLLOUTS.labels(result).inc())
        return step

    def _try(self, target: Target, previous: Target, everyone: bool) -> Step:
        """The rollout with its retries; DONE, ABORT or GIVE_UP."""
        started = time.monotonic()
        log.info("forkserve: rollout %s -> %s (%s): %s", previous.generation, target.generation, target.reason,
                 target.intended())
        self.desired.publish(target)
        must_go = set(self.fleet.pids()) if everyone else set()
        try:
            step = self._attempts(target, must_go, policy.new_versions(target, previous))
        except BaseException:  # NOTE: a full run directory (or a bug) must not leave target.json on the abandoned target
            self._fall_back(previous)
            raise
        if step is Step.DONE:
            log.info("forkserve: rollout to %s finished in %.1fs", target.generation, time.monotonic() - started)
        else:
            self._fall_back(previous)
        return step

    def _attempts(self, target: Target, must_go: set[int], new: set[VersionKey]) -> Step:
        """Try up to `attempts` times, with a back-off after each lost worker."""
        attempts = self.knobs.attempts
        for attempt in range(1, attempts + 1):
            outcome = self._replace_workers(target, must_go)
            self.last_detail = outcome.detail if outcome.kind != SUCCEEDED else ""
            blamed: set[VersionKey] = set()
            if outcome.kind == VERSIONS_FAILED:
                log.error("forkserve: rollout to %s aborted, old workers keep serving: %s", target.generation, outcome.detail)
                self.ledger.mark(outcome.failed, self.desired.view())
            elif outcome.kind == WORKER_LOST:
                blamed = self.count_deaths({outcome.pid: outcome.detail} if outcome.pid else {})
            step = policy.next_step(outcome.kind, attempt, attempts, bool(blamed & new))
            if step is Step.ABORT and outcome.kind == WORKER_LOST:
                log.error("forkserve: rollout to %s aborted, old workers keep serving: %s", target.generation, outcome.detail)
            elif step is Step.GIVE_UP:
                log.error("forkserve: rollout to %s gave up after %d tries, old workers keep serving: %s",
                          target.generation, attempt, outcome.detail)
            if step is not Step.RETRY:
                return step
            delay = policy.retry_delay(attempt, self.knobs.backoff)
            log.warning("forkserve: rollout to %s, try %d of %d: %s; trying again in %.0fs", target.generation,
                        attempt, attempts, outcome.detail, delay)
            record_metric(lambda m: m.ROLLOUT_RETRIES.inc())
            if self.stopping.wait(delay):
                break
        return Step.GIVE_UP

    def _fall_back(self, previous: Target) -> None:
        """After a failed rollout: workers started from now on load what the old workers run."""
        try:
            self.desired.publish(previous)
        except OSError:  # reported by write_json; the next poll writes it again
            pass
        ahead = self.observe().ahead_of(previous.generation)
        if ahead:
            log.warning("forkserve: workers %s already run the abandoned target until the next rollout", ahead)

    def _replace_workers(self, target: Target, must_go: set[int]) -> Outcome:
        """Replace, oldest first, every worker that runs another target (or is in `must_go`)."""
        waited_since = time.monotonic()
        while not self.stopping.is_set():
            workers = self.observe()
            states, pids = workers.states, workers.live
            must_go &= set(pids)
            stale = [p for p in pids if p in must_go or (p in states and states[p].generation != target.generation)]
            if stale and self.holding is not None:
                left = self.holding()
                stale = [p for p in stale if p not in left]  # NOTE: the next pass replaces them, last
            stale.sort(key=lambda pid: pid in self.callers)  # NOTE: a caller answers once the others are on the target
            booting = [p for p in pids if p not in states or not states[p].loaded]  # not proven the target yet
            if stale and stale[0] in self.callers and booting and time.monotonic() - waited_since <= self.knobs.boot_timeout:
                time.sleep(0.2)  # NOTE: a booting worker may turn out stale: it goes before the caller
                continue
            if stale:
                outcome = self._replace(stale[0], target)
                must_go.discard(stale[0])
                if outcome.kind != SUCCEEDED:
                    return outcome
                waited_since = time.monotonic()
                continue
            if not booting:
                return Outcome(SUCCEEDED)
            if time.monotonic() - waited_since > self.knobs.boot_timeout:
                return Outcome(WORKER_LOST, f"workers {booting} did not report within {self.knobs.boot_timeout:.0f}s")
            time.sleep(0.2)
        return Outcome(WORKER_LOST, "the master is stopping")

    def _replace(self, old_pid: int, target: Target) -> Outcome:
        """One more worker; once it serves the target, retire `old_pid`, else withdraw it."""
        born_after = self.fleet.forks_so_far()
        before = self.fleet.add_worker()
        try:
            outcome, loaded = self._await_new_worker(before, target, born_after)
        except BaseException:  # NOTE: never leave the extra worker behind (the count stays raised for ever)
            self.fleet.withdraw(before, kill=True)
            self.fleet.end_withdrawal()
            raise
        # A worker that never finished loading accepted no connection: nothing to drain, kill it.
        if outcome.kind == SUCCEEDED:
            old_state = read_worker_states(self.run_dir).get(old_pid)  # now: it may have finished loading meanwhile
            self.fleet.retire(old_pid)
            if self.before_retire is not None:  # NOTE: after the retirement: its caller answers once it stopped accepting
                self.before_retire(old_pid, target)
            going = [old_pid]
            if old_state is None or not old_state.loaded:
                self.fleet.kill(going)
            self._wait_stopped(going, self.knobs.graceful_timeout + 10)
            return outcome
        going = self.fleet.withdraw(before, kill=not loaded)
        try:
            self._wait_stopped(going, self.knobs.graceful_timeout + 10 if loaded else 10)
            late = [pid for pid in self.fleet.withdrawn(before) if pid not in going]  # forked during the withdrawal
            self.fleet.kill(late)
            self._wait_stopped(late, 10)
        finally:
            self.fleet.end_withdrawal()
        self.exits.wait_for(set(going) | set(late), 2.0)
        return outcome

    def _wait_stopped(self, pids: list[int], timeout: float) -> None:
        """Wait until the arbiter reaped `pids`; kill those still there at the deadline."""
        left = self.fleet.wait_gone(pids, timeout)
        if left:
            log.warning("forkserve: workers %s did not stop in time; killing them", left)
            self.fleet.kill(left)
            self.fleet.wait_gone(left, 10)

    def _await_new_worker(self, before: set[int], target: Target, born_after: int = 0) -> tuple[Outcome, bool]:
        """Wait for the worker forked after `before`: (outcome, whether it finished loading)."""
        deadline = time.monotonic() + self.knobs.boot_timeout
        new_pid: int | None = None
        state: WorkerState | None = None
        while not self.stopping.is_set():
            # NOTE: a worker forked by the zygote can load, die and be replaced by gunicorn between two looks:
            # its exit (child_exit, with its age) says so, even when only its replacement is alive now.
            dead = self.exits.dead_since(born_after) if born_after else []
            if dead:
                return Outcome(WORKER_LOST, self._describe_exit(dead[0], state if dead[0] == new_pid else None),
                               pid=dead[0]), False
            pids = self.fleet.pids()
            if new_pid is None:
                fresh = set(pids) - before
                new_pid = min(fresh) if fresh else None
            elif new_pid not in pids:
                return Outcome(WORKER_LOST, self._describe_exit(new_pid, state), pid=new_pid), False
            else:
                workers = self.observe(pids)
                state = workers.states.get(new_pid)
                if state is not None and state.loaded:
                    if state.generation != target.generation:
                        return Outcome(WORKER_LOST, f"new worker {new_pid} loaded {state.generation!r}", pid=new_pid), True
                    return policy.verdict(state, target.intended(), workers.served()), True
            if time.monotonic() > deadline:
                where = f" (loading {state.loading[0]} version {state.loading[1]})" if state and state.loading else ""
                return Outcome(WORKER_LOST, f"new worker {new_pid} was not ready within "
                                            f"{self.knobs.boot_timeout:.0f}s{where}", pid=new_pid), False
            time.sleep(LOOK_INTERVAL)
        return Outcome(WORKER_LOST, "the master is stopping"), False

    def _describe_exit(self, pid: int, state: WorkerState | None) -> str:
        """Why a new worker is gone, from what child_exit recorded (it may lag the pid's removal a little)."""
        self.exits.wait_for({pid}, 2.0)
        gone = self.exits.get(pid) or policy.WorkerExit("killed", state.loading if state else None)
        return policy.describe_exit(pid, gone)
