"""What one hostile request costs a worker: CPU seconds and peak memory growth, by case (issue 32's items 2, 7, 9, 12).

    .venv/bin/python -m bench.hostile [--cases NAME,...] [--fill-rows 250000]

Starts one 1-worker forkserve (the demo's plain digits model, TF Serving's half_plus_two, the
default 32 MiB body limit), sends each case once and prints the answer's status, the wall time,
the worker's CPU seconds (utime + stime from /proc/PID/stat) and the growth of its peak resident
memory (VmHWM from /proc/PID/status, reset before each case) around that one request.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import grpc
import requests

from tests.support.harness import ROOT, Server
from tests.support.models import TFSERVING_TESTDATA

PNG = (ROOT / "examples" / "digit.png").read_bytes()  # 193 bytes: the demo's handwritten 3
DIGITS_INPUT = "image"


def reset_peak(pid: int) -> None:
    """Start VmHWM again from the current resident size (Linux: 5 to clear_refs; the server's user or root)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def worker_cost(pid: int) -> tuple[float, int]:
    """(CPU seconds so far, VmHWM in KiB) of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    peak = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmHWM:"))
    return cpu, peak


def settled_cost(pid: int) -> tuple[float, int]:
    """worker_cost once the worker is idle again (it may go on working after the answer: an abandoned batch)."""
    cpu, peak = worker_cost(pid)
    while True:
        time.sleep(0.5)
        now, peak = worker_cost(pid)
        if now - cpu < 0.05:
            return now, peak
        cpu = now


def tfserving_stub(server: Server) -> Any:
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    channel = grpc.insecure_channel(server.grpc_target, options=[("grpc.max_send_message_length", -1)])
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def v2_stub(server: Server) -> Any:
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.insecure_channel(server.grpc_target, options=[("grpc.max_send_message_length", -1)])
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def grpc_status(call: Callable[[], Any]) -> str:
    try:
        call()
        return "OK"
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()[:90]}"


def rest_status(response: requests.Response) -> str:
    return f"{response.status_code}: {response.text[:90]}"


def string_fill(server: Server, rows: int) -> Callable[[], str]:
    """gRPC Predict: one DT_STRING value (the PNG) filling shape [rows] of the image input."""
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits"
    request.inputs[DIGITS_INPUT].CopyFrom(tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING, string_val=[PNG],
        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=rows)])))
    print(f"    message: {request.ByteSize()} bytes")
    stub = tfserving_stub(server)
    return lambda: grpc_status(lambda: stub.Predict(request, timeout=600))


def rest_b64_rows(server: Server, rows: int) -> Callable[[], str]:
    """REST predict: `rows` {"b64": PNG} instances."""
    body = {"instances": [{"b64": base64.b64encode(PNG).decode()}] * rows}
    return lambda: rest_status(server.post("/v1/models/digits:predict", json=body))


def grpc_regress(server: Server, rows: int) -> Callable[[], str]:
    """gRPC Regress with `rows` tf.Examples."""
    from tensorflow.core.example import example_pb2
    from tensorflow_serving.apis import regression_pb2

    request = regression_pb2.RegressionRequest()
    request.model_spec.name, request.model_spec.signature_name = "half_plus_two", "regress_x_to_y"
    example = example_pb2.Example()
    example.features.feature["x"].float_list.value.append(1.0)
    request.input.example_list.examples.extend([example] * rows)
    print(f"    message: {request.ByteSize()} bytes")
    stub = tfserving_stub(server)
    return lambda: grpc_status(lambda: stub.Regress(request, timeout=600))


def rest_regress(server: Server, rows: int) -> Callable[[], str]:
    """REST :regress with `rows` examples."""
    body = {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}] * rows}
    return lambda: rest_status(server.post("/v1/models/half_plus_two:regress", json=body))


def v2_raw_empty_bytes(server: Server, count: int) -> Callable[[], str]:
    """gRPC ModelInfer: `count` zero-length BYTES elements in raw_input_contents (4 bytes each)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="half_plus_two", raw_input_contents=[b"\0" * (4 * count)])
    request.parameters["signature_name"].string_param = "regress_x_to_y"
    request.inputs.add(name="inputs", datatype="BYTES", shape=[count])
    print(f"    message: {request.ByteSize()} bytes")
    stub = v2_stub(server)
    return lambda: grpc_status(lambda: stub.ModelInfer(request, timeout=600))


