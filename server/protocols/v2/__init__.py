"""The Open Inference Protocol V2 (KServe, Triton): its JSON (and binary extension) and protobuf wire forms."""

SERVER_NAME = "forkserve"
SERVER_VERSION = "0.1.0"  # what ServerMetadata answers on both transports
