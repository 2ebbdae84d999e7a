"""Explicit model control in the master, against a fake arbiter: loads, unloads, overrides, failures, the index, the order."""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from server import control
from server.config import load_config
from server.master.fleet import Fleet
from server.master.rollout import RolloutController
from server.master.rollout.control import POLL_REFUSAL
from server.state import write_json
from server.target import read_target
from tests.unit.master.fake_arbiter import FakeArbiter, failing
from tests.unit.master.rollout.test_controller import KNOBS, WORKERS, add_version, wait_for


class Explicit:
    """Models a, b and c in the repository, a controller in the given mode over 2 fake workers."""

    def __init__(self, tmp_path: Path, mode: str = "explicit", startup: tuple[str, ...] = ("a",)) -> None:
        self.models, self.run_dir, conf = tmp_path / "models", tmp_path / "run", tmp_path / "models.toml"
        for name in ("a", "b", "c"):
            add_version(self.models, name, 1)
        conf.write_text("[models.b]\nmax_batch_size = 32\n")
        self.arbiter = FakeArbiter(self.run_dir, WORKERS)
        self.controller = RolloutController(Fleet(self.arbiter, self.arbiter.send_signal), self.models, conf,
                                            self.run_dir, KNOBS, load_config(conf), model_control=mode,
                                            load_models=startup)
        self.arbiter.controller = self.controller
        self.controller.publish_initial_target()
        self.arbiter.manage_workers()
        wait_for(lambda: len(self.pids()) == WORKERS, "the first workers")
        self.controller.poll()  # the first workers are in place: nothing to roll

    def pids(self) -> list[int]:
        return sorted(pid for pid, worker in self.arbiter.WORKERS.items() if worker.booted)

    def ask(self, action: str, model: str, override: dict | None = None, pid: int | None = None) -> str:
        """A worker's request, as server.control.ask writes it, held by worker `pid` (default: the first)."""
        request_id = f"{time.time_ns():020d}-1-{secrets.token_hex(4)}"
        write_json(self.run_dir / control.REQUESTS / f"{request_id}.json",
                   {"action": action, "model": model, "override": override or {}, "pid": pid or self.pids()[0]})
        return request_id

    def answer(self, request_id: str) -> tuple[bool, str, bool]:
        found = control.take_answer(self.run_dir, request_id)
        assert found is not None, "no answer"
        return found

    def served(self) -> set[str]:
        target = read_target(self.run_dir)
        assert target is not None
        return set(target.models)


@pytest.fixture
def fx(tmp_path: Path) -> Iterator[Explicit]:
    fixture = Explicit(tmp_path)
    yield fixture
    fixture.controller.stop()


def test_explicit_mode_serves_the_startup_list_and_indexes_every_model(fx: Explicit) -> None:
    assert fx.served() == {"a"}
    index = control.read_index(fx.run_dir)
    assert {name: entry["state"] for name, entry in index.items()} == {"a": control.READY, "b": "", "c": ""}


def test_a_load_rolls_every_worker_the_caller_last_and_answers_as_it_retires_it(fx: Explicit) -> None:
    caller = fx.pids()[0]  # the oldest: without the rule, replaced first
    request = fx.ask("load", "b", pid=caller)
    fx.controller.poll()
    assert fx.answer(request) == (True, "loaded 'b'", True)
    assert fx.served() == {"a", "b"}
    retired = [pid for pid, reason in fx.arbiter.exits if reason == "graceful"]
    assert retired[-1] == caller and len(retired) == WORKERS
    assert control.read_index(fx.run_dir)["b"] == {"state": control.READY, "reason": "", "versions": [1]}
    assert not list((fx.run_dir / control.REQUESTS).iterdir())


def test_a_load_s_override_applies_over_models_toml_and_a_reload_of_the_same_is_answered_at_once(fx: Explicit) -> None:
    request = fx.ask("load", "b", {"max_batch_delay_ms": 2.0})
    fx.controller.poll()
    assert fx.answer(request)[0]
    config = read_target(fx.run_dir).config.for_model("b")  # type: ignore[union-attr]
    assert (config.max_batch_size, config.max_batch_delay_ms) == (32, 2.0)  # models.toml's, then the load's
    exits = len(fx.arbiter.exits)
    again = fx.ask("load", "b", {"max_batch_delay_ms": 2.0})
    fx.controller.poll()
    assert fx.answer(again) == (True, "loaded 'b'", False) and len(fx.arbiter.exits) == exits  # nothing to roll


