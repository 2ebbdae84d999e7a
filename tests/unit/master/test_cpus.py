"""server.master.cpus: CPU slots per worker and the choice for a new worker (pre_fork)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from server import settings
from server.master import cpus, hooks
from server.master.cpus import choose_slot, cpu_slots


def test_slots_split_the_allowed_cpus_evenly() -> None:
    assert cpu_slots([0, 1], 2) == [frozenset({0}), frozenset({1})]
    assert cpu_slots([2, 3, 4, 5, 6], 2) == [frozenset({2, 3}), frozenset({4, 5})]  # CPU 6 left over
    assert cpu_slots([0, 1], 3) == []  # more workers than CPUs: no pinning
    assert cpu_slots([0, 1], 0) == []


def test_new_workers_fill_the_least_used_slot() -> None:
    slots = cpu_slots([0, 1], 2)
    assert choose_slot(slots, []) == {0}
    assert choose_slot(slots, [frozenset({0})]) == {1}
    # a rollout's extra worker shares a slot; once the old worker on slot 0 is gone, its replacement gets 0
    assert choose_slot(slots, [frozenset({0}), frozenset({1})]) == {0}
    assert choose_slot(slots, [frozenset({1}), frozenset({0}), frozenset({1})]) == {0}
    assert choose_slot(slots, [None, frozenset({1})]) == {0}  # a worker forked before pinning counts for no slot


def test_no_slots_means_no_pinning() -> None:
    assert choose_slot([], [frozenset({0})]) is None


class FakeArbiter:
    """The parts of gunicorn's Arbiter that pre_fork reads, driven like gunicorn drives them."""

    def __init__(self, workers: int) -> None:
        self.cfg = SimpleNamespace(workers=workers)
        self.WORKERS: dict[int, SimpleNamespace] = {}
        self._age = 0

    def spawn(self) -> SimpleNamespace:
        """Arbiter.spawn_worker: a new worker object, pre_fork, then it joins WORKERS."""
        self._age += 1
        worker = SimpleNamespace(age=self._age)
        hooks.pre_fork(self, worker)
        self.WORKERS[self._age] = worker
        return worker

    def retire_oldest(self) -> None:
        """TTOU: gunicorn stops the oldest worker."""
        del self.WORKERS[min(self.WORKERS, key=lambda pid: self.WORKERS[pid].age)]

    def slots_in_use(self) -> list[frozenset[int]]:
        return sorted((w.forkserve_cpus for w in self.WORKERS.values()), key=min)


@pytest.fixture
def four_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinning forced on over a fixed CPU list, so the slot arithmetic does not depend on this machine."""
    monkeypatch.setenv("FORKSERVE_PIN_CPUS", "1")
    monkeypatch.setattr(settings, "_current", None)  # resolved again, from this environment
    monkeypatch.setattr(cpus, "allowed_cpus", lambda: [0, 1, 2, 3])


@pytest.mark.parametrize("workers", [2, 4])
def test_rollouts_keep_one_worker_per_slot(four_cpus: None, workers: int) -> None:
    arbiter = FakeArbiter(workers)
    for _ in range(workers):
        arbiter.spawn()
    every_slot = cpu_slots([0, 1, 2, 3], workers)
    assert arbiter.slots_in_use() == every_slot
    for _ in range(3):  # three rolling restarts: TTIN then TTOU, one worker at a time
        for _ in range(workers):
            arbiter.spawn()
            arbiter.retire_oldest()
        assert arbiter.slots_in_use() == every_slot


def test_a_crashed_workers_replacement_takes_its_slot(four_cpus: None) -> None:
    arbiter = FakeArbiter(2)
    first, second = arbiter.spawn(), arbiter.spawn()
    del arbiter.WORKERS[first.age]
    assert arbiter.spawn().forkserve_cpus == first.forkserve_cpus != second.forkserve_cpus
