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
EXTENSION_RPCS = ["ModelConfig", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"]
PARTIAL = {".inference.ModelConfig", ".inference.ModelInput", ".inference.ModelOutput", ".inference.ModelDynamicBatching"}


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


def _tritonclient() -> list[descriptor_pb2.FileDescriptorProto]:
    """tritonclient.grpc's grpc_service.proto and model_config.proto, serialized in a process of its own."""
    code = ("import sys; from tritonclient.grpc import service_pb2, model_config_pb2; "
            "[sys.stdout.buffer.write(len(m.DESCRIPTOR.serialized_pb).to_bytes(4, 'big') + m.DESCRIPTOR.serialized_pb) "
            "for m in (service_pb2, model_config_pb2)]")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    files, data = [], result.stdout
    while data:
        size = int.from_bytes(data[:4], "big")
        files.append(descriptor_pb2.FileDescriptorProto.FromString(data[4 : 4 + size]))
        data = data[4 + size :]
    return files


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


def _wire(files: list[descriptor_pb2.FileDescriptorProto], rpcs: list[str]) -> dict[str, object]:
    """What goes on the wire for `rpcs`: method types, then each reachable message's fields."""
    messages = {name: message for file in files for name, message in _messages(file).items()}
    (service,) = [s for s in files[0].service if s.name == "GRPCInferenceService"]
    methods = {m.name: m for m in service.method}
    wire: dict[str, object] = {}
    pending = []
    for name in rpcs:
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
    assert (ours.package, ours.syntax) == (theirs[0].package, theirs[0].syntax) == ("inference", "proto3")
    mine, triton = _wire([ours], CORE_RPCS), _wire(theirs, CORE_RPCS)
    assert len(mine) > len(CORE_RPCS) + 10  # the requests, responses, tensors, parameters and map entries
    assert mine == triton
    # the service's path is Triton's, with the core calls and the extensions forkserve implements
    assert [(s.name, [m.name for m in s.method]) for s in ours.service] == [("GRPCInferenceService", CORE_RPCS + EXTENSION_RPCS)]


def test_the_extensions_messages_are_triton_s_and_model_config_holds_a_part_of_triton_s_fields(tmp_path: Path) -> None:
    """Statistics and repository messages are Triton's field for field; ModelConfig's fields are a subset of Triton's."""
    mine, triton = _wire([_ours(tmp_path)], EXTENSION_RPCS), _wire(_tritonclient(), EXTENSION_RPCS)
    assert set(mine) - set(triton) == set()
    for name, fields in mine.items():
        if name in PARTIAL:
            assert set(fields) <= set(triton[name]), name  # type: ignore[arg-type]
        else:
            assert fields == triton[name], name