def test_loads_that_cannot_be_done_are_refused_before_any_rollout(fx: Explicit) -> None:
    missing = fx.ask("load", "nope")
    bad = fx.ask("load", "b", {"allowed_batch_sizes": [4, 8]})
    fx.controller.poll()
    ok, message, _ = fx.answer(missing)
    assert not ok and message.startswith("failed to load 'nope': the repository") and "has no model 'nope'" in message
    ok, message, _ = fx.answer(bad)
    assert not ok and "allowed_batch_sizes must increase and end with max_batch_size" in message
    assert fx.arbiter.exits == [] and fx.served() == {"a"}


def test_a_load_whose_version_fails_is_answered_with_why_and_the_model_stays_out(fx: Explicit) -> None:
    fx.arbiter.boot = failing({("c", 1)})
    request = fx.ask("load", "c")
    fx.controller.poll()
    ok, message, retiring = fx.answer(request)
    assert not ok and not retiring and message.startswith("failed to load 'c': ") and "c 1 is broken" in message
    assert fx.served() == {"a"} and "c" not in fx.controller.control.loaded
    entry = control.read_index(fx.run_dir)["c"]
    assert entry["state"] == control.UNAVAILABLE and "c 1 is broken" in entry["reason"]


def test_an_unload_takes_the_model_out_of_every_worker(fx: Explicit) -> None:
    request = fx.ask("unload", "a")
    fx.controller.poll()
    assert fx.answer(request) == (True, "unloaded 'a'", True)
    assert fx.served() == set()
    assert control.read_index(fx.run_dir)["a"] == {"state": control.UNAVAILABLE, "reason": "unloaded", "versions": []}


def test_poll_mode_refuses_loads_and_unloads(tmp_path: Path) -> None:
    fixture = Explicit(tmp_path, mode="poll", startup=())
    try:
        assert fixture.served() == {"a", "b", "c"}
        request = fixture.ask("unload", "a")
        fixture.controller.poll()
        assert fixture.answer(request) == (False, POLL_REFUSAL, False)
        assert fixture.served() == {"a", "b", "c"}
    finally:
        fixture.controller.stop()


def test_a_malformed_request_file_is_removed_and_a_planted_name_left_alone(fx: Explicit) -> None:
    requests = fx.run_dir / control.REQUESTS
    requests.mkdir(parents=True)
    malformed = requests / f"{time.time_ns():020d}-1-{secrets.token_hex(4)}.json"
    malformed.write_text('{"action": "format", "model": "a"}')
    planted = requests / "evil.json"
    planted.write_text("{}")
    fx.controller.poll()
    assert not malformed.exists() and planted.exists() and fx.served() == {"a"}


def test_a_call_that_arrives_during_a_rollout_leaves_its_worker_to_the_next_pass(fx: Explicit) -> None:
    """Retired by the running rollout, its worker would hold its call until graceful_timeout: left, then replaced last."""
    fx.arbiter.num_workers = 3
    fx.arbiter.manage_workers()
    wait_for(lambda: len(fx.pids()) == 3, "a third worker")
    fx.controller.poll()  # it runs the target already
    first_caller, replaced_first, late_caller = fx.pids()
    first = fx.ask("load", "b", pid=first_caller)
    late: list[str] = []
    boot = fx.arbiter.boot

    def boot_and_call(pid: int, target):  # the first new worker's boot: a second call arrives meanwhile
        if not late:  # while replaced_first is replaced
            late.append(fx.ask("load", "c", pid=late_caller))
        return boot(pid, target)

    fx.arbiter.boot = boot_and_call
    fx.controller.poll()
    assert fx.answer(first)[0]
    assert late_caller in fx.arbiter.WORKERS  # not retired by the first rollout
    fx.arbiter.boot = boot
    fx.controller.poll()
    assert fx.answer(late[0]) == (True, "loaded 'c'", True)
    assert late_caller not in fx.arbiter.WORKERS and fx.served() == {"a", "b", "c"}
    assert [pid for pid, _ in fx.arbiter.exits][-1] == late_caller


def test_a_taken_call_does_not_wake_the_thread_again_and_a_new_one_does(fx: Explicit) -> None:
    fx.controller.control.calls.append(control.ControlRequest(fx.ask("load", "b"), "load", "b"))  # taken, not answered
    woke = threading.Event()
    thread = threading.Thread(target=lambda: (fx.controller._wait_for_a_pass(), woke.set()), daemon=True)
    thread.start()
    assert not woke.wait(0.8)  # poll_interval is 60 s: only a new call, or the wake event, ends the wait
    fx.ask("unload", "a")
    assert woke.wait(2.0)
