"""The protobuf messages and service bases: TF Serving's from tensorflow-serving-api, V2's from protos/.

NOTE: protos/open_inference_pb2*.py are generated from protos/open_inference.proto (ours) by
`make protos` and committed: grpcio-tools' in-process protoc crashes a process that has loaded
TensorFlow (both carry protobuf's C++ library: a glibc malloc assertion, seen here), so a worker
cannot compile it at run time. tests/unit/rpc/test_messages.py checks the files match the .proto.
"""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def v2() -> tuple[ModuleType, ModuleType]:
    """(messages, services) of inference.GRPCInferenceService."""
    from server.rpc.protos import open_inference_pb2, open_inference_pb2_grpc

    return open_inference_pb2, open_inference_pb2_grpc


@functools.cache
def tfserving() -> ModuleType:
    """TF Serving's generated modules (tensorflow-serving-api, installed without its `tensorflow` dependency).

    NOTE: the *_service_pb2 modules declare the services; *_pb2_grpc does not import them, and
    server reflection finds only what protobuf's default pool holds.
    """
    import tensorflow_serving.apis as apis
    from tensorflow_serving.apis import (  # noqa: F401
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_log_pb2,
        prediction_service_pb2,
        prediction_service_pb2_grpc,
        regression_pb2,
    )

    return apis
