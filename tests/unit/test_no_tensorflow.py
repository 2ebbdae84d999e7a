"""The master-side modules and every codec import without TensorFlow or Keras."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULES = [
    "server.settings",
    "server.config",
    "server.repository",
    "server.signature",
    "server.errors",
    "server.batching",
    "server.models",
    "server.state",
    "server.hooks",
    "server.rollout",
    "server.fleet",
    "server.scanner",
    "server.config_watch",
    "server.strikes",
    "server.target",
    "server.heartbeat",
    "server.compat",
    "server.gthread_worker",
    "server.codecs.b64",
    "server.codecs.images",
    "server.codecs.jsonio",
    "server.codecs.tensors",
    "server.codecs.tfserving",
    "server.codecs.v2",
    "server.app",
]
PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""
# Every server module but the one meant for workers (server.runtime imports TensorFlow).
ALL_BUT_RUNTIME = """
import importlib, json, pkgutil, sys
import server
names = [m.name for m in pkgutil.walk_packages(server.__path__, "server.") if m.name != "server.runtime"]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "modules": sorted(sys.modules)}))
"""


def run_probe(code: str, *args: str) -> str:
    """Run `code` in a fresh interpreter at the repository root; return the last line it printed."""
    completed = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip().splitlines()[-1]


def is_tf_or_keras(module: str) -> bool:
    """True for tensorflow, keras and their submodules (tf_keras included)."""
    root = module.split(".")[0]
    return root in ("tensorflow", "keras", "tf_keras", "tensorflow_cpu")


def test_server_modules_import_without_tensorflow_or_keras() -> None:
    loaded = json.loads(run_probe(PROBE, *MODULES))
    assert set(MODULES) <= set(loaded)
    assert [m for m in loaded if is_tf_or_keras(m)] == []


def test_every_server_module_but_runtime_imports_without_tensorflow_or_keras() -> None:
    report = json.loads(run_probe(ALL_BUT_RUNTIME))
    assert set(MODULES) <= set(report["imported"])
    assert "server.runtime" not in report["modules"]
    assert [m for m in report["modules"] if is_tf_or_keras(m)] == []


def test_every_codec_module_is_covered_by_the_probe() -> None:
    codecs = sorted(p.stem for p in (REPO / "server" / "codecs").glob("*.py") if p.stem != "__init__")
    assert [f"server.codecs.{name}" for name in codecs] == [m for m in MODULES if m.startswith("server.codecs.")]

