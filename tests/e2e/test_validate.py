"""What publish's validation child checks: the version as the server would load it, with the model's settings.

Real `python -m server publish` / `validate` runs with real TensorFlow in the child; each failure
is one line on stderr, whatever the model or its handler raises.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import forkserve
from tests.support.harness import ROOT
from tests.support.models import REPO_ROOT

DIGITS = REPO_ROOT / "models" / "digits"


def _handler_version(root: Path, handler: str) -> Path:
    """A version directory: the digits model, its assets and `handler` as handler.py."""
    version = root / "version"
    shutil.copytree(DIGITS / "2", version)
    (version / "handler.py").write_text(handler)
    return version


def _conf(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _lines(result: subprocess.CompletedProcess) -> list[str]:
    return result.stderr.splitlines()


# --- the model's settings apply (R9) -----------------------------------------------------------

def test_a_handler_for_a_model_without_handler_true_is_refused_with_the_server_s_reason(tmp_path: Path) -> None:
    source, models = DIGITS / "2", tmp_path / "models"
    refused = forkserve("publish", "scanner", str(source), "--models", str(models), env={"FORKSERVE_CONF": _conf(tmp_path / "off.toml", "")})
    assert refused.returncode == 1 and len(_lines(refused)) == 1, refused.stderr
    assert ("invalid model: handler: version 1 has a handler.py, but handlers are off for model scanner "
            "(set handler = true under [models.scanner]") in refused.stderr
    assert not (models / "scanner" / "1").exists()
    on = _conf(tmp_path / "on.toml", "[models.scanner]\nhandler = true\n")  # --conf: over $FORKSERVE_CONF
    accepted = forkserve("publish", "scanner", str(source), "--models", str(models), "--conf", on,
                    env={"FORKSERVE_CONF": str(tmp_path / "off.toml")})
    assert accepted.returncode == 0 and accepted.stdout.strip() == "1", accepted.stderr


def _one_row_savedmodel(path: Path) -> Path:
    """A SavedModel whose batch dimension is free but which only computes one row (its shape is checked)."""
    import tensorflow as tf

    class OneRow(tf.Module):
        def __init__(self) -> None:
            self.weights = tf.Variable(tf.ones((20, 2)))

        @tf.function(input_signature=[tf.TensorSpec([None, 20], tf.float32, name="features")])
        def serve(self, features: tf.Tensor) -> dict:
            return {"logits": tf.matmul(tf.ensure_shape(features, [1, 20]), self.weights)}

    module = OneRow()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def test_warm_up_uses_the_model_s_batch_buckets(tmp_path: Path) -> None:
    source, models = _one_row_savedmodel(tmp_path / "one_row"), tmp_path / "models"
    # The defaults batch up to 64 rows: the server's warm-up fails at 2, so publish refuses it.
    refused = forkserve("publish", "one_row", str(source), "--models", str(models), env={"FORKSERVE_CONF": _conf(tmp_path / "default.toml", "")})
    assert refused.returncode == 1 and len(_lines(refused)) == 1, refused.stderr
    assert "invalid model:" in refused.stderr and "warm-up at the batch sizes [1, 2, 4, 8, 16, 32, 64] failed" in refused.stderr
    single = _conf(tmp_path / "single.toml", "[models.one_row]\nmax_batch_size = 1\n")
    accepted = forkserve("publish", "one_row", str(source), "--models", str(models), "--conf", single)
    assert accepted.returncode == 0 and accepted.stdout.strip() == "1", accepted.stderr


POSTPROCESS_ONLY = '''
import base64
from pathlib import Path


class Handler:
    """TensorFlow Serving's request (an image as base64), a digit out."""

    def setup(self, version_dir: Path) -> None:
        png = (version_dir / "assets" / "example.png").read_bytes()
        self.example = {"instances": [{"b64": base64.b64encode(png).decode()}]}

    def postprocess(self, outputs: dict, body: dict) -> dict:
        return {"digit": int(outputs["probabilities"][0].argmax())}
