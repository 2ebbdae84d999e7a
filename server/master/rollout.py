"""The master's repository watcher and readiness-gated rolling restart (no TensorFlow here).

Runs in one thread of the gunicorn master, started by when_ready. Every poll it re-reads
conf/models.toml (keeping the last good configuration when the file is broken), scans the
repository for settled versions (server.master.scanner), leaves out versions marked failed, applies
the version policies and, when the result (versions and configuration: the target's
generation) differs from what the workers run, or a reload was asked for (`python -m server
reload`, SIGHUP), or the TLS files changed (server.master.tls_watch), replaces the workers one at a time:

    one more worker -> wait until it reports the new target loaded and warm ->
    retire the oldest worker of an older target -> repeat until none is left.

What one try can end in:
- the new worker serves every intended version: on to the next old worker.
- it loaded, but versions new to this target failed: only those are marked failed (reason in
  failed.json, metric, log), it is withdrawn and the old workers keep serving; the next poll
  rolls out what is left (the healthy versions).
- it died or was not ready by the deadline (OOM, a hang): it is withdrawn and the rollout is
  tried again after a back-off, up to `attempts` times, then given up (metric, log) until the
  repository or configuration changes or a reload is asked for. Deaths while loading one
  version count against that version (server.master.strikes): `attempts` in a row fail it.
Never more than one extra worker. Signals to the master are handled by gunicorn's loop in the
main thread; this thread changes the worker count and waits (server.master.fleet).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from server.config import ServerConfig
from server.master.config_watch import ConfigWatch
from server.master.fleet import Fleet
from server.master.scanner import SettledScanner
from server.master.strikes import Strikes, VersionKey
from server.master.tls_watch import TlsWatch
from server.repository import VersionSource, stray_entries
from server.settings import Settings
from server.state import WorkerState, read_worker_states, run_dir_writable
from server.target import (
    FailedVersion,
    Target,
    compute_target,
    config_key,
    read_failed,
    write_failed,
    write_target,
)

log = logging.getLogger("forkserve.rollout")

SUCCEEDED, VERSIONS_FAILED, WORKER_LOST = "succeeded", "versions failed", "worker lost"
SETTLE_WAIT_POLLS = 10  # a rollout waits this many polls at most for directories still being copied


def record_metric(update: Callable[[Any], object]) -> None:
    """Apply `update(metrics module)` (metrics.record holds the fork lock: this thread writes while the main thread forks)."""
    from server.telemetry import metrics

    metrics.record(lambda: update(metrics))


@dataclass(frozen=True)
class RolloutSettings:
    """Knobs of the controller, from Settings."""

    poll_interval: float
    boot_timeout: float
    graceful_timeout: float
    attempts: int = 3
    backoff: float = 5.0


@dataclass(frozen=True)
class Outcome:
    """How one try to bring a new worker up ended."""

    kind: str
    detail: str = ""
    failed: dict[VersionKey, str] = field(default_factory=dict)  # VERSIONS_FAILED: version -> reason
    pid: int | None = None  # the new worker


@dataclass(frozen=True)
class WorkerExit:
    """A worker the master reaped, and the version it was loading when it went (None: not loading)."""

    reason: str  # "graceful", "timeout" (gunicorn's heartbeat) or "killed"
    loading: VersionKey | None


class RolloutController:
    """Watcher and rolling restart, in one thread of the master."""

    def __init__(
        self, fleet: Fleet, models_dir: Path, conf_path: Path, run_dir: Path, knobs: RolloutSettings,
        config: ServerConfig, tls_settings: Settings | None = None,
    ) -> None:
        self.fleet = fleet
        self.run_dir = run_dir
        self.knobs = knobs
        self.config = ConfigWatch(conf_path, config, lambda ok: record_metric(
            lambda m: m.CONFIG_LAST_RELOAD_SUCCESSFUL.set(1 if ok else 0)))
        self.tls = TlsWatch(tls_settings, lambda ok: record_metric(
            lambda m: m.TLS_LAST_RELOAD_SUCCESSFUL.set(1 if ok else 0))) if tls_settings is not None and tls_settings.tls else None
        self.scanner = SettledScanner(models_dir, self._settled_version_changed)
        self.strikes = Strikes(knobs.attempts)
        self.settled: dict[str, list[VersionSource]] = {}
        self._lock = threading.Lock()  # guards the fields below, shared with the main thread
        self._reloads_requested = 0
        self._reloads_handled = 0
        self._exits: dict[int, WorkerExit] = {}
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._given_up = ""  # generation a rollout gave up on: not retried until something changes
        self._published_reports: tuple[object, dict[str, str]] = (self.config.problem, {})
        self._unpublished = False  # the last target write failed (a full run directory): write it again
        self._gauges_synced = False  # forkserve_version_failed set from failed.json (once, at start)
        self._told: set[tuple[str, ...]] = set()  # repository and settings problems logged once each
        self._waiting_for: str = ""  # the generation a rollout waits to fold with directories still settling
        self.unservable: dict[str, str] = {}  # models left out of the target, with why (the last _desired)
        self.current = Target()  # what the workers run: nothing yet
        self.current = self._desired("start", trust_all=True)
        self._thread = threading.Thread(target=self._loop, name="forkserve-rollout", daemon=True)

    # --- called from gunicorn hooks (master main thread) ---

    def publish_initial_target(self) -> None:
        """Before the first workers fork: they load exactly this."""
        self._publish(self.current)

    def start(self) -> None:
        self._thread.start()

    def request_reload(self, why: str) -> None:
        """Replace every worker even if the target did not change (HUP, `python -m server reload`)."""
        log.info("forkserve: rolling restart requested (%s)", why)
        with self._lock:
            self._reloads_requested += 1  # NOTE: a count, not a flag: a request during a pass is never lost
        self._wake.set()

    def worker_exited(self, pid: int, reason: str) -> None:
        """child_exit, before the worker's state file goes: remember where it was."""
        state = read_worker_states(self.run_dir).get(pid)
        loading = state.loading if state is not None and not state.loaded else None
        with self._lock:
            self._exits[pid] = WorkerExit(reason, loading)
        if loading is not None and reason != "graceful":
            self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    # --- the thread ---

    def _loop(self) -> None:
        """Poll, and roll when the target changed or a reload was asked for."""
        while not self._stopping.is_set():
            self._wake.wait(self.knobs.poll_interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.poll()
            except Exception:  # NOTE: the watcher must outlive any bug in one pass
                log.exception("forkserve: rollout pass failed; old workers keep serving")

    def poll(self) -> None:
        """One pass: count deaths, re-read the configuration and the repository, roll if needed."""
        if not run_dir_writable(self.run_dir):  # reported once; reloads asked for meanwhile wait for it
            return
        with self._lock:
            forced = self._reloads_requested != self._reloads_handled
            self._reloads_handled = self._reloads_requested
        # NOTE: a new certificate replaces every worker, as a reload does: workers serve the set they were forked with.
        renewed = self.tls is not None and self.tls.refresh(at_once=forced) is not None
        self._count_deaths({})
        desired = self._desired("reload" if forced else "TLS certificate changed" if renewed else "repository or configuration changed")
        forced = forced or renewed
        if not forced and desired.generation == self.current.generation and not self._stragglers():
            if self._unpublished or (self.config.problem, self.unservable) != self._published_reports:
                self._publish(self.current)  # workers show the problems in /readyz and model status
            return
        if not forced and desired.generation == self._given_up:
            return
        if not forced and self._settling(desired):
            return
        self._roll(desired, everyone=forced)

    def _settling(self, desired: Target) -> bool:
        """Hold a rollout while a version directory is still being copied, so both go out in one rollout.

        NOTE: a new model's configuration and its first version usually arrive together; the
        configuration settles a poll or more before a large copy does, and rolling it out alone
        would replace every worker twice. Bounded: a copy that outlasts SETTLE_WAIT_POLLS rolls apart.
        """
        waited = self.scanner.unsettled_for()
        if not 0 < waited < SETTLE_WAIT_POLLS * self.knobs.poll_interval:
            self._waiting_for = ""
            return False
        if self._waiting_for != desired.generation:
            self._waiting_for = desired.generation
            log.info("forkserve: rollout to %s waits for version directories still being copied (up to %.0fs)",
                     desired.generation, SETTLE_WAIT_POLLS * self.knobs.poll_interval)
        return True

    def _stragglers(self) -> list[int]:
        """Live loaded workers on a generation that is neither the current one nor one given up on.

        A rollout aborted after some workers were replaced leaves them on its target; the next
        poll brings them back to what the others run.
        """
        live = set(self.fleet.pids())
        return [pid for pid, state in read_worker_states(self.run_dir).items()
                if pid in live and state.loaded and state.generation not in ("", self.current.generation, self._given_up)]

    def _desired(self, reason: str, trust_all: bool = False) -> Target:
        """What the policies select now from settled, not failed versions, with the accepted configuration.

        A model with nothing usable is left out of the target (server.target) and reported with why.
        """
        config = self.config.refresh()
        self.settled = self.scanner.scan(trust_all)
        self._tell_about_the_repository(config)
        failed = self._drop_stale_marks(self._fail_unloadable(config), config)
        usable, why_empty = {}, {}
        for name, sources in self.settled.items():
            usable[name] = [s for s in sources if not self._is_failed(s, failed, config)]
            if not sources:
                stray = stray_entries(self.scanner.models_dir / name)
                why_empty[name] = "no version directory" + (
                    f" ({'; '.join(f'{entry}: {why}' for entry, why in stray.items())})" if stray else "")
            elif not usable[name]:
                why_empty[name] = "every version failed: " + "; ".join(
                    f"version {s.version}: {failed[name][s.version].reason}" for s in sources)
        target = compute_target(usable, config, reason, why_empty=why_empty)
        self.unservable = target.unservable
        return target

    def _drop_stale_marks(self, failed: dict[str, dict[int, FailedVersion]], config: ServerConfig) -> dict[str, dict[int, FailedVersion]]:
        """Forget marks whose version's files or settings changed since (tried again if the policy selects it): the marks left.

        The gauge of every mark is set on the first call: failed.json outlives a master that was killed.
        """
        stale = [(s.model, s.version) for sources in self.settled.values() for s in sources
                 if s.version in failed.get(s.model, {}) and not self._is_failed(s, failed, config)]
        for model, version in stale:
            del failed[model][version]
            log.info("forkserve: model %s version %s, marked failed, changed (files or settings): it may be tried again",
                     model, version)
        if stale:
            write_failed(self.run_dir, failed)
        gauges = {key: 0 for key in stale}
        if not self._gauges_synced:
            gauges.update({(model, version): 1 for model, versions in failed.items() for version in versions})
            self._gauges_synced = True
        for (model, version), on in gauges.items():
            record_metric(lambda m, k=(model, str(version)), on=on: m.VERSION_FAILED.labels(*k).set(on))
        return failed

    def _fail_unloadable(self, config: ServerConfig) -> dict[str, dict[int, FailedVersion]]:
        """Mark failed at once the settled versions no worker could load (unreadable, no model file, ambiguous): the failed versions."""
        failed = read_failed(self.run_dir)
        serving = self._served_versions() | {(m, v) for m, versions in self.current.intended().items() for v in versions}
        problems = {}
        for source in (s for sources in self.settled.values() for s in sources if s.problem):
            key = (source.model, source.version)
            if key in serving:  # NOTE: an I/O error or a file dropped in must not take a served model out of service
                self._tell_once(("served problem", source.model, str(source.version), source.problem),
                                "forkserve: model %s version %s is served, but its directory now reads as unloadable "
                                "(%s); running workers keep the copy they loaded", source.model, source.version, source.problem)
            elif not self._is_failed(source, failed, config):
                problems[key] = source.problem
        if not problems:
            return failed
        self._mark_failed(problems)
        return read_failed(self.run_dir)

    def _is_failed(self, source: VersionSource, failed: dict[str, dict[int, FailedVersion]], config: ServerConfig) -> bool:
        """Marked failed with the content the directory still has and the settings the model still has."""
        entry = failed.get(source.model, {}).get(source.version)
        if entry is None or entry.config not in ("", config_key(config.for_model(source.model))):
            return False
        return entry.content in ("", self.scanner.content_digest(source.path))

    def _tell_about_the_repository(self, config: ServerConfig) -> None:
        """Log once each: entries a model directory ignores, settings for a model the repository lacks."""
        for name, sources in self.settled.items():
            for entry, why in stray_entries(self.scanner.models_dir / name).items():
                self._tell_once(("stray", name, entry, why), "forkserve: model %s: %s %s", name, entry, why)
        for name in sorted(n for n in set(config.models) - set(self.settled) if not _is_dir(self.scanner.models_dir / n)):
            self._tell_once(("settings", name, self.config.path.name),
                            "forkserve: %s has settings for model %s, but the repository has no model %s "
                            "(renamed or removed?); they apply to nothing", self.config.path, name, name)

    def _tell_once(self, key: tuple[str, ...], message: str, *args: object) -> None:
        if key not in self._told:
            self._told.add(key)
            log.warning(message, *args)

    def _settled_version_changed(self, source: VersionSource, what: str) -> bool:
        """The scanner saw a settled version's files change: a failed one is retried once settled; others are reported."""
        if source.version in read_failed(self.run_dir).get(source.model, {}):
            log.info("forkserve: files of failed model %s version %s changed (%s); it is tried again once they settle",
                     source.model, source.version, what)
            return True
        log.warning(
            "forkserve: model %s version %s changed on disk after it settled (%s); versions are immutable: "
            "running workers keep the files they loaded, workers started later load the changed ones; "
            "publish a new version instead", source.model, source.version, what,
        )
        record_metric(lambda m: m.MODEL_VERSION_CHANGES.labels(source.model, str(source.version)).inc())
        return False

    def _publish(self, target: Target) -> None:
        """Write the target with the configuration problem and the unservable models of the moment."""
        for name in set(self._published_reports[1]) | set(self.unservable):
            record_metric(lambda m, name=name: m.MODEL_UNSERVABLE.labels(name).set(1 if name in self.unservable else 0))
        self._published_reports = (self.config.problem, self.unservable)
        self._unpublished = True
        write_target(self.run_dir, dataclasses.replace(target, config_problem=self.config.problem,
                                                       unservable=self.unservable))
        self._unpublished = False

    # --- one rollout ---

    def _roll(self, target: Target, everyone: bool) -> None:
        """Bring every worker to `target`, retrying a worker that died; record the result."""
        record_metric(lambda m: m.ROLLOUT_IN_PROGRESS.set(1))
        result = "failed"
        try:
            result = self._try(target, everyone)
        finally:
            record_metric(lambda m: m.ROLLOUT_IN_PROGRESS.set(0))
            record_metric(lambda m: m.ROLLOUTS.labels(result).inc())

    def _try(self, target: Target, everyone: bool) -> str:
        """The rollout with its retries; returns "succeeded", "failed" or "gave_up"."""
        previous = self.current
        started = time.monotonic()
        log.info("forkserve: rollout %s -> %s (%s): %s", previous.generation, target.generation, target.reason,
                 target.intended())
        self._publish(target)
        must_go = set(self.fleet.pids()) if everyone else set()
        new_versions = _new_versions(target, previous)
        for attempt in range(1, self.knobs.attempts + 1):
            outcome = self._replace_workers(target, must_go)
            if outcome.kind == SUCCEEDED:
                self.current, self._given_up = target, ""
                log.info("forkserve: rollout to %s finished in %.1fs", target.generation, time.monotonic() - started)
                return "succeeded"
            if outcome.kind == VERSIONS_FAILED:
                log.error("forkserve: rollout to %s aborted, old workers keep serving: %s", target.generation, outcome.detail)
                try:
                    self._mark_failed(outcome.failed)
                finally:  # NOTE: a full run directory must not leave target.json on the abandoned target
                    self._fall_back(previous)
                return "failed"
            try:
                blamed = self._count_deaths({outcome.pid: outcome.detail} if outcome.pid else {})
            except BaseException:
                self._fall_back(previous)
                raise
            if blamed & new_versions:
                log.error("forkserve: rollout to %s aborted, old workers keep serving: %s", target.generation, outcome.detail)
                self._fall_back(previous)
                return "failed"
            if attempt < self.knobs.attempts:
                delay = self.knobs.backoff * 2 ** (attempt - 1)
                log.warning("forkserve: rollout to %s, try %d of %d: %s; trying again in %.0fs", target.generation,
                            attempt, self.knobs.attempts, outcome.detail, delay)
                record_metric(lambda m: m.ROLLOUT_RETRIES.inc())
                if self._stopping.wait(delay):
                    break
            else:
                log.error("forkserve: rollout to %s gave up after %d tries, old workers keep serving: %s",
                          target.generation, attempt, outcome.detail)
        self._given_up = target.generation
        self._fall_back(previous)
        return "gave_up"

    def _fall_back(self, previous: Target) -> None:
        """After a failed rollout: workers started from now on load what the old workers run."""
        self.current = previous
        try:
            self._publish(previous)
        except OSError:  # reported by write_json; the next poll writes it again
            pass
        ahead = [pid for pid, state in read_worker_states(self.run_dir).items()
                 if state.generation not in ("", previous.generation) and pid in self.fleet.pids()]
        if ahead:
            log.warning("forkserve: workers %s already run the abandoned target until the next rollout", ahead)

    def _replace_workers(self, target: Target, must_go: set[int]) -> Outcome:
        """Replace, oldest first, every worker that runs another target (or is in `must_go`)."""
        waited_since = time.monotonic()
        while not self._stopping.is_set():
            states = read_worker_states(self.run_dir)
            pids = self.fleet.pids()
            must_go &= set(pids)
            stale = [p for p in pids if p in must_go or (p in states and states[p].generation != target.generation)]
            if stale:
                outcome = self._replace(stale[0], target)
                must_go.discard(stale[0])
                if outcome.kind != SUCCEEDED:
                    return outcome
                waited_since = time.monotonic()
                continue
            booting = [p for p in pids if p not in states or not states[p].loaded]  # not proven the target yet
            if not booting:
                return Outcome(SUCCEEDED)
            if time.monotonic() - waited_since > self.knobs.boot_timeout:
                return Outcome(WORKER_LOST, f"workers {booting} did not report within {self.knobs.boot_timeout:.0f}s")
            time.sleep(0.2)
        return Outcome(WORKER_LOST, "the master is stopping")

    def _replace(self, old_pid: int, target: Target) -> Outcome:
        """One more worker; once it serves the target, retire `old_pid`, else withdraw it."""
        before = self.fleet.add_worker()
        try:
            outcome, loaded = self._await_new_worker(before, target)
        except BaseException:  # NOTE: never leave the extra worker behind (the count stays raised for ever)
            self.fleet.withdraw(before, kill=True)
            self.fleet.end_withdrawal()
            raise
        # A worker that never finished loading accepted no connection: nothing to drain, kill it.
        if outcome.kind == SUCCEEDED:
            old_state = read_worker_states(self.run_dir).get(old_pid)
            self.fleet.retire(old_pid)
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
        self._await_exit_records(set(going) | set(late), 2.0)
        return outcome

    def _wait_stopped(self, pids: list[int], timeout: float) -> None:
        """Wait until the arbiter reaped `pids`; kill those still there at the deadline."""
        left = self.fleet.wait_gone(pids, timeout)
        if left:
            log.warning("forkserve: workers %s did not stop in time; killing them", left)
            self.fleet.kill(left)
            self.fleet.wait_gone(left, 10)

    def _await_exit_records(self, pids: set[int], timeout: float) -> None:
        """Give child_exit (main thread) a moment to record workers the arbiter just reaped."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if pids <= set(self._exits):
                    return
            time.sleep(0.05)

    def _await_new_worker(self, before: set[int], target: Target) -> tuple[Outcome, bool]:
        """Wait for the worker forked after `before`: (outcome, whether it finished loading)."""
        deadline = time.monotonic() + self.knobs.boot_timeout
        new_pid: int | None = None
        state: WorkerState | None = None
        while not self._stopping.is_set():
            pids = self.fleet.pids()
            if new_pid is None:
                fresh = set(pids) - before
                new_pid = min(fresh) if fresh else None
            elif new_pid not in pids:
                return Outcome(WORKER_LOST, self._describe_exit(new_pid, state), pid=new_pid), False
            else:
                state = read_worker_states(self.run_dir).get(new_pid)
                if state is not None and state.loaded:
                    if state.generation != target.generation:
                        return Outcome(WORKER_LOST, f"new worker {new_pid} loaded {state.generation!r}", pid=new_pid), True
                    return self._verdict(new_pid, state, target), True
            if time.monotonic() > deadline:
                where = f" (loading {state.loading[0]} version {state.loading[1]})" if state and state.loading else ""
                return Outcome(WORKER_LOST, f"new worker {new_pid} was not ready within "
                                            f"{self.knobs.boot_timeout:.0f}s{where}", pid=new_pid), False
            time.sleep(0.2)
        return Outcome(WORKER_LOST, "the master is stopping"), False

    def _describe_exit(self, pid: int, state: WorkerState | None) -> str:
        """Why a new worker is gone, from what child_exit recorded (it may lag the pid's removal a little)."""
        self._await_exit_records({pid}, 2.0)
        with self._lock:
            gone = self._exits.get(pid) or WorkerExit("killed", state.loading if state else None)
        where = f" while loading {gone.loading[0]} version {gone.loading[1]}" if gone.loading else ""
        return f"new worker {pid} exited{where} ({gone.reason})"

    def _verdict(self, pid: int, state: WorkerState, target: Target) -> Outcome:
        """SUCCEEDED when the worker serves every intended version, else which versions failed and why."""
        failed, missing = {}, []
        served = self._served_versions()  # by any live worker: one that loaded the target earlier, too
        for model, versions in target.intended().items():
            report = state.models.get(model)
            for version in versions:
                if report is not None and version in report.serving:
                    continue
                reason = report.failed.get(version, "not serving") if report is not None else "not loaded"
                # NOTE: served by no worker, new or old (one that already failed at first boot, too):
                # the version's fault. Left in the target, it would fail every later rollout.
                if (model, version) not in served:
                    failed[(model, version)] = f"rollout aborted: new worker {pid}: {reason}"
                else:  # another worker loads it fine: this worker's trouble, not the version's
                    missing.append(f"{model} version {version} (served by another worker): {reason}")
        if failed:
            detail = "; ".join(f"{m} version {v}: {why}" for (m, v), why in sorted(failed.items()))
            return Outcome(VERSIONS_FAILED, detail, failed, pid)
        if missing:
            return Outcome(WORKER_LOST, f"new worker {pid} could not load " + "; ".join(missing), pid=pid)
        return Outcome(SUCCEEDED, pid=pid)

    # --- failures ---

    def _count_deaths(self, details: dict[int, str]) -> set[VersionKey]:
        """Count recorded deaths against the versions being loaded; mark those at the limit failed."""
        with self._lock:
            exits, self._exits = self._exits, {}
        served = self._served_versions()
        for version in served:
            self.strikes.clear(version)
        failed = self._forget_recovered(served)
        sources = {(s.model, s.version): s for versions in self.settled.values() for s in versions}
        blamed: dict[VersionKey, str] = {}
        for pid, gone in sorted(exits.items()):
            if gone.loading is None or gone.reason == "graceful" or gone.loading in served:
                continue
            source = sources.get(gone.loading)
            if gone.loading[1] in failed.get(gone.loading[0], {}) and (source is None or self._is_failed(source, failed, self.config.accepted)):
                continue  # marked already (with these files): a worker still loading it when it was marked
            if self.strikes.add(gone.loading, details.get(pid, f"worker {pid} {gone.reason}")):
                blamed[gone.loading] = self.strikes.verdict(gone.loading)
        self._mark_failed(blamed)
        return set(blamed)

    def _forget_recovered(self, served: set[VersionKey]) -> dict[str, dict[int, FailedVersion]]:
        """Drop failed marks of versions served now (tried again after a change) or removed: the failed versions left."""
        failed = read_failed(self.run_dir)
        models_dir = self.scanner.models_dir
        recovered = [(m, v) for m, versions in failed.items() for v in versions if (m, v) in served]
        removed = [(m, v) for m, versions in failed.items() for v in versions if not _is_dir(models_dir / m / str(v))]
        for model, version in recovered:
            log.info("forkserve: model %s version %s, once failed, is served now", model, version)
        for model, version in set(recovered) | set(removed):
            del failed[model][version]
            record_metric(lambda m, k=(model, str(version)): m.VERSION_FAILED.labels(*k).set(0))
        if recovered or removed:
            write_failed(self.run_dir, failed)
        return failed

    def _served_versions(self) -> set[VersionKey]:
        """Versions some live, loaded worker serves."""
        live = set(self.fleet.pids())
        return {
            (model, version)
            for pid, state in read_worker_states(self.run_dir).items() if pid in live and state.loaded
            for model, report in state.models.items() for version in report.serving
        }

    def _mark_failed(self, reasons: dict[VersionKey, str]) -> None:
        """Remember versions that must not be served (with their content now), and tell."""
        if not reasons:
            return
        failed = read_failed(self.run_dir)
        paths = {(s.model, s.version): s.path for sources in self.settled.values() for s in sources}
        config = self.config.accepted
        for (model, version), reason in sorted(reasons.items()):
            content = self.scanner.content_digest(paths[(model, version)]) if (model, version) in paths else ""
            reason = (f"{reason} (tried again when the files of {model}/{version} or the settings of model "
                      f"{model} in {self.config.path.name} change)")
            failed.setdefault(model, {})[version] = FailedVersion(reason, content, config_key(config.for_model(model)))
            self.strikes.clear((model, version))
            log.error("forkserve: model %s version %s marked failed: %s", model, version, reason)
            record_metric(lambda m, k=(model, str(version)): m.ROLLOUT_FAILED_VERSIONS.labels(*k).inc())
            record_metric(lambda m, k=(model, str(version)): m.VERSION_FAILED.labels(*k).set(1))
        write_failed(self.run_dir, failed)


def _is_dir(path: Path) -> bool:
    """Path.is_dir, True for a directory we may not search (EACCES): it is there, not removed."""
    try:
        return path.is_dir()
    except OSError:
        return True


def _new_versions(target: Target, previous: Target) -> set[VersionKey]:
    """Versions `target` serves that `previous` did not."""
    before = previous.intended()
    return {(m, v) for m, versions in target.intended().items() for v in versions if v not in before.get(m, [])}
