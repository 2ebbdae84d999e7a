"""`python -m server publish` and `publish()`: validated in a child process, atomic, readable by the server, nothing left on failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.cli import forkserve
from tests.support.harness import ROOT, wait_until
from tests.support.models import KERAS2, REPO_ROOT


def _entries(model_dir: Path) -> list[str]:
    """Everything in a model directory but the publish lock."""
    return sorted(p.name for p in model_dir.iterdir() if p.name != ".publish.lock") if model_dir.exists() else []


def test_cli_publishes_the_next_version_readable_and_complete(tmp_path: Path, model_repo: Path) -> None:
    models = tmp_path / "models"
    source = model_repo / "mlp" / "1" / "model.keras"
    first = forkserve("publish", "mlp", str(source), "--models", str(models))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "1"
    second = forkserve("publish", "mlp", str(source), "--models", str(models))
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
    result = forkserve("publish", "mlp", str(corrupt), "--models", str(models))
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
    from tests.support.models import write_model_naming_a_function

    forged = write_model_naming_a_function(REPO_ROOT / "models" / "digits" / "1" / "model.keras", tmp_path / "evil.keras")
    result = forkserve("publish", "evil", str(forged), "--models", str(tmp_path / "models"))
    assert result.returncode != 0 and "could not be deserialized" in result.stderr
    assert _entries(tmp_path / "models" / "evil") == []


def test_cli_rejects_what_is_not_a_model(tmp_path: Path) -> None:
    readme = tmp_path / "notes.txt"
    readme.write_text("hello")
    result = forkserve("publish", "x", str(readme), "--models", str(tmp_path / "models"))
    assert result.returncode != 0 and "not a .keras" in result.stderr
    bad_name = forkserve("publish", "../etc", str(KERAS2 / "cnn.h5"), "--models", str(tmp_path / "models"))
    assert bad_name.returncode != 0 and "invalid model name" in bad_name.stderr
    assert not (tmp_path / "etc").exists()
    shutil.rmtree(tmp_path / "models", ignore_errors=True)


# --- who can read a published version (R7) -------------------------------------------------------

DIGITS = REPO_ROOT / "models" / "digits"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's tmp_path is 0700 under root's own directory)."""
    path = Path(tempfile.mkdtemp(prefix="forkserve-publish-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _private_source() -> Path:
    """A version directory as a trainer's `tempfile.mkdtemp()` leaves it: 0700 directories, 0600 files."""
    source = Path(tempfile.mkdtemp(prefix="trained-"))
    shutil.copyfile(DIGITS / "1" / "model.keras", source / "model.keras")
    (source / "assets").mkdir(mode=0o700)
    (source / "assets" / "labels.txt").write_text("0 1 2 3 4 5 6 7 8 9")
    for path in (source / "model.keras", source / "assets" / "labels.txt"):
        path.chmod(0o600)
    return source


def _as_nobody(*command: str) -> subprocess.CompletedProcess:
    """Run a command as user nobody, group nogroup only (root would read anything)."""
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command],
                          capture_output=True, text=True, timeout=60)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mode & 0o7777 for p in sorted([root, *root.rglob("*")])}


@pytest.mark.parametrize(("repo_mode", "repo_group", "dir_mode", "file_mode"), [
    (0o755, "root", 0o755, 0o644),     # a world-readable repository: anyone reads the version
    (0o750, "nogroup", 0o750, 0o640),  # the server's group reads it: the version gets that group
])
def test_a_private_source_is_published_readable_by_whoever_reads_the_repository(
        shared_dir: Path, repo_mode: int, repo_group: str, dir_mode: int, file_mode: int) -> None:
    models = shared_dir / "models"
    models.mkdir()
    shutil.chown(models, group=repo_group)
    models.chmod(repo_mode)
    source = _private_source()
    try:
        result = forkserve("publish", "digits", str(source), "--models", str(models), conf=shared_dir / "none.toml")
    finally:
        shutil.rmtree(source)
    assert result.returncode == 0, result.stderr
    version = models / "digits" / "1"
    assert _modes(version) == {".": dir_mode, "model.keras": file_mode, "assets": dir_mode, "assets/labels.txt": file_mode}
    assert {p.group() for p in [version.parent, version, *version.rglob("*")]} == {repo_group}
    every_file = _as_nobody("sh", "-c", 'find "$0" -type f -exec cat {} + | wc -c', str(version))
    assert every_file.returncode == 0 and every_file.stderr == "", every_file.stderr
    assert int(every_file.stdout) == (DIGITS / "1" / "model.keras").stat().st_size + len("0 1 2 3 4 5 6 7 8 9")
    read = _as_nobody("cat", str(version / "assets" / "labels.txt"))
    assert read.returncode == 0 and read.stdout == "0 1 2 3 4 5 6 7 8 9", read.stderr


