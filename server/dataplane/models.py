"""What the APIs tell about the served models, the same on every transport: TF Serving's status, V2's metadata and readiness."""

from __future__ import annotations

from typing import Any

from server.errors import ApiError, InvalidArgument, NotFound
from server.models.registry import AVAILABLE, Model, ModelRegistry, ModelVersion
from server.protocols.v2 import SERVER_NAME, SERVER_VERSION
from server.protocols.v2.json_codec import tensor_metadata
from server.protocols.v2.model_config import model_config
from server.signature import DEFAULT_SIGNATURE, SignatureInfo


def tfserving_version(model: Model, version: int | None, label: str | None) -> ModelVersion:
    """The version a TF Serving request addresses; an unknown label is TF Serving's INVALID_ARGUMENT (server_core.cc)."""
    if label is not None and label not in model.config.labels:
        raise InvalidArgument(f"Unrecognized servable version label: {label}")
    return model.resolve(version, label)


def tfserving_statuses(registry: ModelRegistry, name: str, version: int | None, label: str | None) -> list[dict[str, Any]]:
    """GetModelStatus: every version's status, or the one `version` (or `label`) names; NotFound as TF Serving words it."""
    model = registry.get(name)
    if label is not None:
        version = model.resolve(version, label).version
    statuses = registry.statuses(name)
    if version is not None:
        statuses = [s for s in statuses if s["version"] == str(version)]
        if not statuses:
            raise NotFound(f"Servable not found for request: Specific({name}, {version})")
    if not statuses:
        raise NotFound(f"Servable not found for request: Latest({name})")
    return statuses


V2_EXTENSIONS = ("model_configuration", "statistics", "model_repository")  # Triton's extensions, on both transports


def v2_server_metadata(transport_extensions: list[str]) -> dict[str, Any]:
    """ServerMetadata: name, version, and the protocol extensions: Triton's that both transports have, then this one's own."""
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": [*V2_EXTENSIONS, *transport_extensions]}


def described_signature(served: ModelVersion) -> SignatureInfo:
    """The signature V2's metadata describes: serving_default, else the first."""
    signatures = served.servable.signatures
    return signatures.get(DEFAULT_SIGNATURE) or next(iter(signatures.values()))


def v2_model_metadata(registry: ModelRegistry, served: ModelVersion) -> dict[str, Any]:
    """ModelMetadata: name, available versions, platform and the described signature's tensors (-1 for any size)."""
    signature = described_signature(served)
    return {
        "name": served.name,
        "versions": [str(v.version) for v in registry.get(served.name).available()],
        "platform": served.servable.platform,
        "inputs": [tensor_metadata(t) for t in signature.inputs.values()],
        "outputs": [tensor_metadata(t) for t in signature.outputs.values()],
    }


def v2_model_ready(registry: ModelRegistry, name: str, version: int | None) -> tuple[bool, ModelVersion | None, str]:
    """ModelReady: (ready, the version resolved or None, why not); a name or version no model can have raises (400, 404)."""
    try:
        served = registry.get(name).resolve(version)
    except ApiError as exc:
        if exc.status in (400, 404):
            raise
        return False, None, exc.message
    return served.state == AVAILABLE, served, ""


def v2_model_config(served: ModelVersion) -> dict[str, Any]:
    """ModelConfig: the described signature's tensors, the model's batching and version policy, in Triton's shape."""
    return model_config(served.name, served.servable.platform, served.config, described_signature(served))
