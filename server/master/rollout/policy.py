"""What the rollout decides, as pure functions of what it observed (master, no I/O, no threads).

The driver (server.master.rollout.driver) and the ledger (.ledger) act on these answers: which
versions a new worker failed (verdict), which versions a target brings (new_versions), whether a
try is retried and after how long (next_step, retry_delay), which deaths count against a version
(deaths_to_count), and when a rollout waits for a copy still going on (waits_for_copy).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable

from server.master.strikes import VersionKey
from server.state import WorkerState
from server.target import Target

SUCCEEDED, VERSIONS_FAILED, WORKER_LOST = "succeeded", "versions failed", "worker lost"
SETTLE_WAIT_POLLS = 10  # a rollout waits this many polls at most for directories still being copied


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
    age: int = 0  # gunicorn's fork count when it was forked: which rollout step forked it (0: unknown)


class Step(enum.Enum):
    """What the rollout does after one try."""

    DONE = "succeeded"  # every worker runs the target
    ABORT = "failed"  # versions are to blame: mark them, fall back, no retry
    RETRY = "retry"  # a worker was lost: try again after retry_delay
    GIVE_UP = "gave_up"  # the last try lost its worker too: fall back until something changes


def verdict(state: WorkerState, intended: dict[str, list[int]], served: set[VersionKey]) -> Outcome:
    """SUCCEEDED when the new worker serves every intended version, else which versions failed and why.

    `served`: versions some live, loaded worker serves (one that loaded the target earlier, too).
    """
    failed, missing = {}, []
    for model, versions in intended.items():
        report = state.models.get(model)
        for version in versions:
            if report is not None and version in report.serving:
                continue
            reason = report.failed.get(version, "not serving") if report is not None else "not loaded"
            # NOTE: served by no worker, new or old (one that already failed at first boot, too):
            # the version's fault. Left in the target, it would fail every later rollout.
            if (model, version) not in served:
                failed[(model, version)] = f"rollout aborted: new worker {state.pid}: {reason}"
            else:  # another worker loads it fine: this worker's trouble, not the version's
                missing.append(f"{model} version {version} (served by another worker): {reason}")
    if failed:
        detail = "; ".join(f"{m} version {v}: {why}" for (m, v), why in sorted(failed.items()))
        return Outcome(VERSIONS_FAILED, detail, failed, state.pid)
    if missing:
        return Outcome(WORKER_LOST, f"new worker {state.pid} could not load " + "; ".join(missing), pid=state.pid)
    return Outcome(SUCCEEDED, pid=state.pid)


def new_versions(target: Target, previous: Target) -> set[VersionKey]:
    """Versions `target` serves that `previous` did not."""
    before = previous.intended()
    return {(m, v) for m, versions in target.intended().items() for v in versions if v not in before.get(m, [])}


def next_step(kind: str, attempt: int, attempts: int, blamed_new: bool) -> Step:
    """After try `attempt` of `attempts` ended in `kind`; `blamed_new`: the deaths just counted failed a version new to the target."""
    if kind == SUCCEEDED:
        return Step.DONE
    if kind == VERSIONS_FAILED or blamed_new:
        return Step.ABORT
    return Step.RETRY if attempt < attempts else Step.GIVE_UP


def retry_delay(attempt: int, backoff: float) -> float:
    """Seconds before the try after `attempt`: `backoff`, doubled each time."""
    return backoff * 2 ** (attempt - 1)


def deaths_to_count(
    exits: dict[int, WorkerExit], served: set[VersionKey], marked: Callable[[VersionKey], bool], details: dict[int, str],
) -> list[tuple[VersionKey, str]]:
    """The deaths that count against the version the worker was loading, in pid order: (version, what happened).

    Not counted: a graceful exit, a worker that was loading nothing, a version some worker
    serves (the worker's trouble, not the version's), a version `marked` failed already (a worker
    still loading it when it was marked). `details`: what the driver saw of a pid, else its exit reason.
    """
    return [(gone.loading, details.get(pid, f"worker {pid} {gone.reason}"))
            for pid, gone in sorted(exits.items())
            if gone.loading is not None and gone.reason != "graceful" and gone.loading not in served
            and not marked(gone.loading)]


def describe_exit(pid: int, gone: WorkerExit) -> str:
    """Why a new worker is gone, for the log and failed.json."""
    where = f" while loading {gone.loading[0]} version {gone.loading[1]}" if gone.loading else ""
    return f"new worker {pid} exited{where} ({gone.reason})"


@dataclass(frozen=True)
class Workers:
    """One read of the worker state files, with the arbiter's live workers at that moment."""

    states: dict[int, WorkerState]
    live: set[int]

    def served(self) -> set[VersionKey]:
        """Versions some live, loaded worker serves."""
        return {(model, version)
                for pid, state in self.states.items() if pid in self.live and state.loaded
                for model, report in state.models.items() for version in report.serving}

    def stragglers(self, current: str, given_up: str) -> list[int]:
        """Live loaded workers on a generation that is neither `current` nor `given_up`.

        A rollout aborted after some workers were replaced leaves them on its target; the next
        poll brings them back to what the others run.
        """
        return [pid for pid, state in self.states.items()
                if pid in self.live and state.loaded and state.generation not in ("", current, given_up)]

    def ahead_of(self, generation: str) -> list[int]:
        """Live workers that run (or load) another target than `generation`."""
        return [pid for pid, state in self.states.items()
                if pid in self.live and state.generation not in ("", generation)]


def waits_for_copy(unsettled_for: float, poll_interval: float) -> bool:
    """Hold a rollout while a version directory has been changing for less than SETTLE_WAIT_POLLS polls.

    NOTE: a new model's configuration and its first version usually arrive together; the
    configuration settles a poll or more before a large copy does, and rolling it out alone
    would replace every worker twice. Bounded: a copy that outlasts SETTLE_WAIT_POLLS rolls apart.
    """
    return 0 < unsettled_for < SETTLE_WAIT_POLLS * poll_interval
