"""The Open Inference Protocol V2's protobuf messages and service declaration (protos/, generated); no grpc.

NOTE: protos/open_inference_pb2.py is generated from protos/open_inference.proto (ours) by
`make protos` and committed: grpcio-tools' in-process protoc crashes a process that has loaded
TensorFlow (both carry protobuf's C++ library: a glibc malloc assertion, seen here), so a worker
cannot compile it at run time. tests/unit/protocols/v2/test_messages.py checks the file matches the .proto.
"""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def protos() -> ModuleType:
    """inference.* messages and the GRPCInferenceService declaration."""
    from server.protocols.v2.protos import open_inference_pb2

    return open_inference_pb2
