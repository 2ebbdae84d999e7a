"""The Kubernetes manifests name probe paths and ports that the real server answers."""

from __future__ import annotations

from pathlib import Path

import yaml

from server.settings import Settings
from tests.e2e.harness import Server

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "forkserve.yaml"


def _documents() -> dict[str, dict]:
    """Manifests by kind."""
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}


def test_probes_ports_and_drain_match_the_server(server: Server) -> None:
    docs = _documents()
    deployment, service = docs["Deployment"], docs["Service"]
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    port = container["ports"][0]
    assert env["FORKSERVE_BIND"].endswith(f":{port['containerPort']}")
    readiness, liveness = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert readiness["port"] == liveness["port"] == port["name"] == service["spec"]["ports"][0]["targetPort"]
    assert readiness["path"] == "/readyz" and liveness["path"] == "/healthz"
    # The paths answer as the probes need: liveness 200; readiness 503 here, naming the models that
    # failed (the shared test repository holds broken ones on purpose) while the others serve.
    assert server.get(liveness["path"]).status_code == 200
    verdict = server.get(readiness["path"])
    assert verdict.status_code == 503 and verdict.json()["status"] == "not ready"
    assert "1" in verdict.json()["models"]["corrupt"]["failed"] and verdict.json()["models"]["mlp"]["serving"] == [1]
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= Settings.from_env().boot_timeout
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
    assert server.get(annotations["prometheus.io/path"]).status_code == 200
    assert int(annotations["prometheus.io/port"]) == port["containerPort"]
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert pod["spec"]["terminationGracePeriodSeconds"] > 30 + int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
