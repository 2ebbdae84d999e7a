"""Triton's model configuration extension: a served version's settings in the shape of Triton's ModelConfig (JSON).

The REST answer is this dict; the gRPC answer is the same dict parsed into the ModelConfig message
(server.protocols.v2.protos). dims leave out the batch dimension when the model batches, as Triton's do.
"""

from __future__ import annotations

from typing import Any

from server.config import ModelConfig
from server.protocols.v2.json_codec import v2_datatype, v2_shape
from server.signature import SignatureInfo, TensorInfo

BACKEND = "tensorflow"


def data_type(info: TensorInfo) -> str:
    """Triton's DataType name of a signature tensor (BYTES is TYPE_STRING there)."""
    name = v2_datatype(info.dtype)
    return f"TYPE_{'STRING' if name == 'BYTES' else name}"


def dims(info: TensorInfo, batched: bool) -> list[int]:
    """The tensor's shape, without its batch dimension when the model batches; -1 for any size."""
    shape = v2_shape(info)
    return shape[1:] if batched and info.shape is not None else shape


def version_policy(config: ModelConfig) -> dict[str, Any]:
    """forkserve's version policy as Triton's ModelVersionPolicy."""
    if config.version_policy == "all":
        return {"all": {}}
    if config.version_policy == "specific":
        return {"specific": {"versions": sorted(config.versions)}}
    return {"latest": {"num_versions": config.latest}}


def model_config(name: str, platform: str, config: ModelConfig, signature: SignatureInfo) -> dict[str, Any]:
    """ModelConfig of a served version: its signature's tensors, its batching and version policy."""
    batched = signature.batchable

    def tensor(info: TensorInfo) -> dict[str, Any]:
        return {"name": info.name, "data_type": data_type(info), "dims": dims(info, batched)}

    answer: dict[str, Any] = {
        "name": name,
        "platform": platform,
        "backend": BACKEND,
        "version_policy": version_policy(config),
        "max_batch_size": config.max_batch_size if batched else 0,
        "input": [{**tensor(info), "format": "FORMAT_NHWC" if info.is_image else "FORMAT_NONE"}
                  for info in signature.inputs.values()],
        "output": [tensor(info) for info in signature.outputs.values()],
        "parameters": {"signature_name": {"string_value": signature.name}},
    }
    if batched:  # NOTE: forkserve batches whatever is queued, as Triton's dynamic batcher with no delay does
        answer["dynamic_batching"] = {
            "preferred_batch_size": list(config.allowed_batch_sizes),
            "max_queue_delay_microseconds": round(config.max_batch_delay_ms * 1000),
            "preserve_ordering": False,
        }
    return answer
