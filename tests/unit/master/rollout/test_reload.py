"""HandleReloadConfigRequest in the master, against a fake arbiter: a reload rolls, a hopeless one never does, one at a time."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from server import control
from server.config import ServerConfig
from server.master.fleet import Fleet
from server.master.model_server_config import ModelServerConfigSource
from server.master.rollout import RolloutController
from server.state import write_json
from server.target import read_target
from tests.unit.master.fake_arbiter import FakeArbiter
from tests.unit.master.rollout.test_controller import KNOBS, WORKERS, add_version, wait_for


def config_text(models: dict[str, Path], extra: str = "") -> str:
    body = "".join(f'config {{ name: "{n}" base_path: "{p}" model_platform: "tensorflow" {extra} }} ' for n, p in models.items())
    return f"model_config_list {{ {body}}}"


class TFServing:
    """Models a and b on disk anywhere, a controller serving a by TF Serving's model configuration over 2 fake workers."""

    def __init__(self, tmp_path: Path) -> None:
        self.disk, self.run_dir = tmp_path / "exports", tmp_path / "run"
        for name in ("a", "b"):
            add_version(self.disk, name, 1)
        (tmp_path / "models.config").write_text(config_text({"a": self.disk / "a"}))
        self.source = ModelServerConfigSource(tmp_path / "models.config")
        self.source.initial()
        self.arbiter = FakeArbiter(self.run_dir, WORKERS)
        self.controller = RolloutController(Fleet(self.arbiter, self.arbiter.send_signal), None, tmp_path / "none.toml",
                                            self.run_dir, KNOBS, ServerConfig(), model_server=self.source)
        self.arbiter.controller = self.controller
        self.controller.publish_initial_target()
        self.arbiter.manage_workers()
        wait_for(lambda: len(self.pids()) == WORKERS, "the first workers")
        self.controller.poll()

    def pids(self) -> list[int]:
        return sorted(pid for pid, worker in self.arbiter.WORKERS.items() if worker.booted)

    def reload(self, text: str) -> str:
        request_id = f"{time.time_ns():020d}-1-{secrets.token_hex(4)}"
        write_json(self.run_dir / control.REQUESTS / f"{request_id}.json",
                   {"action": control.RELOAD_CONFIG, "model": "", "override": {"model_config": text}, "pid": self.pids()[0]})
        return request_id

    def answer_after_polls(self, request_id: str, polls: int = 5) -> tuple[bool, str, bool]:
        """Passes until the call is answered (a model new to the master settles over two of them)."""
        for _ in range(polls):
            self.controller.poll()
            found = control.take_answer(self.run_dir, request_id)
            if found is not None:
                return found
        raise AssertionError(f"no answer after {polls} passes")

    def served(self) -> set[str]:
        target = read_target(self.run_dir)
        assert target is not None
        return set(target.models)


def test_a_reload_rolls_the_workers_to_its_models_and_answers_then(tmp_path: Path) -> None:
    tfs = TFServing(tmp_path)
    try:
        assert tfs.served() == {"a"}
        request = tfs.reload(config_text({"a": tfs.disk / "a", "b": tfs.disk / "b"}))
        assert tfs.answer_after_polls(request) == (True, "serving a, b", True)  # its worker was retired last
        assert tfs.served() == {"a", "b"}
    finally:
        tfs.controller.stop()


def test_a_reload_whose_model_has_no_version_is_refused_before_any_rollout(tmp_path: Path) -> None:
    tfs = TFServing(tmp_path)
    try:
        before, workers = read_target(tfs.run_dir).generation, tfs.pids()
        request = tfs.reload(config_text({"a": tfs.disk / "a", "x": tfs.disk / "nowhere"}))
        ok, message, _ = tfs.answer_after_polls(request)
        assert not ok and message == "failed to load model x: no version directory"
        assert read_target(tfs.run_dir).generation == before and tfs.pids() == workers  # nobody was replaced
        assert set(tfs.source.tables) == {"a"}
    finally:
        tfs.controller.stop()


def test_a_second_reload_waits_for_the_first_without_waking_the_master(tmp_path: Path) -> None:
    tfs = TFServing(tmp_path)
    try:
        first = tfs.reload(config_text({"a": tfs.disk / "a", "b": tfs.disk / "b"}))
        second = tfs.reload(config_text({"b": tfs.disk / "b"}))
        tfs.controller.control.take(ServerConfig(), set())
        assert tfs.controller.control.taken() == {first, second}
        assert not control.waiting(tfs.run_dir, tfs.controller.control.taken())  # the queued one wakes no pass
        tfs.controller.control.calls.clear()  # the first one settled (its request withdrawn)
        (tfs.run_dir / control.REQUESTS / f"{first}.json").unlink()
        tfs.source.settle(True)
        assert tfs.answer_after_polls(second)[:2] == (True, "serving b")  # taken now
    finally:
        tfs.controller.stop()
