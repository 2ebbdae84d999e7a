"""Loading a version's handler.py: what it declares, and every way it can be unusable (no TensorFlow)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from server.models.handlers import (
    HandlerError,
    check_example,
    handler_module_name,
    has_handler,
    load_handler,
    model_inputs,
)

# A signature of one float input "x" of shape (None, 1), a model that echoes it as "y", and a model config.
SIGNATURES = {"serving_default": SimpleNamespace(
    name="serving_default", batchable=True, strict_shapes=False,
    inputs={"x": SimpleNamespace(name="x", shape=(None, 1), dtype="float32")})}
CONFIG = SimpleNamespace(allow_non_finite=False, max_request_rows=64, request_timeout_s=30.0)


def echo(name: str, fed: dict) -> dict:
    return {"y": fed["x"]}


def version(root: Path, name: str, source: str) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / "handler.py").write_text(source)
    return directory


def test_a_handler_declares_its_methods_schemas_and_example_set_in_setup(tmp_path: Path) -> None:
    directory = version(tmp_path, "1", '''
class Handler:
    response_schema = {"type": "object"}
    def setup(self, version_dir):
        self.example = {"x": (version_dir / "x.txt").read_text()}
    def preprocess(self, body):
        return body
''')
    (directory / "x.txt").write_text("7")
    handler = load_handler(directory, "forkserve_handler_t1")
    assert has_handler(directory) and not has_handler(tmp_path)
    assert handler.example == {"x": "7"} and handler.postprocess is None and handler.signature_name == "serving_default"
    described = handler.describe()
    assert described["request_schema"] == "free-form" and described["response_schema"] == {"type": "object"}
    assert described["preprocess"] and not described["postprocess"]


def test_two_versions_of_one_handler_never_share_module_state(tmp_path: Path) -> None:
    source = "LABEL = {label!r}\nclass Handler:\n    def postprocess(self, outputs, body):\n        return LABEL\n"
    one = load_handler(version(tmp_path, "1", source.format(label="cat")), "forkserve_handler_m_1")
    two = load_handler(version(tmp_path, "2", source.format(label="red")), "forkserve_handler_m_2")
    assert (one.postprocess({}, {}), two.postprocess({}, {})) == ("cat", "red")


@pytest.mark.parametrize(("source", "reason"), [
    ("import not_a_module_anyone_has\n", "handler.py failed to import: ModuleNotFoundError"),
    ("class Handler:\n    def setup(self, d)\n        pass\n", "handler.py failed to import: SyntaxError"),
    ("x = 1\n", "handler.py defines no class Handler"),
    ("class Handler:\n    def setup(self, d):\n        raise OSError('no labels')\n",
     "Handler setup failed: OSError: no labels (handler.py line 3)"),
    ("class Handler:\n    example = [1, 2]\n", "Handler.example must be a dict"),
    ("class Handler:\n    request_schema = 'any'\n", "Handler.request_schema must be a JSON Schema object"),
    ("import sys\nclass Handler:\n    def setup(self, d):\n        sys.exit(3)\n",
     "Handler setup failed: SystemExit: 3 (handler.py line 4)"),
    ("class Handler:\n    def setup(self, d):\n        raise KeyboardInterrupt\n",
     "Handler setup failed: KeyboardInterrupt (handler.py line 3)"),
    ("class Handler:\n    def __init__(self):\n        raise SystemExit\n", "Handler setup failed: SystemExit (handler.py line 3)"),
    ("import sys\nsys.exit(4)\n", "handler.py failed to import: SystemExit: 4 (handler.py line 2)"),
])
def test_an_unusable_handler_says_why(tmp_path: Path, source: str, reason: str) -> None:
    with pytest.raises(HandlerError, match=None) as raised:
        load_handler(version(tmp_path, "1", source), "forkserve_handler_bad")
    assert reason in str(raised.value)
    assert "forkserve_handler_bad" not in sys.modules  # nothing of a version that is not served stays


def test_model_names_that_differ_only_in_punctuation_get_modules_of_their_own() -> None:
    names = {handler_module_name(model, 1) for model in ("a-b", "a.b", "a_b", "a_2d_b", "ab")}
    assert len(names) == 5 and all(name.isidentifier() for name in names)
    assert handler_module_name("a-b", 1) != handler_module_name("a-b", 11)


def test_the_example_runs_with_one_body_for_both_steps_as_a_live_request_does(tmp_path: Path) -> None:
    """A preprocess that consumes a key postprocess needs fails at warm-up, not on every live request."""
    handler = load_handler(version(tmp_path, "1", '''
import numpy as np
class Handler:
    example = {"id": "abc", "x": [1.0]}
    def preprocess(self, body):
        body.pop("id")
        return {"x": np.array([body["x"]], dtype="float32")}
    def postprocess(self, outputs, body):
        return {"id": body["id"]}
'''), "forkserve_handler_shared_body")
    with pytest.raises(HandlerError, match="Handler.example failed: KeyError"):
        check_example(handler, SIGNATURES, CONFIG, echo)
    assert handler.example == {"id": "abc", "x": [1.0]}  # the declared example itself is left as it was


def test_preprocess_results_become_named_arrays_or_a_clear_type_error() -> None:
    inputs = model_inputs({"x": [[1.0, 2.0]]})
    assert isinstance(inputs["x"], np.ndarray) and inputs["x"].shape == (1, 2)
    with pytest.raises(TypeError, match="must return a dict of input name to array, got list"):
        model_inputs([[1.0, 2.0]])


def test_a_syntax_error_names_its_line_once(tmp_path: Path) -> None:
    with pytest.raises(HandlerError) as raised:
        load_handler(version(tmp_path, "1", "class Handler:\n    def setup(self, d)\n        pass\n"), "forkserve_handler_syntax")
    assert str(raised.value) == "handler.py failed to import: SyntaxError: expected ':' (handler.py line 2)"


@pytest.mark.parametrize(("step", "statement", "reason"), [
    ("preprocess", "sys.exit(3)", "Handler.example failed: SystemExit: 3 (handler.py line"),
    ("preprocess", "raise KeyboardInterrupt", "Handler.example failed: KeyboardInterrupt (handler.py line"),
    ("postprocess", "sys.exit(1)", "Handler.example failed: SystemExit: 1 (handler.py line"),
])
def test_an_example_that_exits_fails_its_version_not_the_process(tmp_path: Path, step: str, statement: str, reason: str) -> None:
    methods = {"preprocess": 'return {"x": np.array([body["x"]], dtype="float32")}', "postprocess": "return {}"}
    methods[step] = statement
    handler = load_handler(version(tmp_path, "1", f'''
import sys
import numpy as np
class Handler:
    example = {{"x": [1.0]}}
    def preprocess(self, body):
        {methods["preprocess"]}
    def postprocess(self, outputs, body):
        {methods["postprocess"]}
'''), f"forkserve_handler_exits_{step}")
    with pytest.raises(HandlerError) as raised:
        check_example(handler, SIGNATURES, CONFIG, echo)
    assert reason in str(raised.value)


def test_an_example_that_hangs_fails_within_the_models_deadline(tmp_path: Path) -> None:
    handler = load_handler(version(tmp_path, "1", '''
import threading
class Handler:
    example = {"x": [1.0]}
    def preprocess(self, body):
        threading.Event().wait()
'''), "forkserve_handler_hangs")
    started = time.monotonic()
    with pytest.raises(HandlerError, match=r"Handler.example failed: handler.py: Handler.preprocess did not return within 0.3s"):
        check_example(handler, SIGNATURES, SimpleNamespace(**{**vars(CONFIG), "request_timeout_s": 0.3}), echo)
    assert time.monotonic() - started < 3