def test_publish_refuses_a_version_the_repository_s_owner_could_not_read(shared_dir: Path) -> None:
    models = shared_dir / "models"
    models.mkdir(mode=0o700)
    shutil.chown(models, user="nobody", group="nogroup")  # the server runs as nobody; publish runs as root
    result = forkserve("publish", "digits", str(DIGITS / "1" / "model.keras"), "--models", str(models), conf=shared_dir / "none.toml")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("publish failed: the server could not read the published version: ")
    assert "the repository's owner nobody (uid 65534) could not read" in result.stderr and len(result.stderr.splitlines()) == 1
    assert list(models.iterdir()) == []  # not even the model directory publish made


# --- leftovers and failures of the copy --------------------------------------------------------

def test_a_staging_directory_left_by_a_killed_publish_is_removed_by_the_next_one(shared_dir: Path) -> None:
    models, source = shared_dir / "models", shared_dir / "big"
    (source / "assets").mkdir(parents=True)
    shutil.copyfile(DIGITS / "1" / "model.keras", source / "model.keras")
    with open(source / "assets" / "blob", "wb") as blob:
        blob.truncate(200 * 1024 * 1024)  # long enough to copy and fsync that the kill lands mid-copy
    publisher = subprocess.Popen([sys.executable, "-m", "server", "publish", "digits", str(source), "--models", str(models)],
                                 cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: any(p.name.startswith(".publish-") for p in (models / "digits").glob(".*")), 120,
                   "publish's staging directory", interval=0.005)
        publisher.kill()
    finally:
        publisher.kill()
        publisher.wait(30)
    assert [p for p in _entries(models / "digits") if not p.startswith(".publish-")] == []  # killed before the rename
    assert _entries(models / "digits"), "the killed publish left no staging directory"
    result = forkserve("publish", "digits", str(DIGITS / "1" / "model.keras"), "--models", str(models), conf=shared_dir / "none.toml")
    assert result.returncode == 0, result.stderr
    assert _entries(models / "digits") == ["1"]
    assert "left by a publisher that is gone" in result.stderr


def test_a_full_repository_is_a_one_line_failure_that_leaves_nothing(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(models)], capture_output=True)
    if mounted.returncode != 0:
        if os.geteuid() == 0:
            pytest.fail(f"cannot mount a tmpfs: {mounted.stderr!r}")
        pytest.skip("mounting a tmpfs needs root")
    try:
        result = forkserve("publish", "digits", str(DIGITS / "1" / "model.keras"), "--models", str(models), conf=tmp_path / "none.toml")
        assert result.returncode == 1 and result.stdout == ""
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith("publish failed: copying ") and "No space left on device" in result.stderr
        assert list(models.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(models)], capture_output=True)


# --- a version with or without a handler changes what clients send (U2) ----------------------------

def test_a_plain_file_over_a_version_with_a_handler_is_refused_unless_told(tmp_path: Path) -> None:
    models = tmp_path / "models"
    shutil.copytree(DIGITS, models / "digits")  # version 2, the newest, has a handler
    conf = REPO_ROOT / "conf" / "models.toml"
    refused = forkserve("publish", "digits", str(DIGITS / "1" / "model.keras"), "--models", str(models), conf=conf)
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith("publish failed: version 2 of digits has a handler.py and model.keras has none")
    assert "--change-request-shape" in refused.stderr
    assert _entries(models / "digits") == ["1", "2"]
    told = forkserve("publish", "digits", str(DIGITS / "1" / "model.keras"), "--models", str(models), "--conf", str(conf),
                "--change-request-shape")
    assert told.returncode == 0 and told.stdout.strip() == "3", told.stderr
    assert sorted(p.name for p in (models / "digits" / "3").iterdir()) == ["model.keras"]


def test_a_handler_over_a_plain_version_is_refused_unless_told(tmp_path: Path) -> None:
    models = tmp_path / "models"
    shutil.copytree(DIGITS / "1", models / "digits" / "1")
    refused = forkserve("publish", "digits", str(DIGITS / "2"), "--models", str(models), conf=REPO_ROOT / "conf" / "models.toml")
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith("publish failed: 2 has a handler.py and version 1 of digits has none")
    assert _entries(models / "digits") == ["1"]


def test_the_readme_s_publish_example_works_on_the_demo(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Publishing a new version", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("  #")[0].strip() for line in block.splitlines()
                if line.startswith(("cp -r ", ".venv/bin/python -m server publish "))]
    assert len(commands) == 2, block
    models, scratch = tmp_path / "models", tmp_path / "scratch"
    shutil.copytree(ROOT / "models", models)
    script = "\n".join(commands).replace("/tmp/", f"{scratch}/").replace(".venv/bin/python", sys.executable)
    scratch.mkdir()
    done = subprocess.run(["sh", "-e", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FORKSERVE_MODELS": str(models)})
    assert done.returncode == 0, done.stderr
    assert f"prints {done.stdout.strip()}" in block  # the number the README says it prints
    assert sorted(p.name for p in (models / "digits" / done.stdout.strip()).iterdir()) == ["assets", "handler.py", "model.keras"]
