"""TF Serving's protobuf messages (tensorflow-serving-api, installed without its `tensorflow` dependency); no grpc."""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def apis() -> ModuleType:
    """tensorflow_serving.apis with the messages forkserve reads and writes, and the services' declarations.

    NOTE: the *_service_pb2 modules declare the services (server.rpc registers them and reflection
    reads them from protobuf's default pool); the *_pb2_grpc stubs are clients' and are not loaded.
    """
    import tensorflow_serving.apis as apis
    from tensorflow_serving.apis import (  # noqa: F401
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        inference_pb2,
        model_management_pb2,
        model_pb2,
        model_service_pb2,
        predict_pb2,
        prediction_log_pb2,
        prediction_service_pb2,
        regression_pb2,
    )

    return apis
