"""The rollout's rules as tables: no thread, no arbiter, no file system."""

from __future__ import annotations

import pytest

from server.master.rollout.policy import (
    SETTLE_WAIT_POLLS,
    SUCCEEDED,
    VERSIONS_FAILED,
    WORKER_LOST,
    Step,
    WorkerExit,
    Workers,
    deaths_to_count,
    describe_exit,
    new_versions,
    next_step,
    retry_delay,
    verdict,
    waits_for_copy,
)
from server.state import LOADED, LOADING, ModelReport, WorkerState
from server.target import ModelTarget, Target


def worker(pid: int, serving: dict[str, list[int]], failed: dict[str, dict[int, str]] | None = None,
           generation: str = "g", phase: str = LOADED) -> WorkerState:
    models = {m: ModelReport(list(v), (failed or {}).get(m, {})) for m, v in serving.items()}
    for model, reasons in (failed or {}).items():
        models.setdefault(model, ModelReport([], reasons))
    return WorkerState(pid, generation, phase, None, True, models)


def target(**models: tuple[tuple[int, ...], int]) -> Target:
    return Target({name: ModelTarget(candidates, keep) for name, (candidates, keep) in models.items()})


VERDICTS = [
    # (what the new worker 7 serves and failed, the intended versions, served by any live worker, kind, failed, detail has)
    pytest.param({"a": [2]}, {}, {"a": [2]}, {("a", 2)}, SUCCEEDED, {}, "", id="serves-everything"),
    pytest.param({"a": [1]}, {"a": {2: "OOM"}}, {"a": [2]}, {("a", 1)}, VERSIONS_FAILED,
                 {("a", 2): "rollout aborted: new worker 7: OOM"}, "a version 2: rollout aborted", id="served-by-none-is-its-fault"),
    pytest.param({"a": [1]}, {"a": {2: "OOM"}}, {"a": [2]}, {("a", 2)}, WORKER_LOST, {},
                 "could not load a version 2 (served by another worker): OOM", id="served-elsewhere-is-the-worker-s-trouble"),
    pytest.param({"a": [2]}, {}, {"a": [2], "b": [5]}, {("a", 2)}, VERSIONS_FAILED,
                 {("b", 5): "rollout aborted: new worker 7: not loaded"}, "b version 5", id="model-not-loaded"),
    pytest.param({"a": [], "b": [5]}, {}, {"a": [3], "b": [5]}, set(), VERSIONS_FAILED,
                 {("a", 3): "rollout aborted: new worker 7: not serving"}, "", id="model-loaded-version-not-serving"),
    pytest.param({"a": [1]}, {"a": {2: "bad"}, "b": {5: "bad"}}, {"a": [2], "b": [5]}, {("a", 2)}, VERSIONS_FAILED,
                 {("b", 5): "rollout aborted: new worker 7: bad"}, "", id="failed-wins-over-missing"),
]


@pytest.mark.parametrize(("serving", "failed", "intended", "served", "kind", "blamed", "detail"), VERDICTS)
def test_verdict(serving: dict, failed: dict, intended: dict, served: set, kind: str, blamed: dict, detail: str) -> None:
    outcome = verdict(worker(7, serving, failed), intended, served)
    assert (outcome.kind, outcome.failed, outcome.pid) == (kind, blamed, 7)
    assert detail in outcome.detail


@pytest.mark.parametrize(("now", "before", "new"), [
    (target(a=((2, 1), 1)), target(a=((1,), 1)), {("a", 2)}),
    (target(a=((2, 1), 2)), target(a=((1,), 1)), {("a", 2)}),  # keep two: only 2 is new
    (target(a=((1,), 1)), target(a=((2, 1), 1)), {("a", 1)}),  # a rollback: 1 was not intended before
    (target(a=((1,), 1), b=((4,), 1)), target(a=((1,), 1)), {("b", 4)}),
    (target(a=((1,), 1)), target(a=((1,), 1)), set()),  # a reload: nothing new
    (Target(), target(a=((1,), 1)), set()),
])
def test_new_versions(now: Target, before: Target, new: set) -> None:
    assert new_versions(now, before) == new


@pytest.mark.parametrize(("kind", "attempt", "attempts", "blamed_new", "step"), [
    (SUCCEEDED, 1, 3, False, Step.DONE),
    (SUCCEEDED, 3, 3, True, Step.DONE),  # nothing is counted after a success
    (VERSIONS_FAILED, 1, 3, False, Step.ABORT),  # a version's fault: never retried
    (WORKER_LOST, 1, 3, False, Step.RETRY),
    (WORKER_LOST, 2, 3, False, Step.RETRY),
    (WORKER_LOST, 3, 3, False, Step.GIVE_UP),
    (WORKER_LOST, 1, 3, True, Step.ABORT),  # the deaths failed a version this target brings
    (WORKER_LOST, 1, 1, False, Step.GIVE_UP),
])
def test_next_step(kind: str, attempt: int, attempts: int, blamed_new: bool, step: Step) -> None:
    assert next_step(kind, attempt, attempts, blamed_new) is step


