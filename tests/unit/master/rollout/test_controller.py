"""The rollout controller against a fake arbiter: which versions fail, retries, the worker count, reloads, config."""

from __future__ import annotations

import logging

import dataclasses
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from server import tls
from server.config import load_config
from server.master.fleet import Fleet
from server.master.rollout import RolloutController, RolloutSettings, ledger, policy
from server.settings import Settings
from server.state import LOADED, WorkerState, read_worker_states, write_worker_state
from server.target import Target, read_failed, read_target
from tests.certificates import make_ca, make_cert
from tests.unit.master.fake_arbiter import (
    DIE,
    HANG,
    FakeArbiter,
    failing,
    serve_intended,
)

WORKERS = 2
KNOBS = RolloutSettings(poll_interval=60, boot_timeout=1, graceful_timeout=1, attempts=3, backoff=0.01)


def add_version(models: Path, name: str, version: int) -> Path:
    """A version directory with a (dummy) model file; the controller never opens it."""
    directory = models / name / str(version)
    directory.mkdir(parents=True)
    (directory / "model.keras").write_bytes(os.urandom(64))
    return directory


def wait_for(condition: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class Fixture:
    """A repository, a run directory, a fake arbiter with booted workers and the controller over them."""

    def __init__(self, tmp_path: Path, tls_settings: Settings | None = None) -> None:
        self.models = tmp_path / "models"
        self.run_dir = tmp_path / "run"
        self.conf = tmp_path / "models.toml"
        add_version(self.models, "a", 1)
        add_version(self.models, "b", 4)
        self.arbiter = FakeArbiter(self.run_dir, WORKERS)
        self.controller = RolloutController(
            Fleet(self.arbiter, self.arbiter.send_signal), self.models, self.conf, self.run_dir, KNOBS,
            load_config(self.conf), tls_settings,
        )
        self.arbiter.controller = self.controller
        self.controller.publish_initial_target()
        self.arbiter.manage_workers()
        wait_for(lambda: len(self.loaded()) == WORKERS, "the first workers")

    def loaded(self) -> dict[int, WorkerState]:
        """Loaded states of the workers alive now."""
        return {pid: s for pid, s in read_worker_states(self.run_dir).items() if s.loaded and pid in self.arbiter.WORKERS}

    def serving(self) -> list[dict[str, list[int]]]:
        return [{m: r.serving for m, r in s.models.items()} for s in self.loaded().values()]

    def settle(self) -> None:
        """Two polls: a new version directory counts once it did not change between them."""
        self.controller.poll()
        self.controller.poll()


@pytest.fixture
def fx(tmp_path: Path) -> Iterator[Fixture]:
    fixture = Fixture(tmp_path)
    yield fixture
    fixture.controller.stop()


def test_only_the_version_that_failed_is_marked_and_the_healthy_one_rolls_out(fx: Fixture) -> None:
    fx.arbiter.boot = failing({("b", 5)})
    add_version(fx.models, "a", 2)
    add_version(fx.models, "b", 5)
    fx.settle()  # the rollout of a/2 + b/5 is aborted: only b/5 failed
    assert list(read_failed(fx.run_dir)) == ["b"] and list(read_failed(fx.run_dir)["b"]) == [5]
    assert "is broken" in read_failed(fx.run_dir)["b"][5].reason
    fx.controller.poll()  # the rest rolls out
    assert fx.serving() == [{"a": [2], "b": [4]}] * WORKERS
    assert fx.arbiter.num_workers == WORKERS and len(fx.arbiter.WORKERS) == WORKERS


def test_a_new_worker_killed_while_loading_is_retried_and_the_count_restored(fx: Fixture) -> None:
    deaths = iter([DIE])
    fx.arbiter.boot = lambda pid, target: next(deaths, None) or serve_intended(pid, target)
    add_version(fx.models, "a", 2)
    fx.settle()
    assert read_failed(fx.run_dir) == {}  # a death is not the version's fault, once
    assert fx.serving() == [{"a": [2], "b": [4]}] * WORKERS
    assert fx.arbiter.num_workers == WORKERS and len(fx.arbiter.WORKERS) == WORKERS
    # The victim, and gunicorn's replacement for it when the withdrawal finds that one still loading (killed too).
    assert 1 <= [reason for _, reason in fx.arbiter.exits].count("killed") <= 2


def test_a_new_worker_that_dies_and_is_replaced_between_two_looks_is_still_a_lost_try(
        fx: Fixture, caplog: pytest.LogCaptureFixture) -> None:
    """A worker from the zygote loads in tenths of a second: it can die and be respawned within one 0.2 s look."""
    deaths = iter([DIE])
    fx.arbiter.boot = lambda pid, target: next(deaths, None) or serve_intended(pid, target)
    fx.arbiter.wakeup_delay = 0.05  # forked after the rollout's first look; dead and replaced before its second
    with caplog.at_level(logging.WARNING, "forkserve.rollout"):
        add_version(fx.models, "a", 2)
        fx.settle()
    dead = next(pid for pid, reason in fx.arbiter.exits if reason == "killed")
    assert any(f"try 1 of 3: new worker {dead} exited" in r.getMessage() for r in caplog.records), caplog.text
    assert fx.serving() == [{"a": [2], "b": [4]}] * WORKERS


def dies_loading(model: str, version: int, run_dir: Path):
    """A boot that reports loading `model`/`version` and dies there (OOM, a crash in TF) when the target has it."""

    def boot(pid: int, target: Target) -> WorkerState | str:
        wanted = target.models.get(model)
        if wanted is not None and wanted.candidates[:1] == (version,):
            write_worker_state(run_dir, WorkerState(pid, target.generation, loading=(model, version)))
            return DIE
        return serve_intended(pid, target)

    return boot


def test_a_version_that_kills_every_worker_loading_it_is_failed_after_the_attempts(fx: Fixture) -> None:
    fx.arbiter.boot = dies_loading("b", 5, fx.run_dir)
    add_version(fx.models, "b", 5)
    fx.settle()
    failed = read_failed(fx.run_dir)
    assert list(failed) == ["b"] and "workers died loading it" in failed["b"][5].reason
    assert fx.arbiter.num_workers == WORKERS
    fx.controller.poll()
    assert fx.serving() == [{"a": [1], "b": [4]}] * WORKERS


def test_a_new_worker_that_never_reports_is_withdrawn_and_the_rollout_given_up_until_a_reload(fx: Fixture) -> None:
    fx.arbiter.boot = lambda pid, target: HANG
    fx.arbiter.report_loading = False  # stuck before its first version (importing TensorFlow, say)
    first = fx.loaded()
    add_version(fx.models, "a", 2)
    fx.settle()
    assert read_failed(fx.run_dir) == {}  # hung before any version: nothing to blame
    assert [reason for _, reason in fx.arbiter.exits] == ["killed"] * KNOBS.attempts  # withdrawn: SIGTERM cannot stop a load
    assert fx.arbiter.num_workers == WORKERS and set(fx.arbiter.WORKERS) == set(first)
    assert read_target(fx.run_dir).intended() == {"a": [1], "b": [4]}  # replacements load what runs
    fx.controller.poll()
    assert set(fx.arbiter.WORKERS) == set(first)  # given up: not retried on every poll
    fx.arbiter.boot = serve_intended
    fx.controller.request_reload("test")
    fx.controller.poll()
    assert fx.serving() == [{"a": [2], "b": [4]}] * WORKERS


def test_a_new_worker_that_hangs_loading_a_version_is_killed_each_try_and_the_version_failed(fx: Fixture) -> None:
    """As tests/e2e/test_faults.py sees it with real workers: each withdrawn worker counts against the version it loads."""
    fx.arbiter.boot = lambda pid, target: HANG if target.intended()["a"] == [2] else serve_intended(pid, target)
    add_version(fx.models, "a", 2)
    fx.settle()
    reason = read_failed(fx.run_dir)["a"][2].reason
    assert f"died loading it {KNOBS.attempts} times" in reason and "not ready within 1s (loading a version 2)" in reason
    assert fx.arbiter.num_workers == WORKERS and len(fx.arbiter.WORKERS) == WORKERS
    fx.controller.poll()
    assert fx.serving() == [{"a": [1], "b": [4]}] * WORKERS


def test_an_error_between_adding_and_retiring_a_worker_withdraws_the_extra_one(fx: Fixture, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("a bug in the rollout")

    monkeypatch.setattr(policy, "verdict", broken)  # the driver asks it once the new worker loaded
    first = set(fx.loaded())
    add_version(fx.models, "a", 2)
    fx.controller.poll()
    with pytest.raises(RuntimeError, match="a bug"):
        fx.controller.poll()
    wait_for(lambda: set(fx.arbiter.WORKERS) == first, "the extra worker to go")
    assert fx.arbiter.num_workers == WORKERS


def test_a_reload_asked_for_during_a_rollout_is_not_lost(fx: Fixture) -> None:
    add_version(fx.models, "a", 2)
    fx.controller.poll()
    asked = threading.Event()

    def boot_and_ask(pid: int, target: Target) -> WorkerState:
        if not asked.is_set():
            asked.set()
            fx.controller.request_reload("SIGHUP during the rollout")
        return serve_intended(pid, target)

    fx.arbiter.boot = boot_and_ask
    fx.controller.poll()  # rolls a/2 out; the reload arrives meanwhile
    after_rollout = set(fx.loaded())
    fx.controller.poll()  # the reload: every worker replaced
    assert not after_rollout & set(fx.loaded()) and len(fx.loaded()) == WORKERS


def test_touching_or_rewriting_a_served_version_changes_nothing(fx: Fixture) -> None:
    before, generation = set(fx.loaded()), fx.controller.current.generation
    model_file = fx.models / "a" / "1" / "model.keras"
    os.utime(model_file, (1, 1))  # touch
    model_file.write_bytes(model_file.read_bytes())  # rsync of identical content: same size, new mtime
    fx.controller.poll()
    fx.controller.poll()
    assert fx.controller.current.generation == generation and set(fx.loaded()) == before
    assert read_target(fx.run_dir).intended() == {"a": [1], "b": [4]}


def test_a_served_version_whose_files_change_keeps_serving_and_is_reported(fx: Fixture, caplog: pytest.LogCaptureFixture) -> None:
    before = set(fx.loaded())
    (fx.models / "a" / "1" / "model.keras").write_bytes(os.urandom(100))
    fx.controller.poll()
    fx.controller.poll()
    assert set(fx.loaded()) == before and read_target(fx.run_dir).intended() == {"a": [1], "b": [4]}
    reports = [r.message for r in caplog.records if "changed on disk" in r.message]
    assert len(reports) == 1 and "model a version 1" in reports[0] and "resized model.keras" in reports[0]


def test_a_failed_version_whose_files_change_is_tried_again_once_settled(fx: Fixture) -> None:
    fx.arbiter.boot = failing({("a", 2)})
    half = add_version(fx.models, "a", 2)
    fx.settle()
    assert 2 in read_failed(fx.run_dir)["a"]
    fx.arbiter.boot = serve_intended
    (half / "model.keras").write_bytes(os.urandom(128))  # the copy completes
    fx.controller.poll()  # changed: waits to settle again
    assert fx.serving() == [{"a": [1], "b": [4]}] * WORKERS
    fx.controller.poll()
    assert fx.serving() == [{"a": [2], "b": [4]}] * WORKERS


def test_a_broken_config_edit_keeps_the_last_good_one_and_the_fix_rolls_out(fx: Fixture) -> None:
    before = set(fx.loaded())
    fx.conf.write_text('[models.a]\nmax_batch_size = "eight"\n')
    fx.settle()
    assert set(fx.loaded()) == before
    problem = read_target(fx.run_dir).config_problem
    assert problem is not None and problem.model == "a" and "max_batch_size must be an integer" in problem.message
    fx.conf.write_text("[models.a]\nmax_batch_size = 8\n")
    fx.settle()
    target = read_target(fx.run_dir)
    assert target.config_problem is None and target.config.for_model("a").max_batch_size == 8
    assert not before & set(fx.loaded())  # a configuration change rolls every worker
    assert {s.generation for s in fx.loaded().values()} == {target.generation}


def test_a_worker_that_dies_loading_a_version_at_boot_counts_against_it(fx: Fixture) -> None:
    # No rollout: gunicorn respawns a worker into the same death; the master stops that.
    for pid in range(5000, 5000 + KNOBS.attempts):
        write_worker_state(fx.run_dir, WorkerState(pid, "g", loading=("c", 1)))
        fx.controller.worker_exited(pid, "killed")
    add_version(fx.models, "c", 1)
    fx.controller.poll()
    assert "died loading it 3 times" in read_failed(fx.run_dir)["c"][1].reason


def test_a_graceful_exit_or_a_served_version_never_counts(fx: Fixture) -> None:
    pid = next(iter(fx.loaded()))
    for reason in ("graceful",) * 5:
        write_worker_state(fx.run_dir, WorkerState(pid, "g", loading=("a", 1)))
        fx.controller.worker_exited(pid, reason)
    other = next(p for p in fx.loaded() if p != pid)
    for _ in range(5):  # a/1 is served by a live worker: deaths while loading it are not its fault
        write_worker_state(fx.run_dir, WorkerState(other + 100, "g", loading=("a", 1)))
        fx.controller.worker_exited(other + 100, "killed")
    fx.controller.poll()
    assert read_failed(fx.run_dir) == {}
    assert all(s.phase == LOADED for s in fx.loaded().values())


def test_a_version_one_new_worker_serves_is_not_failed_by_another_s_bad_luck(fx: Fixture) -> None:
    unlucky = iter([False, True])  # the second new worker fails to load b/5 (a one-off, caught OOM)
    fx.arbiter.boot = lambda pid, target: (failing({("b", 5)}) if next(unlucky, False) else serve_intended)(pid, target)
    add_version(fx.models, "b", 5)
    fx.settle()
    fx.controller.poll()
    assert read_failed(fx.run_dir) == {}
    assert fx.serving() == [{"a": [1], "b": [5]}] * WORKERS


def test_workers_left_on_an_aborted_target_are_brought_back(fx: Fixture) -> None:
    second = iter([False, True])
    fx.arbiter.boot = lambda pid, target: (failing({("b", 5)}) if next(second, False) else serve_intended)(pid, target)
    add_version(fx.models, "b", 5)
    fx.controller.poll()
    fx.controller.poll()  # the first new worker serves b/5; the second fails it: the rollout gives b/5 up
    fx.arbiter.boot = failing({("b", 5)})
    write_worker_state(fx.run_dir, WorkerState(1, "x"))  # noise: not a live worker
    for _ in range(3):
        fx.controller.poll()
    assert len({s.generation for s in fx.loaded().values()}) == 1  # one generation again


def test_a_failed_version_copied_again_that_kills_workers_gets_strikes(fx: Fixture) -> None:
    fx.arbiter.boot = failing({("b", 5)})
    copy = add_version(fx.models, "b", 5)
    add_version(fx.models, "a", 2)
    fx.settle()
    assert 5 in read_failed(fx.run_dir)["b"]
    fx.controller.poll()  # a/2 rolls out without b/5
    assert fx.serving() == [{"a": [2], "b": [4]}] * WORKERS
    fx.arbiter.boot = dies_loading("b", 5, fx.run_dir)
    (copy / "model.keras").write_bytes(os.urandom(200))  # re-copied: tried again once settled
    fx.settle()
    fx.controller.poll()
    assert "workers died loading it" in read_failed(fx.run_dir)["b"][5].reason
    fx.controller.poll()
    assert fx.serving() == [{"a": [2], "b": [4]}] * WORKERS


def test_a_new_model_whose_only_version_fails_is_left_out_and_reported_without_replacing_the_workers(fx: Fixture) -> None:
    fx.arbiter.boot = failing({("c", 1)})
    add_version(fx.models, "c", 1)
    fx.settle()  # the rollout of c/1 is aborted: c/1 failed
    assert "is broken" in read_failed(fx.run_dir)["c"][1].reason
    after_abort = set(fx.loaded())
    for _ in range(3):
        fx.controller.poll()
    target = read_target(fx.run_dir)
    assert "c" not in target.models and set(fx.loaded()) == after_abort  # nothing to roll out for c
    assert target.unservable["c"].startswith("every version failed: version 1: rollout aborted")
    assert "tried again when the files of c/1 or the settings of model c" in target.unservable["c"]


def test_a_model_directory_without_versions_is_reported_with_what_was_expected(
    fx: Fixture, caplog: pytest.LogCaptureFixture,
) -> None:
    (fx.models / "d" / "v2").mkdir(parents=True)
    (fx.models / "d" / "model.keras").write_bytes(b"x")
    before = set(fx.loaded())
    for _ in range(3):
        fx.controller.poll()
    target = read_target(fx.run_dir)
    assert "d" not in target.models and set(fx.loaded()) == before
    assert target.unservable["d"].startswith("no version directory (model.keras: ignored: a model file goes in")
    assert "v2: ignored: version directories are named by a positive integer (did you mean d/2?)" in target.unservable["d"]
    told = [r.message for r in caplog.records if "model d:" in r.message]
    assert len(told) == 2  # once each, not every poll


def test_a_failed_version_is_tried_again_when_its_bytes_change_at_the_same_sizes_but_not_when_touched(fx: Fixture) -> None:
    fx.arbiter.boot = failing({("a", 2)})
    bad = add_version(fx.models, "a", 2)
    fx.settle()
    assert 2 in read_failed(fx.run_dir)["a"]
    fx.arbiter.boot = serve_intended
    model_file = bad / "model.keras"
    os.utime(model_file, (1, 1))  # touched: the same bytes, still failed
    fx.controller.poll()
    fx.controller.poll()
    assert fx.serving() == [{"a": [1], "b": [4]}] * WORKERS
    model_file.write_bytes(os.urandom(len(model_file.read_bytes())))  # replaced: same name, same size
    fx.controller.poll()
    fx.controller.poll()
    assert fx.serving() == [{"a": [2], "b": [4]}] * WORKERS
    assert read_failed(fx.run_dir) == {}  # served now: no longer reported failed


def test_a_failed_version_is_tried_again_when_its_model_settings_change(fx: Fixture) -> None:
    fx.arbiter.boot = failing({("a", 2)})
    add_version(fx.models, "a", 2)
    fx.settle()
    assert 2 in read_failed(fx.run_dir)["a"]
    fx.arbiter.boot = serve_intended
    fx.conf.write_text("[models.b]\nmax_batch_size = 8\n")  # another model's settings: a/2 stays failed
    fx.settle()
    assert fx.serving() == [{"a": [1], "b": [4]}] * WORKERS and 2 in read_failed(fx.run_dir)["a"]
    fx.conf.write_text("[models.b]\nmax_batch_size = 8\n[models.a]\nhandler = true\n")  # as the reason says
    fx.settle()
    assert fx.serving() == [{"a": [2], "b": [4]}] * WORKERS


def test_a_configuration_change_waits_for_a_version_still_being_copied_and_both_roll_out_once(fx: Fixture) -> None:
    rolled: list[str] = []
    fx.arbiter.boot = lambda pid, target: rolled.append(target.generation) or serve_intended(pid, target)
    fx.conf.write_text("[models.c]\nmax_batch_size = 8\n")
    copying = add_version(fx.models, "c", 1)
    fx.controller.poll()  # both seen once
    (copying / "model.keras").write_bytes(os.urandom(128))  # the copy goes on
    fx.controller.poll()  # the configuration settled; the copy did not: wait
    assert rolled == []
    fx.controller.poll()
    assert fx.serving() == [{"a": [1], "b": [4], "c": [1]}] * WORKERS
    assert len(set(rolled)) == 1  # one rollout brought both


def test_settings_for_a_model_the_repository_no_longer_has_are_logged_once(
    fx: Fixture, caplog: pytest.LogCaptureFixture,
) -> None:
    fx.conf.write_text("[models.renamed]\nmax_batch_size = 8\n")
    for _ in range(4):
        fx.controller.poll()
    told = [r.message for r in caplog.records if "settings for model renamed" in r.message]
    assert len(told) == 1 and "renamed or removed?" in told[0]


def test_a_version_no_worker_could_load_is_failed_by_the_master_without_a_rollout(fx: Fixture) -> None:
    before = set(fx.loaded())
    nested = fx.models / "a" / "2" / "export"
    nested.mkdir(parents=True)
    (nested / "saved_model.pb").write_bytes(b"x")
    fx.settle()
    reason = read_failed(fx.run_dir)["a"][2].reason
    assert reason.startswith("no model file") and "move the content of export/ up into 2/" in reason
    assert set(fx.loaded()) == before and read_target(fx.run_dir).intended() == {"a": [1], "b": [4]}


def test_a_served_version_whose_directory_turns_unloadable_keeps_serving_and_is_reported_once(
    fx: Fixture, caplog: pytest.LogCaptureFixture,
) -> None:
    before = set(fx.loaded())
    (fx.models / "a" / "1" / "extra.h5").write_bytes(b"x")  # two model files now: a new worker could not load it
    for _ in range(4):
        fx.controller.poll()
    assert read_failed(fx.run_dir) == {} and set(fx.loaded()) == before
    assert read_target(fx.run_dir).intended() == {"a": [1], "b": [4]}
    told = [r.message for r in caplog.records if "is served, but its directory now reads as unloadable" in r.message]
    assert len(told) == 1 and "several model files" in told[0]


def test_a_run_directory_that_refuses_the_failed_mark_still_falls_back(fx: Fixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    fx.arbiter.boot = failing({("a", 2)})
    add_version(fx.models, "a", 2)
    monkeypatch.setattr(ledger, "write_failed", full)  # the disk fills between the poll's probe and the mark
    with pytest.raises(OSError):
        fx.settle()
    assert read_target(fx.run_dir).intended() == {"a": [1], "b": [4]}  # respawned workers load what runs


def test_a_failed_mark_whose_version_changed_is_forgotten_even_when_a_newer_version_serves(fx: Fixture) -> None:
    fx.arbiter.boot = failing({("a", 2)})
    bad = add_version(fx.models, "a", 2)
    fx.settle()
    fx.arbiter.boot = serve_intended
    add_version(fx.models, "a", 3)
    fx.settle()
    assert fx.serving() == [{"a": [3], "b": [4]}] * WORKERS and 2 in read_failed(fx.run_dir)["a"]
    (bad / "model.keras").write_bytes(os.urandom(64))  # fixed, but superseded: the policy never loads it again
    fx.controller.poll()
    fx.controller.poll()
    assert read_failed(fx.run_dir) == {}


def test_settings_that_arrive_with_their_model_s_first_copy_are_not_called_stray(
    fx: Fixture, caplog: pytest.LogCaptureFixture,
) -> None:
    fx.conf.write_text("[models.c]\nmax_batch_size = 8\n")
    copying = add_version(fx.models, "c", 1)
    for size in (100, 200, 300):  # still being copied over three polls
        (copying / "model.keras").write_bytes(os.urandom(size))
        fx.controller.poll()
    assert not [r for r in caplog.records if "settings for model c" in r.message]


def test_a_renewed_tls_certificate_replaces_every_worker_and_a_bad_one_none(tmp_path: Path) -> None:
    """Workers serve the set they were forked with (server.tls): a new one needs new workers; a bad one is kept out."""
    ca = make_ca(tmp_path / "pki", "ca")
    first, renewed = (make_cert(tmp_path / "pki", ca, name, name, serial) for serial, name in ((1, "first"), (2, "renewed")))
    shutil.copy(first.cert, tmp_path / "tls.crt")
    shutil.copy(first.key, tmp_path / "tls.key")
    settings = dataclasses.replace(Settings.from_env(), tls_cert=tmp_path / "tls.crt", tls_key=tmp_path / "tls.key")
    before = tls.accepted()
    tls.accept(tls.check(tls.read(settings), settings))
    fixture = Fixture(tmp_path, settings)
    try:
        pids = set(fixture.loaded())
        (tmp_path / "tls.key").write_bytes(renewed.key.read_bytes())  # not the certificate's key
        fixture.settle()
        assert set(fixture.loaded()) == pids and fixture.controller.tls is not None and fixture.controller.tls.problem
        shutil.copy(renewed.cert, tmp_path / "tls.crt")
        fixture.settle()
        assert not set(fixture.loaded()) & pids and len(fixture.loaded()) == WORKERS
        assert tls.accepted().chain.strip() == renewed.cert.read_bytes().strip()
        assert fixture.arbiter.num_workers == WORKERS
    finally:
        fixture.controller.stop()
        tls._accepted = before
