"""deploy/kserve/servingruntime.yaml: valid against KServe's ServingRuntime CRD, and KServe's own TF Serving runtime but for the image."""

from __future__ import annotations

import copy
import re
from functools import cache
from typing import Any, Callable

import jsonschema
import pytest
import yaml

from tests.support.harness import ROOT

RUNTIME = ROOT / "deploy" / "kserve" / "servingruntime.yaml"
KSERVE = ROOT / "tests" / "data" / "kserve"  # vendored from kserve/kserve: the commit is in each file's first lines
KUBERNETES_VERSION = "1.34.0"


def strict(schema: Any) -> Any:
    """The CRD's schema refusing unknown fields, as the API server does under `fieldValidation=Strict`.

    NOTE: a structural schema never says `additionalProperties: false`; the API server prunes (or, strict,
    refuses) what `properties` does not name unless `x-kubernetes-preserve-unknown-fields` is set.
    """
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: strict(value) for key, value in schema.items() if key != "properties"}
    if "properties" in schema:
        closed["properties"] = {name: strict(value) for name, value in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            closed["additionalProperties"] = False
    return closed


@cache
def crd() -> dict:
    return yaml.load((KSERVE / "serving.kserve.io_servingruntimes.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@cache
def validator() -> jsonschema.Draft7Validator:
    (version,) = crd()["spec"]["versions"]
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]))


def runtime() -> dict:
    return yaml.safe_load(RUNTIME.read_text())


def kserve_tensorflow_runtime() -> dict:
    return yaml.safe_load((KSERVE / "kserve-tensorflow-serving.yaml").read_text())


def test_the_runtime_is_a_valid_serving_runtime() -> None:
    definition, document = crd(), runtime()
    (version,) = definition["spec"]["versions"]
    assert document["apiVersion"] == f"{definition['spec']['group']}/{version['name']}"
    assert document["kind"] == definition["spec"]["names"]["kind"] and document["metadata"]["name"]
    validator().validate(document)
    # Its container and volumes, as KServe puts them in the predictor's pod: valid Kubernetes, strictly.
    import kubernetes_validate

    spec = document["spec"]
    container = {**spec["containers"][0], "args": [a.replace("{{.Name}}", "half-plus-two") for a in spec["containers"][0]["args"]]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "predictor"}, "spec": {"containers": [container], "volumes": spec["volumes"]}}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


BREAKAGES: dict[str, Callable[[dict], None]] = {
    "a misspelled field": lambda doc: doc["spec"].__setitem__("supportedModelFormat", doc["spec"].pop("supportedModelFormats")),
    "a misspelled container field": lambda doc: doc["spec"]["containers"][0].__setitem__("comand", doc["spec"]["containers"][0].pop("command")),
    "no containers (required)": lambda doc: doc["spec"].pop("containers"),
    "a model format without its name (required)": lambda doc: doc["spec"]["supportedModelFormats"][0].pop("name"),
    "a priority as a string": lambda doc: doc["spec"]["supportedModelFormats"][0].__setitem__("priority", "2"),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_the_validator_refuses_a_broken_runtime(breakage: str) -> None:
    broken = copy.deepcopy(runtime())
    BREAKAGES[breakage](broken)
    with pytest.raises(jsonschema.ValidationError):
        validator().validate(broken)


def test_it_is_kserve_s_tensorflow_runtime_with_forkserve_s_image() -> None:
    ours, theirs = runtime()["spec"], kserve_tensorflow_runtime()["spec"]
    for field in ("supportedModelFormats", "protocolVersions", "annotations"):
        assert ours[field] == theirs[field], field
    container, kserve_container = ours["containers"][0], theirs["containers"][0]
    # The same command and flags: the image answers to TF Serving's binary by its path, with forkserve's launcher.
    assert (container["name"], container["command"], container["args"]) == \
        (kserve_container["name"], kserve_container["command"], kserve_container["args"])
    dockerfile = (ROOT / "Dockerfile").read_text()
    installed = re.search(r"^COPY scripts/tensorflow_model_server (\S+)$", dockerfile, re.M)[1]
    assert container["command"] == [installed.rstrip("/") + "/tensorflow_model_server"]
    assert (ROOT / "scripts" / "tensorflow_model_server").read_text().splitlines()[-1] == 'exec python3 -m server tfserving "$@"'
    assert container["image"].split(":")[0] == "forkserve"  # the base's image name, which an overlay's `images:` renames


def test_it_runs_as_the_image_s_user_with_the_run_directory_writable() -> None:
    spec = runtime()["spec"]
    container = spec["containers"][0]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert str(container["securityContext"]["runAsUser"]) == re.search(r"^USER (\d+)$", dockerfile, re.M)[1]
    assert container["securityContext"]["readOnlyRootFilesystem"]
    run_dir = re.search(r"FORKSERVE_RUN_DIR=(\S+)", dockerfile)[1]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert "emptyDir" in {volume["name"]: volume for volume in spec["volumes"]}[mounts[run_dir]]
    assert int({e["name"]: e["value"] for e in container["env"]}["FORKSERVE_WORKERS"]) == int(container["resources"]["limits"]["cpu"])
    rest_port = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--rest_api_port="))
    assert spec["annotations"]["prometheus.kserve.io/port"] == rest_port and spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"