'''


def test_the_handler_s_example_runs_with_the_model_s_image_settings(tmp_path: Path) -> None:
    source = _handler_version(tmp_path, POSTPROCESS_ONLY)  # the example is a 32x32 PNG
    small = _conf(tmp_path / "small.toml", "[models.pix]\nhandler = true\nmax_image_pixels = 100\n")
    refused = forkserve("publish", "pix", str(source), "--models", str(tmp_path / "models"), env={"FORKSERVE_CONF": small})
    assert refused.returncode == 1 and len(_lines(refused)) == 1, refused.stderr
    assert "invalid model: handler: Handler.example failed:" in refused.stderr and "pixels" in refused.stderr
    usual = _conf(tmp_path / "usual.toml", "[models.pix]\nhandler = true\nimage_resize = \"box\"\n")
    accepted = forkserve("validate", "pix", str(source), "--models", str(tmp_path / "models"), "--conf", usual)
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["handler"]["postprocess"] is True
    assert _lines(accepted)[-1].endswith(f"is valid as the next version of pix (settings from {usual})")


# --- what is not checked is said (U4) --------------------------------------------------------------

def test_a_handler_without_an_example_is_published_with_a_one_line_warning(tmp_path: Path) -> None:
    source = _handler_version(tmp_path, (
        "class Handler:\n"
        "    def setup(self, version_dir):\n"
        "        print('setting up')  # stdout is not the verdict's\n"
        "    def preprocess(self, body):\n"
        "        return [body]  # not a dict: every request would fail; nothing runs it at publish\n"
    ))
    conf = _conf(tmp_path / "on.toml", "[models.noex]\nhandler = true\n")
    result = forkserve("publish", "noex", str(source), "--models", str(tmp_path / "models"), env={"FORKSERVE_CONF": conf})
    assert result.returncode == 0 and result.stdout.strip() == "1", result.stderr
    warning, published = _lines(result)
    assert warning == ("publish: warning: handler.py has no example, so preprocess, the model call and postprocess were "
                       "not checked; set Handler.example to a request body (a class attribute, or in setup) to have "
                       "publish and warm-up run it")
    assert published.startswith("published noex version 1 in ")


# --- every failure is one line (O5) ----------------------------------------------------------------

@pytest.mark.parametrize(("handler", "reason"), [
    ("class Handler:\n    def setup(self, version_dir):\n        raise SystemExit(3)\n",
     "invalid model: handler: Handler setup failed: SystemExit: 3"),
    ("import sys\nclass Handler:\n    def setup(self, version_dir):\n        sys.exit()\n",
     "invalid model: handler: Handler setup failed: SystemExit"),
    ("class Handler:\n    example = {'image': ''}\n    def preprocess(self, body):\n        raise KeyboardInterrupt\n",
     "invalid model: handler: Handler.example failed: KeyboardInterrupt"),
    ("raise SystemExit(4)\n", "invalid model: handler: handler.py failed to import: SystemExit: 4"),
    ("import os\nclass Handler:\n    def setup(self, version_dir):\n        os._exit(3)\n",
     "validation ended without a verdict (exit status 3)"),
], ids=["setup-SystemExit-3", "setup-sys-exit", "example-KeyboardInterrupt", "import-SystemExit-4", "os-exit"])
def test_whatever_a_handler_raises_publish_fails_with_one_line(tmp_path: Path, handler: str, reason: str) -> None:
    source, models = _handler_version(tmp_path, handler), tmp_path / "models"
    conf = _conf(tmp_path / "on.toml", "[models.bad]\nhandler = true\n")
    result = forkserve("publish", "bad", str(source), "--models", str(models), env={"FORKSERVE_CONF": conf})
    assert result.returncode == 1 and result.stdout == ""
    assert _lines(result) == [_lines(result)[0]] and _lines(result)[0].startswith(f"publish failed: {source}: "), result.stderr
    assert reason in result.stderr
    assert not (models / "bad" / "1").exists()


def test_validate_prints_its_verdict_when_the_handler_exits(tmp_path: Path) -> None:
    source = _handler_version(tmp_path, "class Handler:\n    def setup(self, version_dir):\n        raise SystemExit(3)\n")
    conf = _conf(tmp_path / "on.toml", "[models.bad]\nhandler = true\n")
    result = forkserve("validate", "bad", str(source), "--models", str(tmp_path / "models"), "--conf", conf)
    assert result.returncode == 1 and result.stdout == ""
    assert len(_lines(result)) == 1
    assert _lines(result)[0].startswith(f"validate: {source}: invalid model: handler: Handler setup failed: SystemExit: 3")
    # The child itself: its verdict as JSON on stdout, exit status 2 (never the handler's 3).
    child = subprocess.run([sys.executable, "-m", "server.cli.validate", str(source), "--model", "bad",
                            "--settings", json.dumps({"handler": True})], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert child.returncode == 2
    verdict = json.loads(child.stdout)
    assert verdict["valid"] is False and verdict["reason"].startswith("handler: Handler setup failed: SystemExit: 3")
    assert _lines(child)[-1] == f"invalid model: {verdict['reason']}"
