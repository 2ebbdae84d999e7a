"""The arbiter as the rollout drives it: a worker more, one retired, the count restored exactly."""

from __future__ import annotations

import time
from pathlib import Path

from server.master.fleet import RETIRING_AGE, Fleet
from server.state import read_worker_states
from server.target import Target, write_target
from tests.unit.master.fake_arbiter import DIE, FakeArbiter, FakeWorker, serve_intended


def arbiter(tmp_path: Path, workers: int = 2) -> FakeArbiter:
    write_target(tmp_path, Target())
    fake = FakeArbiter(tmp_path, workers)
    fake.manage_workers()
    deadline = time.monotonic() + 5
    while sum(s.loaded for s in read_worker_states(tmp_path).values()) < workers:
        assert time.monotonic() < deadline, "the fake workers did not boot"
        time.sleep(0.01)
    return fake


def test_add_then_retire_a_named_worker_keeps_the_count(tmp_path: Path) -> None:
    fake = arbiter(tmp_path)
    fleet = Fleet(fake, fake.send_signal)
    old = fleet.pids()
    before = fleet.add_worker()
    assert set(before) == set(old) and len(fleet.pids()) == 3
    fleet.retire(old[1])  # not the oldest: the rollout names the worker that goes
    assert fake.num_workers == 2 and old[1] not in fleet.pids() and old[0] in fleet.pids()


def test_withdraw_restores_the_count_even_after_gunicorn_respawned_the_dead_extra(tmp_path: Path) -> None:
    fake = arbiter(tmp_path)
    fleet = Fleet(fake, fake.send_signal)
    old = set(fleet.pids())
    deaths = iter([DIE])
    fake.boot = lambda pid, target: next(deaths, None) or serve_intended(pid, target)
    before = fleet.add_worker()

    def respawned() -> set[int]:
        """The replacement of the dead extra. NOTE: gunicorn (and the fake) record an exit before they
        respawn, so the exit alone says nothing of the replacement: wait for both."""
        died = [exit for exit in fake.exits if exit[1] == "killed"]
        return set(fleet.pids()) - old if died else set()

    deadline = time.monotonic() + 5
    while not respawned():
        assert time.monotonic() < deadline, "the extra did not die and come back"
        time.sleep(0.01)
    replacement = respawned()
    assert len(replacement) == 1
    assert fleet.withdraw(before, kill=True) == sorted(replacement)
    assert fake.num_workers == 2 and set(fleet.pids()) == old


def test_wait_gone_returns_what_is_left_at_the_deadline(tmp_path: Path) -> None:
    fake = arbiter(tmp_path)
    fleet = Fleet(fake, fake.send_signal)
    pids = fleet.pids()
    assert fleet.wait_gone(pids, 0.05) == sorted(pids)
    fleet.kill([pids[0]])
    assert fleet.wait_gone([pids[0]], 1.0) == []


def test_a_worker_forked_while_a_withdrawal_runs_is_marked_retiring_at_birth(tmp_path: Path) -> None:
    fake = arbiter(tmp_path)
    fleet = Fleet(fake, fake.send_signal)
    before = fleet.add_worker()
    ages = [fake.WORKERS[pid].age for pid in before]
    fleet.withdraw(before, kill=False)
    late = FakeWorker(pid=99, age=max(ages) + 10)  # what spawn_worker hands pre_fork before WORKERS has it
    fleet.mark_newborn(late)
    assert late.age == RETIRING_AGE
    fleet.end_withdrawal()
    later = FakeWorker(pid=100, age=max(ages) + 11)
    fleet.mark_newborn(later)
    assert later.age == max(ages) + 11