def v2_typed_empty_bytes(server: Server, count: int) -> Callable[[], str]:
    """gRPC ModelInfer: `count` zero-length bytes_contents (2 bytes each on the wire)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="half_plus_two")
    request.parameters["signature_name"].string_param = "regress_x_to_y"
    tensor = request.inputs.add(name="inputs", datatype="BYTES", shape=[count])
    tensor.contents.bytes_contents.extend([b""] * count)
    print(f"    message: {request.ByteSize()} bytes")
    stub = v2_stub(server)
    return lambda: grpc_status(lambda: stub.ModelInfer(request, timeout=600))


def v2_huge_shape(server: Server) -> Callable[[], str]:
    """REST V2 infer and gRPC ModelInfer: FP32 shape [0, 2**62, 2**62, 1] with no data."""
    from tritonclient.grpc import service_pb2

    shape = [0, 2**62, 2**62, 1]
    body = {"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": []}]}
    request = service_pb2.ModelInferRequest(model_name="half_plus_two", raw_input_contents=[b""])
    request.inputs.add(name="x", datatype="FP32", shape=shape)
    stub = v2_stub(server)
    return lambda: (f"REST {rest_status(server.post('/v2/models/half_plus_two/infer', json=body))} | "
                    f"gRPC {grpc_status(lambda: stub.ModelInfer(request, timeout=60))}")


def cases(fill_rows: int) -> dict[str, Callable[[Server], Callable[[], str]]]:
    limit = 32 * 1024 * 1024
    return {
        "string_fill": lambda s: string_fill(s, fill_rows),
        "rest_b64_rows": lambda s: rest_b64_rows(s, 5000),
        "grpc_regress": lambda s: grpc_regress(s, 200_000),
        "rest_regress": lambda s: rest_regress(s, 5000),
        "v2_raw_empty_bytes": lambda s: v2_raw_empty_bytes(s, (limit - 1024) // 4),
        "v2_typed_empty_bytes": lambda s: v2_typed_empty_bytes(s, (limit - 1024) // 2),
        "v2_huge_shape": v2_huge_shape,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--fill-rows", type=int, default=250_000, help="the string fill's rows (the limit allows 4194304)")
    args = parser.parse_args()
    table = cases(args.fill_rows)
    chosen = args.cases.split(",") if args.cases else list(table)
    work = Path(tempfile.mkdtemp(prefix="hostile-"))
    (work / "models" / "digits").mkdir(parents=True)
    shutil.copytree(ROOT / "models" / "digits" / "1", work / "models" / "digits" / "1")
    shutil.copytree(TFSERVING_TESTDATA / "saved_model_half_plus_two_cpu", work / "models" / "half_plus_two")
    conf = work / "models.toml"
    conf.write_text('[models.digits]\nimage_mode = "L"\nimage_resize = "box"\nimage_scale = "unit"\n')
    server = Server(models_dir=work / "models", run_dir=work / "run", conf_path=conf, workers=1,
                    env={"TF_CPP_MIN_LOG_LEVEL": "3"}).start()
    try:
        (pid,) = server.worker_pids()
        print(f"worker {pid}; cases: {', '.join(chosen)}")
        for name in chosen:
            print(f"{name}:")
            send = table[name](server)
            reset_peak(pid)
            cpu, peak = worker_cost(pid)
            started = time.monotonic()
            answer = send()
            wall = time.monotonic() - started
            cpu_after, peak_after = settled_cost(pid)
            print(f"    {answer}\n    wall {wall:.2f} s, worker CPU {cpu_after - cpu:.2f} s, "
                  f"peak RSS +{(peak_after - peak) / 1024:.0f} MB (VmHWM {peak_after / 1024:.0f} MB)")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
