"""The committed V2 protobuf modules are what `make protos` makes of our .proto, and speak tritonclient's wire format.

NOTE: protoc (grpcio-tools) runs in a subprocess: it must never run in a process that loaded
TensorFlow (server.protocols.v2.messages). tritonclient's descriptor is read in a subprocess that imports
tritonclient only: its `inference.*` messages and ours cannot share protobuf's default pool.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[4]
PROTO = "server/protocols/v2/protos/open_inference.proto"
GENERATED = ["server/protocols/v2/protos/open_inference_pb2.py"]
CORE_RPCS = ["ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer"]


def protoc(tmp_path: Path, *args: str) -> None:
    """grpcio-tools' protoc over our .proto, as the Makefile runs it (from the repository root, -I .)."""
    result = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", ".", *args, PROTO],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_committed_modules_are_generated_from_the_proto(tmp_path: Path) -> None:
    protoc(tmp_path, f"--python_out={tmp_path}")
    for relative in GENERATED:
        assert (tmp_path / relative).read_bytes() == (ROOT / relative).read_bytes(), f"{relative} is stale: run `make protos`"


def _ours(tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    protoc(tmp_path, f"--descriptor_set_out={tmp_path / 'ours.pb'}")
    (ours,) = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / "ours.pb").read_bytes()).file
    return ours


def _tritonclient() -> descriptor_pb2.FileDescriptorProto:
    """tritonclient.grpc's grpc_service.proto, serialized in a process of its own."""
    code = "import sys; from tritonclient.grpc import service_pb2; sys.stdout.buffer.write(service_pb2.DESCRIPTOR.serialized_pb)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return descriptor_pb2.FileDescriptorProto.FromString(result.stdout)


def _messages(file: descriptor_pb2.FileDescriptorProto) -> dict[str, descriptor_pb2.DescriptorProto]:
    """Every message of the file by its full name (".inference.X", ".inference.X.Nested")."""
    found: dict[str, descriptor_pb2.DescriptorProto] = {}

    def add(prefix: str, message: descriptor_pb2.DescriptorProto) -> None:
        found[f"{prefix}.{message.name}"] = message
        for nested in message.nested_type:
            add(f"{prefix}.{message.name}", nested)

    for message in file.message_type:
        add(f".{file.package}", message)
    return found


def _wire(file: descriptor_pb2.FileDescriptorProto) -> dict[str, object]:
    """What goes on the wire for the core RPCs: method types, then each reachable message's fields."""
    messages = _messages(file)
    (service,) = [s for s in file.service if s.name == "GRPCInferenceService"]
    methods = {m.name: m for m in service.method}
    wire: dict[str, object] = {}
    pending = []
    for name in CORE_RPCS:
        method = methods[name]
        wire[name] = (method.input_type, method.output_type, method.client_streaming, method.server_streaming)
        pending += [method.input_type, method.output_type]
    while pending:
        type_name = pending.pop()
        if type_name in wire:
            continue
        message = messages[type_name]
        wire[type_name] = sorted(
            (f.number, f.name, f.type, f.label, f.type_name, f.HasField("oneof_index"), message.options.map_entry)
            for f in message.field
        )
        pending += [f.type_name for f in message.field if f.type == f.TYPE_MESSAGE]
    return wire


def test_our_v2_messages_are_wire_compatible_with_tritonclient_s(tmp_path: Path) -> None:
    ours, theirs = _ours(tmp_path), _tritonclient()
    assert (ours.package, ours.syntax) == (theirs.package, theirs.syntax) == ("inference", "proto3")
    mine, triton = _wire(ours), _wire(theirs)
    assert len(mine) > len(CORE_RPCS) + 10  # the requests, responses, tensors, parameters and map entries
    assert mine == triton
    # the service's path is Triton's, with the six core calls only (the extensions answer UNIMPLEMENTED)
    assert [(s.name, [m.name for m in s.method]) for s in ours.service] == [("GRPCInferenceService", CORE_RPCS)]

