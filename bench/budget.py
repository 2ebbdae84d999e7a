"""Where one request's CPU goes, stage by stage: the budget behind "why not faster" in docs/performance.md.

    .venv/bin/python -m bench.budget [--seconds 6] [--rounds 3]

In this process (one request at a time, CPU time of all its threads, so the executor thread counts):
forkserve's codecs, the TensorFlow call made on the calling thread, the executor round trip, and
the whole Flask app called as WSGI (no HTTP); the HTTP floor's Flask app the same way. Then both
as servers (2 workers, wrk at 1 and 16 connections, median of --rounds): the workers' CPU per
request. The difference between a server and its app in-process is what gunicorn (HTTP parsing,
gthread's poller and thread pool, sockets) and, under load, the threads' contention for the GIL
cost. Writes budget.md into --out.

py-spy's GIL sampling (bench.profile, removed) misled here: on this VM it put 22 % of a worker's
GIL time in the metrics flusher, which costs 9 us per request measured directly.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import arguments, process_cpu_seconds, save_table
from bench.load import run_wrk
from bench.run import Baseline, request_bodies
from tests.support.harness import ROOT, Server

WORKLOADS = ("mlp", "cnn")
CONNECTIONS = (1, 16)


def cpu_us(function: Callable[[], object], calls: int = 2000) -> float:
    """CPU microseconds (all threads of this process) per call, after a warm-up."""
    for _ in range(50):
        function()
    started = time.process_time()
    for _ in range(calls):
        function()
    return (time.process_time() - started) / calls * 1e6


def wsgi_call(app: Callable, path: str, body: bytes) -> Callable[[], bytes]:
    """One POST through a WSGI app, no HTTP server."""
    def start_response(status: str, headers: list, exc_info: object = None) -> None:
        assert status.startswith("200"), status

    def call() -> bytes:
        environ = {
            "REQUEST_METHOD": "POST", "PATH_INFO": path, "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1", "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "CONTENT_LENGTH": str(len(body)),
            "CONTENT_TYPE": "application/json",
        }
        return b"".join(app(environ, start_response))
    return call


def in_process(models_dir: Path) -> dict[str, dict[str, float]]:
    """Stage costs of forkserve's app and the floor's, one request at a time in this process."""
    from dataclasses import replace

    from bench.floor_app import app as floor_app
    from server.http.app import create_app
    from server.protocols.tfserving import json_codec
    from server.settings import Settings
    from server.tensors import jsonio
    from server.tensors.validate import validate_inputs

    app = create_app(replace(Settings.current(), models_dir=models_dir, run_dir=None))
    registry = app.extensions["forkserve"]
    registry.load_all(1, 1)  # one intra-op thread, as each of 2 workers on 2 CPUs gets
    bodies = request_bodies()
    costs = {}
    for workload in WORKLOADS:
        body = bodies[workload]
        version = registry.get(workload).resolve(None, None)
        decoded = json_codec.decode_predict(jsonio.loads(body), version.signature, version.config)
        signature = version.signature(decoded.signature_name)
        fed, rows = validate_inputs(decoded.inputs, signature, version.config)
        executor = version.executor
        outputs = executor.call_padded(signature.name, fed, rows)

        def decode(body: bytes = body, version=version) -> object:  # noqa: ANN001
            found = json_codec.decode_predict(jsonio.loads(body), version.signature, version.config)
            return validate_inputs(found.inputs, version.signature(found.signature_name), version.config)

        stage = {
            "decode": cpu_us(decode),
            "tf_call": cpu_us(lambda: executor.call_padded(signature.name, fed, rows)),
            "round_trip": cpu_us(lambda: executor.submit(signature.name, fed, rows, True).future.result()),
            "encode": cpu_us(lambda: jsonio.dumps(json_codec.encode_predict(outputs, decoded.row_format))),
            "app": cpu_us(wsgi_call(app, f"/v1/models/{workload}:predict", body)),
        }
        stage["hand_off"] = stage["round_trip"] - stage["tf_call"]
        stage["flask_and_views"] = stage["app"] - stage["round_trip"] - stage["decode"] - stage["encode"]
        costs[workload] = stage
    costs["floor"] = {"app": cpu_us(wsgi_call(floor_app, "/v1/models/mlp:predict", bodies["mlp"]))}
    return costs


def children_of(pid: int) -> list[int]:
    """The live child processes of `pid` (a gunicorn master's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def server_cpu_per_request(url: str, body: bytes, pids: Callable[[], list[int]], connections: int, seconds: float) -> float:
    """Workers' CPU microseconds per request under wrk at `connections`."""
    run_wrk(url, body, connections, 1)
    before = process_cpu_seconds(pids())
    result = run_wrk(url, body, connections, seconds)
    assert result.errors == 0, f"{result.errors} errors from {url}"
    return (process_cpu_seconds(pids()) - before) / result.requests * 1e6


def main() -> None:
    args = arguments(__doc__, seconds=6.0).parse_args()
    with tempfile.TemporaryDirectory(prefix="forkserve-budget-") as work:
        models_dir = Path(work) / "models"
        # NOTE: built in a child: TensorFlow's thread settings must come before its first use here.
        subprocess.run([sys.executable, "-c", f"from pathlib import Path; from bench import models; models.build(Path({str(models_dir)!r}))"],
                       check=True, cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        costs = in_process(models_dir)
        bodies = request_bodies()
        forkserve = Server(models_dir=models_dir, run_dir=Path(work) / "run", workers=2,
                           env={"TF_CPP_MIN_LOG_LEVEL": "3"}).start()
        floor = Baseline("bench.floor_app:app", 2, {}, Path(work))
        try:
            floor.wait("/v1/models/mlp:predict", bodies["mlp"], 2)
            servers: dict[tuple[str, int], list[float]] = {}
            for _ in range(args.rounds):
                for connections in CONNECTIONS:
                    for workload in WORKLOADS:
                        servers.setdefault((workload, connections), []).append(server_cpu_per_request(
                            f"{forkserve.url}/v1/models/{workload}:predict", bodies[workload], forkserve.worker_pids,
                            connections, args.seconds))
                    servers.setdefault(("floor", connections), []).append(server_cpu_per_request(
                        f"{floor.url}/v1/models/mlp:predict", bodies["mlp"], lambda: children_of(floor.process.pid),
                        connections, args.seconds))
        finally:
            forkserve.stop()
            floor.stop()
    save_table(args.out, "budget.md", report(costs, {k: statistics.median(v) for k, v in servers.items()}, args))


def report(costs: dict, servers: dict, args: argparse.Namespace) -> str:
    """CPU microseconds per request by stage, forkserve's two workloads beside the floor."""
    rows = [
        ("request decode and validation (orjson, TF Serving rows, signature checks)", "decode"),
        ("TensorFlow call, batch of 1, on the calling thread", "tf_call"),
        ("executor hand-off (submit, wake the executor, wake the request thread)", "hand_off"),
        ("response encode", "encode"),
        ("request handling: the predict fast path (Flask for other routes), instrumentation, metrics", "flask_and_views"),
    ]
    lines = [f"# CPU per request by stage, microseconds (in-process: one request at a time; servers: 2 workers, "
             f"wrk, median of {args.rounds} rounds of {args.seconds:.0f} s)", "",
             "| stage | MLP | CNN | HTTP floor (MLP body) |", "|---|---|---|---|"]
    for label, key in rows:
        lines.append(f"| {label} | {costs['mlp'][key]:.0f} | {costs['cnn'][key]:.0f} | |")
    lines.append(f"| **the app in-process (sum of the above)** | {costs['mlp']['app']:.0f} | {costs['cnn']['app']:.0f} "
                 f"| {costs['floor']['app']:.0f} |")
    for connections in CONNECTIONS:
        label = f"gunicorn, gthread, sockets{', GIL contention' if connections > 1 else ''} ({connections} connection{'s' if connections > 1 else ''})"
        lines.append(f"| {label} | " + " | ".join(
            f"{servers[(w, connections)] - costs[w]['app']:.0f}" for w in ("mlp", "cnn", "floor")) + " |")
        lines.append(f"| **the server's workers, {connections} connection{'s' if connections > 1 else ''}** | " + " | ".join(
            f"{servers[(w, connections)]:.0f}" for w in ("mlp", "cnn", "floor")) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
