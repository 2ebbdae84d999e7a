"""The failure ledger over a real run directory: failed.json read once, written through it, gauges and strikes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from server.config import load_config
from server.master.rollout.ledger import FailureLedger, VersionsView
from server.master.rollout.policy import WorkerExit
from server.master.scanner import SettledScanner
from server.target import FAILED_FILE, FailedVersion, config_key, read_failed, write_failed

ATTEMPTS = 2


class Repo:
    """A model repository, a run directory and the scanner the master reads the repository with."""

    def __init__(self, tmp_path: Path) -> None:
        self.models = tmp_path / "models"
        self.run_dir = tmp_path / "run"
        self.run_dir.mkdir()
        self.conf = tmp_path / "models.toml"
        self.conf.write_text("")
        self.scanner = SettledScanner(self.models)

    def add(self, model: str, version: int, content: bytes = b"weights") -> Path:
        directory = self.models / model / str(version)
        directory.mkdir(parents=True)
        (directory / "model.keras").write_bytes(content)
        return directory

    def view(self) -> VersionsView:
        settled = self.scanner.scan(trust_all=True)
        sources = {(s.model, s.version): s for versions in settled.values() for s in versions}
        return VersionsView(sources, load_config(self.conf), self.scanner.content_digest)

    def ledger(self) -> FailureLedger:
        return FailureLedger(self.run_dir, self.models, self.conf.name, ATTEMPTS)


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path)


def gauge(model: str, version: int) -> float | None:
    return REGISTRY.get_sample_value("forkserve_version_failed", {"model": model, "version": str(version)})


def marked_total(model: str, version: int) -> float:
    return REGISTRY.get_sample_value("forkserve_rollout_failed_versions_total", {"model": model, "version": str(version)}) or 0.0


def test_a_mark_is_written_with_its_content_and_settings_and_counted(repo: Repo) -> None:
    repo.add("mark", 1)
    ledger, view = repo.ledger(), repo.view()
    ledger.mark({("mark", 1): "broken"}, view)
    entry = read_failed(repo.run_dir)["mark"][1]
    assert entry.reason == ("broken (tried again when the files of mark/1 or the settings of model mark "
                            "in models.toml change)")
    assert entry.content == repo.scanner.content_digest(repo.models / "mark" / "1") != ""
    assert entry.config == config_key(view.config.for_model("mark"))
    assert ledger.has_mark(("mark", 1)) and ledger.reason(("mark", 1)) == entry.reason
    assert gauge("mark", 1) == 1 and marked_total("mark", 1) == 1


def test_failed_json_is_read_once_at_start_and_its_gauges_set_at_the_first_pass(repo: Repo) -> None:
    repo.add("kept", 3)
    write_failed(repo.run_dir, {"kept": {3: FailedVersion("from the last master", "", "")}})
    ledger = repo.ledger()
    (repo.run_dir / FAILED_FILE).unlink()  # nobody else writes it: the ledger keeps what it read
    assert ledger.has_mark(("kept", 3)) and ledger.reason(("kept", 3)) == "from the last master"
    assert gauge("kept", 3) is None
    ledger.drop_stale(repo.view())
    assert gauge("kept", 3) == 1
    assert not (repo.run_dir / FAILED_FILE).exists()  # nothing changed: nothing written


def test_a_mark_matches_while_the_bytes_and_the_settings_are_those_it_failed_with(repo: Repo) -> None:
    version = repo.add("same", 1, b"broken bytes")
    ledger = repo.ledger()
    ledger.mark({("same", 1): "broken"}, repo.view())
    os.utime(version / "model.keras", (1, 1))  # touched: the same bytes
    view = repo.view()
    assert ledger.is_failed(view.sources[("same", 1)], view)
    (version / "model.keras").write_bytes(b"fixed bytes!")  # the same size, other bytes
    view = repo.view()
    assert not ledger.is_failed(view.sources[("same", 1)], view)


def test_a_mark_no_longer_matches_when_the_model_s_settings_change(repo: Repo) -> None:
    repo.add("conf", 1)
    ledger = repo.ledger()
    ledger.mark({("conf", 1): "broken"}, repo.view())
    repo.conf.write_text("[models.other]\nmax_batch_size = 8\n")
    view = repo.view()
    assert ledger.is_failed(view.sources[("conf", 1)], view)  # another model's settings
    repo.conf.write_text("[models.conf]\nmax_batch_size = 8\n")
    view = repo.view()
    assert not ledger.is_failed(view.sources[("conf", 1)], view)


def test_a_stale_mark_is_dropped_from_the_file_and_its_gauge(repo: Repo) -> None:
    version = repo.add("stale", 1)
    repo.add("stale", 2)
    ledger = repo.ledger()
    ledger.mark({("stale", 1): "broken", ("stale", 2): "broken too"}, repo.view())
    (version / "model.keras").write_bytes(b"a new copy")
    ledger.drop_stale(repo.view())
    assert list(read_failed(repo.run_dir)["stale"]) == [2] and not ledger.has_mark(("stale", 1))
    assert gauge("stale", 1) == 0 and gauge("stale", 2) == 1


def test_deaths_at_the_limit_mark_the_version_and_a_served_one_is_forgotten(repo: Repo) -> None:
    repo.add("dies", 1)
    ledger, view = repo.ledger(), repo.view()
    assert ledger.count_deaths({10: WorkerExit("killed", ("dies", 1))}, set(), view, {}) == set()
    assert ledger.strikes.count(("dies", 1)) == 1 and read_failed(repo.run_dir) == {}
    blamed = ledger.count_deaths({11: WorkerExit("timeout", ("dies", 1))}, set(), view, {})
    assert blamed == {("dies", 1)} and ledger.strikes.count(("dies", 1)) == 0
    assert "workers died loading it 2 times in a row (last: worker 11 timeout)" in read_failed(repo.run_dir)["dies"][1].reason
    assert ledger.count_deaths({12: WorkerExit("killed", ("dies", 1))}, set(), view, {}) == set()  # marked already
    assert ledger.strikes.count(("dies", 1)) == 0
    ledger.count_deaths({}, {("dies", 1)}, view, {})  # tried again after a change, and served
    assert read_failed(repo.run_dir) == {} and not ledger.has_mark(("dies", 1)) and gauge("dies", 1) == 0


def test_a_served_version_clears_its_strikes(repo: Repo) -> None:
    repo.add("lucky", 1)
    ledger, view = repo.ledger(), repo.view()
    ledger.count_deaths({10: WorkerExit("killed", ("lucky", 1))}, set(), view, {})
    ledger.count_deaths({}, {("lucky", 1)}, view, {})
    assert ledger.count_deaths({11: WorkerExit("killed", ("lucky", 1))}, set(), view, {}) == set()  # one in a row again


def test_the_mark_of_a_removed_version_is_forgotten(repo: Repo) -> None:
    version = repo.add("gone", 1)
    ledger = repo.ledger()
    ledger.mark({("gone", 1): "broken"}, repo.view())
    shutil.rmtree(version)
    ledger.count_deaths({}, set(), repo.view(), {})
    assert read_failed(repo.run_dir) == {} and gauge("gone", 1) == 0


def test_a_refused_write_changes_nothing_on_disk_or_in_memory(repo: Repo) -> None:
    repo.add("full", 1)
    repo.add("full", 2)
    ledger, view = repo.ledger(), repo.view()
    ledger.mark({("full", 1): "broken"}, view)
    on_disk = (repo.run_dir / FAILED_FILE).read_text()
    shutil.rmtree(repo.run_dir)
    repo.run_dir.write_text("a file where the run directory was")  # every write in it fails now
    with pytest.raises(OSError):
        ledger.mark({("full", 2): "broken too"}, view)
    assert not ledger.has_mark(("full", 2)) and gauge("full", 2) is None
    repo.run_dir.unlink()
    repo.run_dir.mkdir()
    ledger.drop_stale(view)  # nothing stale: nothing written
    assert not (repo.run_dir / FAILED_FILE).exists()
    ledger.mark({("full", 2): "broken too"}, view)
    assert set(json.loads((repo.run_dir / FAILED_FILE).read_text())["full"]) == {"1", "2"}
    assert json.loads(on_disk)["full"]["1"] == json.loads((repo.run_dir / FAILED_FILE).read_text())["full"]["1"]
