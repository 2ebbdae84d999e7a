"""Loading a version with a handler in the registry: whatever the handler does, one failed version, nothing left behind.

The model runtime is a stand-in (no TensorFlow): what is under test is the registry's handling of
the handler, with real handler.py files.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import server.settings
from server.config import ModelConfig
from server.models.handlers import handler_module_name
from server.models.registry import AVAILABLE, END, ModelRegistry, ModelVersion
from server.repository import VersionSource
from server.settings import Settings
from server.signature import SignatureInfo, TensorInfo

SIGNATURE = SignatureInfo("serving_default", "predict", {"x": TensorInfo("x", "float32", (None, 1))},
                          {"y": TensorInfo("y", "float32", (None, 1))})


class Runtime:
    """Loads every version as a model that echoes x as y; `warm_up` fails when told to."""

    def __init__(self, warm_up_fails: bool = False) -> None:
        self.warm_up_fails = warm_up_fails

    def load_servable(self, source: VersionSource) -> SimpleNamespace:
        def warm_up(buckets: list[int]) -> int:
            if self.warm_up_fails:
                raise RuntimeError("warm-up failed")
            return len(buckets)

        return SimpleNamespace(signatures={"serving_default": SIGNATURE}, warm_up=warm_up, traces=lambda: 0,
                               run=lambda name, fed: {"y": np.asarray(fed["x"])})


def entry(tmp_path: Path, handler: str, model: str = "m", version: int = 1, enabled: bool = True) -> ModelVersion:
    directory = tmp_path / model / str(version)
    directory.mkdir(parents=True)
    (directory / "handler.py").write_text(handler)
    return ModelVersion(VersionSource(model, version, directory, "keras"), ModelConfig(handler=enabled))


def load(tmp_path: Path, version: ModelVersion, runtime: Runtime | None = None) -> bool:
    return ModelRegistry(tmp_path)._load_version(version, runtime or Runtime())  # an executor's thread is a daemon


@pytest.mark.parametrize(("statement", "reason"), [
    ("sys.exit(3)", "Handler setup failed: SystemExit: 3 (handler.py line"),
    ("sys.exit(1)", "Handler setup failed: SystemExit: 1 (handler.py line"),
    ("raise KeyboardInterrupt", "Handler setup failed: KeyboardInterrupt (handler.py line"),
])
def test_a_setup_that_exits_fails_its_version_and_the_worker_goes_on(tmp_path: Path, statement: str, reason: str) -> None:
    version = entry(tmp_path, f"import sys\nclass Handler:\n    def setup(self, d):\n        {statement}\n")
    assert load(tmp_path, version) is False
    assert version.state == END and reason in version.error


def test_a_setup_exit_while_the_worker_quits_is_the_workers_own(tmp_path: Path) -> None:
    """gunicorn's SIGQUIT handler raises SystemExit(0) wherever the main thread is: it must end the worker."""
    version = entry(tmp_path, "import sys\nclass Handler:\n    def setup(self, d):\n        sys.exit(0)\n")
    with pytest.raises(SystemExit):
        ModelRegistry(tmp_path)._load_version(version, Runtime(), stopping=lambda: True)


def test_a_handler_whose_warm_up_fails_leaves_no_module_behind(tmp_path: Path) -> None:
    version = entry(tmp_path, "class Handler:\n    example = None\n", model="warm", version=3)
    assert load(tmp_path, version, Runtime(warm_up_fails=True)) is False
    assert version.state == END and "warm-up failed" in version.error and version.handler is None
    assert handler_module_name("warm", 3) not in sys.modules


def test_a_handler_whose_example_fails_leaves_no_module_behind(tmp_path: Path) -> None:
    version = entry(tmp_path, '''
class Handler:
    example = {"x": [1.0]}
    def preprocess(self, body):
        return [body["x"]]
''', model="example", version=2)
    assert load(tmp_path, version) is False
    assert "Handler.preprocess must return a dict of input name to array, got list" in version.error
    assert handler_module_name("example", 2) not in sys.modules


def test_a_handler_feeding_a_signature_the_model_lacks_fails_even_without_an_example(tmp_path: Path) -> None:
    version = entry(tmp_path, "class Handler:\n    signature_name = 'other'\n    def preprocess(self, body):\n        return {}\n")
    assert load(tmp_path, version) is False
    assert "the model has no signature 'other'" in version.error


def test_a_handler_without_an_example_is_served_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    version = entry(tmp_path, "class Handler:\n    def postprocess(self, outputs, body):\n        return {}\n", model="bare")
    with caplog.at_level(logging.WARNING, logger="forkserve.models"):
        assert load(tmp_path, version) is True
    assert version.state == AVAILABLE
    assert "model bare version 1: its handler has no example" in caplog.text


def test_handlers_off_names_the_configuration_file_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "elsewhere" / "serving.toml"
    monkeypatch.setattr(server.settings, "_current", dataclasses.replace(Settings.current(), conf_path=conf))
    version = entry(tmp_path, "class Handler:\n    pass\n", model="wine", enabled=False)
    assert load(tmp_path, version) is False
    assert f"set handler = true under [models.wine] in {conf})" in version.error
    assert "conf/models.toml" not in version.error
