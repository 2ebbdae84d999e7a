"""`python -m server publish` and `publish()`: validated in a child process, atomic, nothing left on failure."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import KERAS2
from tests.e2e.harness import ROOT


def _cli(*args: str) -> subprocess.CompletedProcess:
    """Run the publish command line as a user would."""
    return subprocess.run([sys.executable, "-m", "server", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _entries(model_dir: Path) -> list[str]:
    """Everything in a model directory but the publish lock."""
    return sorted(p.name for p in model_dir.iterdir() if p.name != ".publish.lock") if model_dir.exists() else []


def test_cli_publishes_the_next_version_readable_and_complete(tmp_path: Path, model_repo: Path) -> None:
    models = tmp_path / "models"
    source = model_repo / "mlp" / "1" / "model.keras"
    first = _cli("publish", "mlp", str(source), "--models", str(models))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "1"
    second = _cli("publish", "mlp", str(source), "--models", str(models))
    assert second.stdout.strip() == "2"
    assert _entries(models / "mlp") == ["1", "2"]
    published = models / "mlp" / "2" / "model.keras"
    assert published.read_bytes() == source.read_bytes()
    assert (models / "mlp" / "2").stat().st_mode & 0o755 == 0o755


def test_cli_refuses_a_corrupt_file_and_leaves_nothing(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "mlp" / "1").mkdir(parents=True)
    corrupt = tmp_path / "model.keras"
    corrupt.write_bytes(b"PK\x03\x04 not really a zip" * 100)
    result = _cli("publish", "mlp", str(corrupt), "--models", str(models))
    assert result.returncode != 0
    assert "publish failed" in result.stderr and "invalid model" in result.stderr
    assert result.stdout == ""
    assert _entries(models / "mlp") == ["1"]


def test_function_refuses_lambda_layers_and_publishes_a_savedmodel_without_importing_tensorflow(tmp_path: Path) -> None:
    models = tmp_path / "models"
    probe = f"""
import json, sys
from server.cli.publish import PublishError, publish
out = {{}}
try:
    publish("lam", {str(KERAS2 / 'lambda.h5')!r}, {str(models)!r})
except PublishError as exc:
    out["lambda"] = str(exc)
out["savedmodel"] = publish("cnn", {str(KERAS2 / 'cnn_savedmodel')!r}, {str(models)!r})
out["tf_loaded"] = [m for m in ("tensorflow", "keras") if m in sys.modules]
print(json.dumps(out))
"""
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert "Lambda" in out["lambda"]
    assert out["savedmodel"] == 1
    assert out["tf_loaded"] == []
    assert _entries(models / "lam") == []
    assert (models / "cnn" / "1" / "saved_model.pb").is_file()
    assert (models / "cnn" / "1" / "variables").is_dir()


def test_cli_refuses_a_config_naming_an_arbitrary_function(tmp_path: Path) -> None:
    from tests.e2e.conftest import REPO_ROOT, write_model_naming_a_function

    forged = write_model_naming_a_function(REPO_ROOT / "models" / "digits" / "1" / "model.keras", tmp_path / "evil.keras")
    result = _cli("publish", "evil", str(forged), "--models", str(tmp_path / "models"))
    assert result.returncode != 0 and "could not be deserialized" in result.stderr
    assert _entries(tmp_path / "models" / "evil") == []


def test_cli_rejects_what_is_not_a_model(tmp_path: Path) -> None:
    readme = tmp_path / "notes.txt"
    readme.write_text("hello")
    result = _cli("publish", "x", str(readme), "--models", str(tmp_path / "models"))
    assert result.returncode != 0 and "not a .keras" in result.stderr
    bad_name = _cli("publish", "../etc", str(KERAS2 / "cnn.h5"), "--models", str(tmp_path / "models"))
    assert bad_name.returncode != 0 and "invalid model name" in bad_name.stderr
    assert not (tmp_path / "etc").exists()
    shutil.rmtree(tmp_path / "models", ignore_errors=True)
