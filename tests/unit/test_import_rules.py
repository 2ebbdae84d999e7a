"""The one rule that must never break: what the master, the CLI and the shared core import has no TensorFlow.

Each package is imported, module by module, in a fresh interpreter, and sys.modules is read
afterwards. The worker's runtime is the one module that must import TensorFlow; the last test
checks that the probe sees it, so the rule tests above it can fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ["server", "server.settings", "server.config", "server.repository", "server.signature", "server.errors",
        "server.state", "server.target", "server.compat", "server.connection_board", "server.run_dir", "server.tls",
        "server.write_errors"]
PROBE = """
import importlib, json, pkgutil, sys
wanted = []
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    wanted.append(name)
    if hasattr(module, "__path__") and name != "server":  # a package: every module below it
        for info in pkgutil.walk_packages(module.__path__, name + "."):
            if info.name != "server.models.runtime":
                importlib.import_module(info.name)
                wanted.append(info.name)
print(json.dumps({"imported": wanted, "modules": sorted(sys.modules)}))
"""


def imported(*names: str) -> tuple[list[str], list[str]]:
    """(modules the probe imported, every module loaded afterwards) in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", PROBE, *names], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["imported"], report["modules"]


def heavy(modules: list[str]) -> list[str]:
    """TensorFlow, Keras (3 or 2) and their submodules among `modules`."""
    return [m for m in modules if m.split(".")[0] in ("tensorflow", "keras", "tf_keras", "tensorflow_cpu")]


def grpc_modules(modules: list[str]) -> list[str]:
    """gRPC (grpcio and its health, reflection and TF Serving stubs) among `modules`: a gRPC core before fork breaks the workers'."""
    return [m for m in modules if m.split(".")[0] in ("grpc", "grpc_health", "grpc_reflection", "tensorflow_serving")
            or m.startswith("server.rpc")]


def otel_modules(modules: list[str]) -> list[str]:
    """OpenTelemetry among `modules`: its SDK starts threads, which only a worker may have (server.telemetry.tracing)."""
    return [m for m in modules if m.split(".")[0] == "opentelemetry"]


@pytest.mark.parametrize(
    "package",
    ["core", "server.master", "server.cli", "server.telemetry", "server.tensors", "server.protocols", "server.models",
     "server.dataplane", "server.http", "server.worker", "server.spawn", "server.spawn.zygote", "server.master.zygote"],
)
def test_package_imports_without_tensorflow_or_keras(package: str) -> None:
    names = CORE if package == "core" else [package]
    done, modules = imported(*names)
    assert len(done) >= len(names)
    assert heavy(modules) == [], f"{package} pulled in {heavy(modules)[:5]}"
    assert grpc_modules(modules) == [], f"{package} pulled in {grpc_modules(modules)[:5]}"
    assert otel_modules(modules) == [], f"{package} pulled in {otel_modules(modules)[:5]}"
    assert "server.models.runtime" not in modules


def test_the_grpc_package_imports_grpc_but_not_tensorflow() -> None:
    done, modules = imported("server.rpc")
    assert "server.rpc.listener" in done and "grpc" in modules
    assert heavy(modules) == [], f"server.rpc pulled in {heavy(modules)[:5]} at import (TF Serving's protos load when first used)"


def test_gunicorn_conf_imports_no_grpc() -> None:
    done = subprocess.run([sys.executable, "-c", "import runpy, sys, json; runpy.run_path('gunicorn.conf.py'); "
                           "print(json.dumps(sorted(sys.modules)))"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "FORKSERVE_RUN_DIR": "/tmp/forkserve-import-rule-probe"})
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert grpc_modules(modules) == [] and heavy(modules) == [] and otel_modules(modules) == []
    assert not [m for m in modules if m.startswith("server.telemetry.payloads")], "the payload writer is worker-only"


def test_the_probe_sees_opentelemetry_where_tracing_starts() -> None:
    probe = ("import json, os, sys; os.environ['OTEL_EXPORTER_OTLP_ENDPOINT'] = 'http://127.0.0.1:9'; "
             "from server.telemetry import tracing; assert tracing.start(); print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "FORKSERVE_RUN_DIR": "/tmp/forkserve-import-rule-probe"})
    assert done.returncode == 0, done.stderr
    assert otel_modules(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_probe_sees_tensorflow_where_it_is_imported() -> None:
    _, modules = imported("server.models.runtime")
    assert "tensorflow" in heavy(modules)


def test_the_worker_class_gunicorn_loads_in_the_master_imports_no_metrics() -> None:
    """gunicorn imports the worker class in the master, before on_starting exports PROMETHEUS_MULTIPROC_DIR.

    NOTE: prometheus_client picks its value class at its first import; imported here, the master's own
    metrics (rollouts, exits, failed versions) stayed in its memory and no scrape saw them.
    """
    done, modules = imported("server.worker.gthread")
    assert "server.worker.gthread" in done
    assert not [m for m in modules if m.split(".")[0] == "prometheus_client" or m == "server.telemetry.metrics"]


def test_the_masters_rollout_loads_protobuf_only_for_tf_servings_configuration() -> None:
    """protobuf (OTLP's, gRPC's) is worker-only, unless the master reads TF Serving's text-proto files."""
    done = subprocess.run([sys.executable, "-c", "import sys, json; import server.master.rollout, server.master.hooks; "
                           "print(json.dumps(sorted(sys.modules)))"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert [m for m in modules if m.startswith("google.protobuf")] == []
    assert "server.master.model_server_config" not in modules
