"""gunicorn.conf.py: documented defaults, no TensorFlow in the master."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, os, runpy, sys
conf = runpy.run_path("gunicorn.conf.py")
print(json.dumps({
    "bind": conf["bind"], "workers": conf["workers"], "worker_class": conf["worker_class"],
    "threads": conf["threads"], "preload_app": conf["preload_app"], "cpus": len(os.sched_getaffinity(0)),
    "heavy": sorted(m for m in ("tensorflow", "keras", "tf_keras") if m in sys.modules),
    "tls": {k: getattr(conf[k], "__qualname__", conf[k]) for k in ("certfile", "keyfile", "ca_certs", "cert_reqs", "ssl_context") if k in conf},
    "hooks": sorted(k for k in ("on_starting", "when_ready", "pre_fork", "post_fork", "post_worker_init", "worker_exit", "child_exit", "on_exit", "pre_request", "post_request", "worker_int", "worker_abort", "pre_exec", "nworkers_changed") if callable(conf.get(k))),
}))
"""


def _load(env: dict[str, str], run_dir: Path) -> dict:
    """Evaluate gunicorn.conf.py in a fresh interpreter, as the master does."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FORKSERVE_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env = {**clean, "FORKSERVE_RUN_DIR": str(run_dir), **env}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_defaults_are_the_documented_ones(tmp_path: Path) -> None:
    conf = _load({}, tmp_path)
    assert conf["bind"] == ["127.0.0.1:8000"]
    assert conf["workers"] == conf["cpus"]
    assert conf["worker_class"] == "server.worker.gthread.ForkserveWorker" and conf["threads"] >= 4
    assert conf["preload_app"] is False
    assert conf["hooks"] == [
        "child_exit", "on_exit", "on_starting", "post_fork", "post_worker_init", "pre_fork", "when_ready", "worker_exit",
    ]


def test_master_config_imports_no_tensorflow(tmp_path: Path) -> None:
    assert _load({}, tmp_path)["heavy"] == []


def test_config_exports_the_metrics_directory_before_prometheus_client_loads(tmp_path: Path) -> None:
    _load({}, tmp_path)
    assert (tmp_path / "metrics").is_dir()


def test_environment_overrides(tmp_path: Path) -> None:
    conf = _load({"FORKSERVE_BIND": "127.0.0.1:9999", "FORKSERVE_WORKERS": "3", "FORKSERVE_THREADS": "4"}, tmp_path)
    assert conf["bind"] == ["127.0.0.1:9999"] and conf["workers"] == 3 and conf["threads"] == 4


def test_tls_is_off_unless_asked_for(tmp_path: Path) -> None:
    """Deployments behind nginx or a mesh (TLS terminated there) get plain HTTP, as before."""
    assert _load({}, tmp_path)["tls"] == {}


def test_tls_settings_become_gunicorn_s_own_with_the_context_hook(tmp_path: Path) -> None:
    tls = _load({"FORKSERVE_TLS_CERT": "/etc/tls/tls.crt", "FORKSERVE_TLS_KEY": "/etc/tls/tls.key"}, tmp_path)["tls"]
    assert tls == {"certfile": "/etc/tls/tls.crt", "keyfile": "/etc/tls/tls.key", "ca_certs": None, "cert_reqs": 0,
                   "ssl_context": "gunicorn_ssl_context"}
    mutual = _load({"FORKSERVE_TLS_CERT": "/etc/tls/tls.crt", "FORKSERVE_TLS_KEY": "/etc/tls/tls.key",
                    "FORKSERVE_TLS_CLIENT_CA": "/etc/tls/ca.crt"}, tmp_path)["tls"]
    assert mutual["ca_certs"] == "/etc/tls/ca.crt" and mutual["cert_reqs"] == 2  # ssl.CERT_REQUIRED
