"""Drive a gRPC server with h2load: one pre-serialized unary request, checked call by call in aggregate.

    .venv/bin/python -m bench.grpc_load [--seconds 5]   # h2load against a trivial grpcio echo server

h2load (Debian nghttp2-client, C) posts the length-prefixed message with `content-type:
application/grpc` and `te: trailers` from N connections, one call in flight on each. It counts HTTP
statuses only, and a failed gRPC call is an HTTP 200 whose trailers carry grpc-status. So every
target is first called with grpcio (the status and the answer checked, the response's size kept),
and a run counts a call as answered only if its bytes arrived: a failed call is trailers-only
(no DATA), so the DATA bytes h2load received divided by one framed response is the number of
answered calls, and any shortfall is an error. Per-call latencies come from h2load's --log-file.

Run as a module, it measures h2load's own CPU per call against a grpcio echo server (2 processes,
SO_REUSEPORT), which answers faster than a model server: the load generator is not the limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import re
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench.load import LoadResult, children_cpu_seconds

GRPC_HEADERS = ("content-type: application/grpc", "te: trailers")
ECHO_METHOD = "/bench.Echo/Echo"
HALF_FAIL_METHOD = "/bench.Echo/EveryOtherFails"  # answers like Echo on odd calls, INVALID_ARGUMENT on even ones


@dataclass(frozen=True)
class GrpcCall:
    """One unary call to repeat: where, which method, the serialized request, the serialized answer's size."""

    target: str
    method: str
    request: bytes
    response_size: int = -1


def frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message: not compressed, 4-byte big-endian length, the bytes."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def call_once(target: str, method: str, request: bytes, timeout: float = 60.0) -> bytes:
    """The serialized answer to one call through grpcio (raises grpc.RpcError unless the status is OK)."""
    with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20),
                                                ("grpc.max_send_message_length", 64 << 20)]) as channel:
        stub = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        return stub(request, timeout=timeout)


def checked_call(target: str, method: str, request: bytes, calls: int = 3) -> GrpcCall:
    """Call a few times through grpcio; every answer OK and of one size, or raise."""
    sizes = {len(call_once(target, method, request)) for _ in range(calls)}
    if len(sizes) != 1:
        raise RuntimeError(f"{target}{method}: answers of different sizes {sorted(sizes)}; h2load's byte count cannot check them")
    return GrpcCall(target, method, request, sizes.pop())


def parse_h2load(output: str, latencies_us: list[int], response_size: int) -> LoadResult:
    """Requests/s, latency percentiles and errors from h2load's summary and its per-call log."""
    done, succeeded, failed, errored, timeouts = (int(x) for x in re.search(
        r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout",
        output).groups())
    data = int(re.search(r"traffic: .*\((\d+)\) data", output)[1])
    rps = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", output)[1])
    framed = response_size + 5
    answered = data // framed
    if data % framed:  # a partial or differently sized answer: not what the checked call returned
        answered = min(answered, succeeded - 1)
    errors = failed + errored + timeouts + max(0, succeeded - answered)
    latencies = sorted(latencies_us) or [0]
    quantiles = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else latencies * 99
    return LoadResult(rps * (answered / succeeded if succeeded else 0.0), quantiles[49] / 1e6, quantiles[98] / 1e6,
                      latencies[-1] / 1e6, done, errors)


def _log_latencies(path: Path) -> list[int]:
    """Microseconds of each call h2load logged (start, HTTP status, duration per line)."""
    return [int(line.split("\t")[2]) for line in path.read_text().splitlines() if line.count("\t") == 2]


def _h2load(call: GrpcCall, body: Path, connections: int, seconds: float, log: Path) -> str:
    """One h2load run; its summary."""
    command = ["h2load", "-t1", f"-c{connections}", "-m1", f"-D{max(1, round(seconds))}", "-d", str(body),
               f"--log-file={log}", *[arg for header in GRPC_HEADERS for arg in ("-H", header)],
               f"http://{call.target}{call.method}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=True).stdout


def run_h2load(call: GrpcCall, connections: int, seconds: float, warm_up: float = 1.0) -> LoadResult:
    """`connections` connections with one call in flight each, for `seconds` after a `warm_up` run."""
    assert call.response_size >= 0, "check the call first (checked_call)"
    with tempfile.TemporaryDirectory() as work:
        body, log = Path(work) / "request.bin", Path(work) / "calls.log"
        body.write_bytes(frame(call.request))
        # NOTE: a separate run, not --warm-up-time: h2load counts the warm-up's bytes in its traffic
        # line but not its calls in the requests line, and the byte count is what checks the answers.
        _h2load(call, body, connections, warm_up, log)
        before = children_cpu_seconds()
        output = _h2load(call, body, connections, seconds, log)
        cpu = children_cpu_seconds() - before
        return dataclasses.replace(parse_h2load(output, _log_latencies(log), call.response_size), client_cpu_seconds=cpu)


def _echo_server(port: int, ready: multiprocessing.Event) -> None:
    """A grpcio server that returns the request's bytes (Echo), or fails every other call (EveryOtherFails)."""
    import itertools
    from concurrent.futures import ThreadPoolExecutor

    counter = itertools.count()

    def every_other_fails(request: bytes, context: grpc.ServicerContext) -> bytes:
        if next(counter) % 2:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "every other call fails")
        return request

    handler = grpc.method_handlers_generic_handler("bench.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request),
        "EveryOtherFails": grpc.unary_unary_rpc_method_handler(every_other_fails),
    })
    server = grpc.server(ThreadPoolExecutor(max_workers=8), handlers=[handler], options=[("grpc.so_reuseport", 1)])
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    ready.set()
    server.wait_for_termination()


def start_echo(port: int, processes: int = 2) -> list[multiprocessing.Process]:
    """`processes` echo servers sharing `port` (SO_REUSEPORT), started and listening."""
    context = multiprocessing.get_context("spawn")
    started = []
    for _ in range(processes):
        ready = context.Event()
        process = context.Process(target=_echo_server, args=(port, ready), daemon=True)
        process.start()
        if not ready.wait(30):
            raise RuntimeError("echo server did not start")
        started.append(process)
    return started


def main() -> None:
    from tests.support.harness import free_port

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--size", type=int, default=120, help="request bytes (120: the MLP's V2 request is about this)")
    args = parser.parse_args()
    port = free_port()
    servers = start_echo(port)
    try:
        call = checked_call(f"127.0.0.1:{port}", ECHO_METHOD, os.urandom(args.size))
        for connections in args.connections:
            result = run_h2load(call, connections, args.seconds)
            cpu = result.client_cpu_seconds
            print(f"echo c={connections:<3d} {result.requests_per_second:8.0f} req/s p50 {result.p50_seconds * 1000:6.2f} ms "
                  f"p99 {result.p99_seconds * 1000:6.2f} ms errors {result.errors}; h2load CPU "
                  f"{cpu / max(result.requests, 1) * 1e6:5.1f} us/call, {cpu / args.seconds * 100:4.1f} % of a core", flush=True)
    finally:
        for server in servers:
            server.kill()


if __name__ == "__main__":
    main()
