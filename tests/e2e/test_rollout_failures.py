"""Rollouts that go wrong, with real processes: one broken model among two, a new worker killed, served files touched.

The tests share one server and run in any order: each reads what the fleet serves when it starts
and publishes versions above the newest one.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

from server.state import read_worker_states
from server.target import read_failed
from tests.support.harness import Server, wait_until
from tests.support.metrics import samples, value
from tests.support.traffic import Traffic


@pytest.fixture(scope="module")
def two_models(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """2 workers serving models a and b (both the test MLP), version 1 each."""
    repo = tmp_path_factory.mktemp("failures-models")
    for name in ("a", "b"):
        shutil.copytree(model_repo / "mlp" / "1", repo / name / "1")
    server = Server(
        models_dir=repo, run_dir=tmp_path_factory.mktemp("failures-run"), workers=2,
        env={"FORKSERVE_POLL_INTERVAL": "0.5", "FORKSERVE_BOOT_TIMEOUT": "90", "FORKSERVE_ROLLOUT_BACKOFF": "1"},
    ).start()
    yield server
    server.stop()


def serving(server: Server) -> list[dict[str, list[int]]]:
    """What each loaded live worker serves."""
    states = read_worker_states(server.run_dir)
    return [{m: states[pid].serving(m) for m in ("a", "b")} for pid in server.worker_pids()]


def newest(server: Server, name: str) -> int:
    """The highest version directory of `name` (served, failed or not)."""
    return max(int(p.name) for p in (server.models_dir / name).iterdir() if p.name.isdigit())


def one_version(server: Server, name: str) -> int:
    """The version of `name` every live worker serves (they agree: no rollout runs)."""
    served = {tuple(each[name]) for each in serving(server)}
    assert len(served) == 1 and len(next(iter(served))) == 1, served
    return next(iter(served))[0]


def publish_by_rename(server: Server, name: str, version: int, model_bytes: bytes) -> Path:
    """A version written into a hidden directory, then renamed into place (as `publish` does)."""
    staging = server.models_dir / name / f".incoming-{version}"
    staging.mkdir()
    (staging / "model.keras").write_bytes(model_bytes)
    return staging


def test_touching_and_rewriting_the_served_version_under_traffic_changes_nothing(two_models: Server) -> None:
    server = two_models
    pids = server.worker_pids()
    version = one_version(server, "a")
    rollouts = value(samples(server), "forkserve_rollouts_total", result="succeeded")
    traffic = Traffic(f"{server.url}/v1/models/a:predict")
    traffic.start(4)
    try:
        model_file = server.models_dir / "a" / str(version) / "model.keras"
        for _ in range(3):  # `touch`, then an rsync of identical content (same bytes, new mtime)
            os.utime(model_file)
            wait_until(lambda: len(traffic.answers) > 20, 30, "traffic")
            model_file.write_bytes(model_file.read_bytes())
            deadline = time.monotonic() + 2.0  # four polls of the watcher
            wait_until(lambda: time.monotonic() > deadline, 5, "four polls")
    finally:
        traffic.finish()
    assert traffic.failures() == [] and len(traffic.answers) > 50
    assert {a[2] for a in traffic.answers} == {str(version)}
    assert server.worker_pids() == pids  # no rollout
    assert value(samples(server), "forkserve_rollouts_total", result="succeeded") == rollouts


def test_a_broken_version_rolled_out_with_a_healthy_one_fails_alone(two_models: Server) -> None:
    server = two_models
    a, b = newest(server, "a") + 1, newest(server, "b") + 1
    b_served = one_version(server, "b")
    good = (server.models_dir / "a" / "1" / "model.keras").read_bytes()
    healthy = publish_by_rename(server, "a", a, good)
    broken = publish_by_rename(server, "b", b, good[: len(good) // 2])
    os.rename(healthy, server.models_dir / "a" / str(a))
    os.rename(broken, server.models_dir / "b" / str(b))  # both in the same poll: one rollout
    wait_until(lambda: serving(server) == [{"a": [a], "b": [b_served]}] * 2, 180, f"a/{a} served by every worker")
    failed = read_failed(server.run_dir)
    assert b in failed["b"] and a not in failed.get("a", {})
    assert "not a valid .keras file" in failed["b"][b].reason
    # One answer about the broken version everywhere: END with the reason, not "Servable not found".
    status = server.get(f"/v1/models/b/versions/{b}").json()["model_version_status"][0]
    assert status["state"] == "END" and "not a valid .keras file" in status["status"]["error_message"]
    predict = server.post(f"/v1/models/b/versions/{b}:predict", json={"instances": [[0.5] * 20]})
    assert predict.status_code == 503 and "END" in predict.json()["error"] and "not a valid" in predict.json()["error"]
    ready = server.get(f"/v2/models/b/versions/{b}/ready")
    assert ready.status_code == 400 and ready.json()["ready"] is False and "END" in ready.json()["error"]
    assert server.post("/v1/models/b:predict", json={"instances": [[0.5] * 20]}).headers["X-Model-Version"] == str(b_served)
    scrape = samples(server)
    assert value(scrape, "forkserve_rollout_failed_versions_total", model="b", version=str(b)) == 1
    assert value(scrape, "forkserve_rollout_failed_versions_total", model="a", version=str(a)) == 0


def test_a_new_worker_killed_while_loading_is_retried_and_the_fleet_stays_at_two(two_models: Server) -> None:
    server = two_models
    b_served = one_version(server, "b")
    good = (server.models_dir / "a" / "1" / "model.keras").read_bytes()
    # NOTE: a worker forked by the zygote loads the MLP in a few tenths of a second; it is stopped the moment it
    # is seen loading, and killed only if it still was (else that publish rolls out and the next one is tried).
    for _ in range(5):
        before = set(server.worker_pids())
        a = newest(server, "a") + 1
        retries, log_start = value(samples(server), "forkserve_rollout_retries_total"), len(server.log())
        os.rename(publish_by_rename(server, "a", a, good), server.models_dir / "a" / str(a))

        def loading_worker() -> int | None:
            return next((pid for pid, state in read_worker_states(server.run_dir).items()
                         if not state.loaded and pid not in before), None)

        victim = wait_until(loading_worker, 60, "the rollout's new worker to start loading", interval=0.01)
        os.kill(victim, signal.SIGSTOP)
        state = read_worker_states(server.run_dir).get(victim)
        if state is not None and not state.loaded:
            break
        os.kill(victim, signal.SIGCONT)
        wait_until(lambda: serving(server) == [{"a": [a], "b": [b_served]}] * 2, 180, f"a/{a} served by every worker")
    os.kill(victim, signal.SIGKILL)  # the OOM killer, say, in the middle of its load
    wait_until(lambda: serving(server) == [{"a": [a], "b": [b_served]}] * 2, 180, f"a/{a} served by every worker")
    assert a not in read_failed(server.run_dir).get("a", {})
    wait_until(lambda: len(server.children()) == 2, 60, "two workers, not three")
    assert value(samples(server), "forkserve_rollout_retries_total") >= retries + 1
    # The gauge drops when the master reaps the retired worker (child_exit), a moment after it exits.
    wait_until(lambda: value(samples(server), "forkserve_workers_alive") == 2, 30, "forkserve_workers_alive == 2")
    log = server.log()[log_start:]
    assert "try 1 of 3" in log and f"new worker {victim} exited" in log


def test_a_served_version_that_turns_unloadable_keeps_serving_and_a_respawned_worker_says_why(two_models: Server) -> None:
    """Unlike the unit tests' fake workers, a real one that gunicorn respawns loads the version from disk again."""
    server = two_models
    version, b_served = one_version(server, "a"), one_version(server, "b")
    rollouts, log_start = value(samples(server), "forkserve_rollouts_total", result="succeeded"), len(server.log())
    served_dir = server.models_dir / "a" / str(version)
    told = "forkserve: model a version %d is served, but its directory now reads as unloadable" % version
    (served_dir / "extra.h5").write_bytes(b"dropped in by mistake")  # two model files: no worker could load it now
    try:
        wait_until(lambda: told in server.log()[log_start:], 30, "the master to report the served version")
        victim, keeper = server.worker_pids()
        os.kill(victim, signal.SIGKILL)
        server.wait_reaped(victim)
        replacement = next(pid for pid in server.wait_workers_loaded(2) if pid != keeper)
        states = read_worker_states(server.run_dir)
        assert "several model files" in states[replacement].models["a"].failed[version]  # it read the files as they are
        assert states[replacement].serving("b") == [b_served] and states[keeper].serving("a") == [version]
        deadline = time.monotonic() + 2.0  # four polls of the watcher after the respawn
        wait_until(lambda: time.monotonic() > deadline, 5, "four polls")
        assert version not in read_failed(server.run_dir).get("a", {})  # the keeper serves it: not the version's fault
        assert server.log()[log_start:].count(told) == 1
        assert value(samples(server), "forkserve_rollouts_total", result="succeeded") == rollouts
    finally:
        (served_dir / "extra.h5").unlink()
    os.kill(replacement, signal.SIGKILL)  # a worker that loads the files as they are again, for the other tests
    server.wait_reaped(replacement)
    wait_until(lambda: serving(server) == [{"a": [version], "b": [b_served]}] * 2, 180, "every worker serving a again")