@pytest.mark.parametrize(("attempt", "backoff", "delay"), [(1, 5.0, 5.0), (2, 5.0, 10.0), (3, 5.0, 20.0), (1, 0.01, 0.01), (4, 1.0, 8.0)])
def test_retry_delay_doubles_from_the_backoff(attempt: int, backoff: float, delay: float) -> None:
    assert retry_delay(attempt, backoff) == delay


DEATHS = [
    # (exits, served, marked, details, counted)
    pytest.param({1: WorkerExit("killed", ("a", 2))}, set(), set(), {}, [(("a", 2), "worker 1 killed")], id="a-death-counts"),
    pytest.param({1: WorkerExit("timeout", ("a", 2))}, set(), set(), {1: "new worker 1 exited"},
                 [(("a", 2), "new worker 1 exited")], id="the-driver-s-detail-wins"),
    pytest.param({1: WorkerExit("graceful", ("a", 2))}, set(), set(), {}, [], id="graceful-never"),
    pytest.param({1: WorkerExit("killed", None)}, set(), set(), {}, [], id="not-loading-never"),
    pytest.param({1: WorkerExit("killed", ("a", 2))}, {("a", 2)}, set(), {}, [], id="served-elsewhere-never"),
    pytest.param({1: WorkerExit("killed", ("a", 2))}, set(), {("a", 2)}, {}, [], id="marked-already-never"),
    pytest.param({3: WorkerExit("killed", ("a", 2)), 1: WorkerExit("timeout", ("b", 1))}, set(), set(), {},
                 [(("b", 1), "worker 1 timeout"), (("a", 2), "worker 3 killed")], id="in-pid-order"),
]


@pytest.mark.parametrize(("exits", "served", "marked", "details", "counted"), DEATHS)
def test_deaths_to_count(exits: dict, served: set, marked: set, details: dict, counted: list) -> None:
    assert deaths_to_count(exits, served, marked.__contains__, details) == counted


def test_describe_exit_names_the_version_being_loaded() -> None:
    assert describe_exit(9, WorkerExit("killed", ("a", 2))) == "new worker 9 exited while loading a version 2 (killed)"
    assert describe_exit(9, WorkerExit("timeout", None)) == "new worker 9 exited (timeout)"


def test_workers_served_counts_live_loaded_workers_only() -> None:
    states = {1: worker(1, {"a": [1]}), 2: worker(2, {"a": [2]}), 3: worker(3, {"a": [3]}, phase=LOADING)}
    assert Workers(states, (1, 3)).served() == {("a", 1)}  # 2 is gone; 3 still loading
    assert Workers(states, (1, 2, 3)).served() == {("a", 1), ("a", 2)}


@pytest.mark.parametrize(("generations", "live", "current", "given_up", "stragglers"), [
    ({1: "cur", 2: "cur"}, (1, 2), "cur", "", []),
    ({1: "cur", 2: "old"}, (1, 2), "cur", "", [2]),
    ({1: "cur", 2: "old"}, (1,), "cur", "", []),  # not live: noise
    ({1: "cur", 2: "bad"}, (1, 2), "cur", "bad", []),  # given up: left until something changes
    ({1: "cur", 2: ""}, (1, 2), "cur", "", []),  # no target published when it started
])
def test_stragglers(generations: dict, live: tuple, current: str, given_up: str, stragglers: list) -> None:
    states = {pid: worker(pid, {}, generation=generation) for pid, generation in generations.items()}
    assert Workers(states, live).stragglers(current, given_up) == stragglers


def test_ahead_of_includes_workers_still_loading() -> None:
    states = {1: worker(1, {}, generation="old"), 2: worker(2, {}, generation="new", phase=LOADING), 3: worker(3, {}, generation="new")}
    assert Workers(states, (1, 2)).ahead_of("old") == [2]


@pytest.mark.parametrize(("unsettled_for", "waits"), [
    (0.0, False),  # every directory settled
    (0.5, True),
    (SETTLE_WAIT_POLLS * 1.0 - 0.01, True),
    (SETTLE_WAIT_POLLS * 1.0, False),  # a copy that outlasts the wait rolls apart
])
def test_waits_for_copy(unsettled_for: float, waits: bool) -> None:
    assert waits_for_copy(unsettled_for, poll_interval=1.0) is waits
