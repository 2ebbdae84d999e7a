"""forkserve against the peers people compare it with: Seldon MLServer, KServe's Python server, and the HTTP floor.

    make bench-peers   # builds .peers/mlserver and .peers/kserve once, then runs this
    .venv/bin/python -m bench.peers [--seconds 8] [--rounds 3] [--protocols rest,grpc] [--noisy] [--out bench/results]

The same two models as bench.run (a CNN on one base64 JPEG per request, an MLP on 20 floats),
each server with 2 workers and a warm concrete function, never model.predict:
- forkserve, its defaults (TensorFlow Serving's REST API);
- KServe 0.21 `kserve.Model` (bench/peer_servers/kserve_server.py, the same v1 body);
- MLServer 1.7.1 with a custom runtime (bench/peer_servers/mlserver_runtime.py, V2 body), twice:
  `parallel_workers: 2` with adaptive batching (max_batch_size 32, max_batch_time 2 ms) and
  `parallel_workers: 0` without (its best at one connection); "MLServer" is the better of the two;
- the HTTP floor (bench/floor_app.py, MLP only): Flask doing the same JSON work and no model.
With `grpc` in --protocols (the default), the same models over gRPC with binary tensors
(bench.peers_grpc), load from h2load (bench.grpc_load):
- forkserve's TF Serving PredictionService/Predict (tensor_content) and V2 ModelInfer
  (raw_input_contents), from its per-worker gRPC listeners;
- MLServer's and KServe's V2 ModelInfer (the same request bytes as forkserve's V2 cell);
and forkserve's idle RSS per worker with gRPC on against a second forkserve with it off.
The CNN's gRPC input is the JPEG decoded to a float32 tensor (the REST cells send the JPEG).
Every server must answer the same prediction before it is measured (gRPC answers: through grpcio,
status OK, against forkserve's REST answer). All run at once; each round measures every cell
once, servers back to back, and the table shows the median of the rounds [min-max]. `--noisy`
adds the same cells with one core kept busy by a CPU-bound process at normal priority. Writes
peers.md and peers.png into --out.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import orjson
import requests

from bench import models, peers_grpc
from bench.common import NoisyNeighbour, arguments, finish_figure, save_table
from bench.grpc_load import GrpcCall, call_once, checked_call, run_h2load
from bench.load import LoadResult, run_wrk
from bench.run import Baseline, request_bodies
from tests.support.harness import ROOT, Server, free_port, wait_until

PEERS = ROOT / ".peers"
RUNTIMES = ROOT / "bench" / "peer_servers"
CONCURRENCY = (1, 16, 64)
REST_SERVERS = ("forkserve", "forkserve-before", "kserve", "mlserver-pw2", "mlserver-pw0", "floor")
GRPC_SERVERS = ("forkserve-grpc-tfs", "forkserve-grpc-v2", "kserve-grpc", "mlserver-pw2-grpc", "mlserver-pw0-grpc")
SERVERS = REST_SERVERS + GRPC_SERVERS
PEERS_ONLY = ("kserve", "mlserver-pw2", "mlserver-pw0")
GRPC_PEERS = ("kserve-grpc", "mlserver-pw2-grpc", "mlserver-pw0-grpc")
PROTOCOLS = ("rest", "grpc")


def v2_bodies(v1: dict[str, bytes]) -> dict[str, bytes]:
    """The same requests in the Open Inference Protocol V2 shape MLServer speaks."""
    cnn = orjson.loads(v1["cnn"])["instances"][0]["b64"]
    mlp = orjson.loads(v1["mlp"])["instances"][0]
    image = orjson.dumps({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [cnn]}]})
    return {
        "cnn": image,
        "cnn_heavy": image,
        "mlp": orjson.dumps({"inputs": [{"name": "features", "shape": [1, len(mlp)], "datatype": "FP32", "data": mlp}]}),
    }


class Process:
    """A peer server started from its own virtual environment."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, cwd=cwd, env={**os.environ, **env}, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.log = log

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.log.name} exited: {self.log.read_text()[-3000:]}")
        return True

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)


def start_mlserver(work: Path, files: dict[str, Path], parallel_workers: int, batching: bool) -> tuple[Process, str, str]:
    """MLServer over both models; returns it, its base URL and its gRPC target."""
    root = work / f"mlserver-pw{parallel_workers}"
    port, grpc_port = free_port(), free_port()
    settings = {"debug": False, "gzip_enabled": False, "metrics_endpoint": None, "parallel_workers": parallel_workers,
                "host": "127.0.0.1", "http_port": port, "grpc_port": grpc_port, "metrics_port": free_port()}
    (root).mkdir(parents=True)
    (root / "settings.json").write_text(json.dumps(settings))
    for name, path in files.items():
        (root / name).mkdir()
        model = {"name": name, "implementation": "mlserver_runtime.KerasRuntime", "parameters": {"uri": str(path)}}
        if batching:
            model.update(max_batch_size=32, max_batch_time=0.002)
        (root / name / "model-settings.json").write_text(json.dumps(model))
    process = Process([str(PEERS / "mlserver" / "bin" / "mlserver"), "start", str(root)], root,
                      {"PYTHONPATH": str(RUNTIMES), "TF_CPP_MIN_LOG_LEVEL": "3"}, work / f"mlserver-pw{parallel_workers}.log")
    return process, f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"


def start_kserve(work: Path, files: dict[str, Path]) -> tuple[Process, str, str]:
    """KServe over both models, 2 REST workers (its gRPC server is in the main process); it, its URL, its gRPC target."""
    port, grpc_port = free_port(), free_port()
    command = [str(PEERS / "kserve" / "bin" / "python"), str(RUNTIMES / "kserve_server.py"), "--port", str(port),
               "--grpc-port", str(grpc_port), "--workers", "2", *[f"{name}={path}" for name, path in files.items()]]
    process = Process(command, work, {"PYTHONPATH": str(RUNTIMES), "TF_CPP_MIN_LOG_LEVEL": "3"}, work / "kserve.log")
    return process, f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"


def predictions(server: str, url: str, body: bytes) -> np.ndarray:
    """What a server answers for `body`, as an array (V2 outputs or TF Serving predictions)."""
    answer = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=120)
    answer.raise_for_status()
    parsed = answer.json()
    if "outputs" in parsed:
        output = parsed["outputs"][0]
        return np.asarray(output["data"], dtype=np.float64).reshape(output["shape"])
    return np.asarray(parsed["predictions"], dtype=np.float64)


def answers_ready(url: str, body: bytes) -> bool:
    """The server answers 8 requests in a row (each worker warm: KServe loads at the first request)."""
    try:
        return all(requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=120).ok for _ in range(8))
    except requests.RequestException:
        return False


def process_tree_pss_mib(pid: int) -> float:
    """Proportional set size of a process and all its descendants."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            rollup = Path(f"/proc/{current}/smaps_rollup").read_text()
            total += int(next(line.split()[1] for line in rollup.splitlines() if line.startswith("Pss:")))
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total / 1024


def grpc_cells(workloads: tuple[str, ...], reference_url: str, v1: dict[str, bytes], targets: dict[str, str],
               forkserve_target: str) -> dict[tuple[str, str], GrpcCall]:
    """(server, workload): its call, checked through grpcio against forkserve's REST answer (raises on a mismatch)."""
    arrays = peers_grpc.input_arrays(v1)
    cells = {}
    for workload in workloads:
        name = peers_grpc.input_name(forkserve_target, workload)
        reference = predictions("forkserve", reference_url.format(workload), v1[workload])
        v2 = peers_grpc.v2_request(workload, name, arrays[workload])
        requests_of = {"forkserve-grpc-tfs": (forkserve_target, peers_grpc.TFS_PREDICT,
                                              peers_grpc.tfs_request(workload, name, arrays[workload])),
                       **{server: (target, peers_grpc.V2_INFER, v2) for server, target in targets.items()}}
        for server, (target, method, request) in requests_of.items():
            answer = call_once(target, method, request)
            got = (peers_grpc.tfs_answer if method == peers_grpc.TFS_PREDICT else peers_grpc.v2_answer)(answer)
            assert got.shape == reference.shape and np.allclose(got, reference, atol=1e-4), (server, workload, got, reference)
            cells[(server, workload)] = checked_call(target, method, request)
            print(f"{server} {workload} over gRPC: answers {got.ravel()[:3].round(5).tolist()}... as forkserve's REST "
                  f"(largest difference {np.abs(got - reference).max():.1e})", flush=True)
    return cells


def ready_over_grpc(call: GrpcCall) -> bool:
    """The server answers 8 calls in a row (every MLServer worker and KServe's main process warm)."""
    import grpc

    try:
        for _ in range(8):
            call_once(call.target, call.method, call.request, timeout=120)
        return True
    except grpc.RpcError:
        return False


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--noisy", action="store_true", help="also measure with one core kept busy")
    parser.add_argument("--workloads", nargs="+", default=["cnn", "mlp"], choices=models.WORKLOADS)
    parser.add_argument("--connections", nargs="+", type=int, default=list(CONCURRENCY))
    parser.add_argument("--protocols", default="rest,grpc", help="comma-separated: rest (wrk), grpc (h2load), or both")
    parser.add_argument("--forkserve-env", nargs="*", default=[], metavar="NAME=value",
                        help="settings of forkserve other than its defaults (to try a change against the peers)")
    parser.add_argument("--before-env", nargs="*", default=None, metavar="NAME=value",
                        help="also run a second forkserve with these settings, as 'forkserve-before' (a change's baseline)")
    args = parser.parse_args()
    protocols = tuple(p for p in args.protocols.split(",") if p)
    if not protocols or set(protocols) - set(PROTOCOLS):
        parser.error(f"--protocols: a comma-separated list of {', '.join(PROTOCOLS)}")
    workloads = tuple(args.workloads)
    for peer in ("mlserver", "kserve"):
        if not (PEERS / peer / "bin" / "python").exists():
            sys.exit(f"{PEERS / peer} is missing: run `make bench-peers` (it builds the peers' environments)")
    if "grpc" in protocols and not shutil.which("h2load"):
        sys.exit("h2load is missing: apt-get install nghttp2-client (or --protocols rest)")
    work = Path(tempfile.mkdtemp(prefix="forkserve-peers-"))
    files = models.build(work / "models", workloads)
    v1, v2 = request_bodies(), v2_bodies(request_bodies())
    forkserve_env = {"TF_CPP_MIN_LOG_LEVEL": "3", **dict(item.split("=", 1) for item in args.forkserve_env)}
    running: list = []
    rss: dict[str, list[float]] = {}
    try:
        forkserve = Server(models_dir=work / "models", run_dir=work / "run", workers=2, env=forkserve_env)
        running.append(forkserve)
        forkserve.start()
        before = None
        if args.before_env is not None:
            before = Server(models_dir=work / "models", run_dir=work / "run-before", workers=2,
                            env={"TF_CPP_MIN_LOG_LEVEL": "3", **dict(item.split("=", 1) for item in args.before_env)})
            running.append(before)
            before.start()
        without_grpc = None
        if "grpc" in protocols:  # the same forkserve with gRPC off, for idle memory only (stopped before the load)
            without_grpc = Server(models_dir=work / "models", run_dir=work / "run-nogrpc", workers=2,
                                  env={**forkserve_env, "FORKSERVE_GRPC_BIND": ""})
            running.append(without_grpc)
            without_grpc.start()
        kserve, kserve_url, kserve_grpc = start_kserve(work, files)
        mls2, mls2_url, mls2_grpc = start_mlserver(work, files, 2, batching=True)
        mls0, mls0_url, mls0_grpc = start_mlserver(work, files, 0, batching=False)
        running += [kserve, mls2, mls0]
        urls = {  # server: (url of a workload, its body, root pid)
            "forkserve": (lambda w: f"{forkserve.url}/v1/models/{w}:predict", v1, forkserve.process.pid),
            **({"forkserve-before": (lambda w: f"{before.url}/v1/models/{w}:predict", v1, before.process.pid)} if before else {}),
            "kserve": (lambda w: f"{kserve_url}/v1/models/{w}:predict", v1, kserve.process.pid),
            "mlserver-pw2": (lambda w: f"{mls2_url}/v2/models/{w}/infer", v2, mls2.process.pid),
            "mlserver-pw0": (lambda w: f"{mls0_url}/v2/models/{w}/infer", v2, mls0.process.pid),
        }
        if "rest" in protocols:
            floor = Baseline("bench.floor_app:app", 2, {}, work)
            running.append(floor)
            urls["floor"] = (lambda w: f"{floor.url}/v1/models/{w}:predict", v1, floor.process.pid)
        if without_grpc is not None:
            urls["forkserve-nogrpc"] = (lambda w: f"{without_grpc.url}/v1/models/{w}:predict", v1, without_grpc.process.pid)
        peers = {"kserve": kserve, "mlserver-pw2": mls2, "mlserver-pw0": mls0}
        for server, (url, bodies, _) in urls.items():
            for workload in workloads if server != "floor" else [w for w in workloads if w == "mlp"]:
                def ready() -> bool:
                    if server in peers:
                        peers[server].alive()
                    return answers_ready(url(workload), bodies[workload])

                wait_until(ready, 300, f"{server} to answer {workload}", interval=1.0)
        for workload in workloads:
            reference = predictions("forkserve", urls["forkserve"][0](workload), v1[workload])
            for server in PEERS_ONLY:
                got = predictions(server, urls[server][0](workload), urls[server][1][workload])
                assert np.allclose(got, reference, atol=1e-4), (server, workload, got, reference)
        calls: dict[tuple[str, str], GrpcCall] = {}
        if "grpc" in protocols:
            peer_targets = {"forkserve-grpc-v2": forkserve.grpc_target, "kserve-grpc": kserve_grpc,
                            "mlserver-pw2-grpc": mls2_grpc, "mlserver-pw0-grpc": mls0_grpc}
            arrays = peers_grpc.input_arrays(v1)
            for workload in workloads:  # KServe loads its models in its main process at the first gRPC call
                request = peers_grpc.v2_request(workload, peers_grpc.input_name(forkserve.grpc_target, workload), arrays[workload])
                for server, target in peer_targets.items():
                    probe = GrpcCall(target, peers_grpc.V2_INFER, request)
                    wait_until(lambda: peers[server.removesuffix("-grpc")].alive() and ready_over_grpc(probe)
                               if server != "forkserve-grpc-v2" else ready_over_grpc(probe),
                               300, f"{server} to answer {workload} over gRPC", interval=1.0)
            calls = grpc_cells(workloads, f"{forkserve.url}/v1/models/{{}}:predict", v1, peer_targets, forkserve.grpc_target)
            rss = peers_grpc.idle_rss({"gRPC on": forkserve, "gRPC off": without_grpc})
            print("idle RSS per worker (MiB):", {k: [round(v, 1) for v in vs] for k, vs in rss.items()}, flush=True)
            without_grpc.stop()
            running.remove(without_grpc)
            del urls["forkserve-nogrpc"]
        memory = {server: process_tree_pss_mib(pid) for server, (_, _, pid) in urls.items()}
        print("idle memory (PSS, MiB):", {k: round(v) for k, v in memory.items()}, flush=True)
        rest_cells = urls if "rest" in protocols else {}
        conditions = ("quiet", "noisy") if args.noisy else ("quiet",)
        measured: dict[tuple, list[LoadResult]] = collections.defaultdict(list)
        for round_number in range(args.rounds):
            for condition in conditions:
                for workload in workloads:
                    for connections in args.connections:
                        cells = [(server, lambda url=url(workload), body=bodies[workload]: measure_rest(
                                      url, body, connections, args.seconds))
                                 for server, (url, bodies, _) in rest_cells.items() if server != "floor" or workload == "mlp"]
                        cells += [(server, lambda call=call: run_h2load(call, connections, args.seconds))
                                  for (server, cell_workload), call in calls.items() if cell_workload == workload]
                        for server, measure in cells:
                            with NoisyNeighbour() if condition == "noisy" else contextlib.nullcontext():
                                result = measure()
                            measured[(condition, workload, connections, server)].append(result)
                            print(f"round {round_number + 1} {condition} {workload} c={connections:<3d} {server:18s} "
                                  f"{result.requests_per_second:8.1f} req/s p50 {result.p50_seconds * 1000:7.2f} "
                                  f"p99 {result.p99_seconds * 1000:7.2f} max {result.max_seconds * 1000:7.1f} "
                                  f"errors {result.errors} client CPU {client_share(result, args.seconds):4.1f} %",
                                  flush=True)
    finally:
        for server in reversed(running):
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    table = report(measured, memory, rss, args)
    save_table(args.out, "peers.md", table)
    plot(measured, args.out / "peers.png", workloads, tuple(args.connections))


def measure_rest(url: str, body: bytes, connections: int, seconds: float) -> LoadResult:
    """wrk after a 1 s warm-up run."""
    run_wrk(url, body, connections, 1, threads=1)
    return run_wrk(url, body, connections, seconds, threads=1)


def client_share(result: LoadResult, seconds: float) -> float:
    """The load generator's CPU over the run, in % of one core."""
    return result.client_cpu_seconds / max(round(seconds), 1) * 100


def _median(results: list[LoadResult], field: str) -> tuple[float, float, float]:
    values = [getattr(r, field) for r in results]
    return statistics.median(values), min(values), max(values)


def _rps(measured: dict, key: tuple) -> float | None:
    return statistics.median(r.requests_per_second for r in measured[key]) if key in measured else None


def report(measured: dict, memory: dict[str, float], rss: dict[str, list[float]], args: argparse.Namespace) -> str:
    """One row per cell: req/s [min-max], p50 / p99, the ratio to the best peer of its protocol; then the issue's targets."""
    lines = [f"# forkserve and its peers: 2 workers each, REST from wrk -t1, gRPC from h2load -t1 (one call in flight "
             f"per connection), {args.rounds} interleaved rounds of {args.seconds:.0f} s, median [min-max]", "",
             "Idle memory, whole process tree (PSS): " + ", ".join(f"{k} {v:.0f} MiB" for k, v in memory.items()), ""]
    if rss:
        on, off = rss["gRPC on"], rss["gRPC off"]
        growth = (statistics.mean(on) / statistics.mean(off) - 1) * 100
        lines += [f"forkserve idle RSS per worker after warm-up (median of 5 samples): gRPC on "
                  f"{', '.join(f'{v:.1f}' for v in on)} MiB, off (FORKSERVE_GRPC_BIND=\"\") "
                  f"{', '.join(f'{v:.1f}' for v in off)} MiB: {growth:+.1f} %", ""]
    lines += ["| condition | workload | conc. | protocol | server | req/s | p50 ms | p99 ms | slowest ms | errors "
              "| client CPU % of a core (µs/req) | × best peer of its protocol (req/s) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (condition, workload, connections, server), results in sorted(measured.items(), key=lambda item: (
            item[0][0], item[0][1], item[0][2], SERVERS.index(item[0][3]))):
        rps, low, high = _median(results, "requests_per_second")
        protocol = "grpc" if server in GRPC_SERVERS else "rest"
        peers = [v for peer in (GRPC_PEERS if protocol == "grpc" else PEERS_ONLY)
                 if (v := _rps(measured, (condition, workload, connections, peer))) is not None]
        versus = f"{rps / max(peers):.2f}×" if server.startswith("forkserve") and peers else ""
        cpu = statistics.median(client_share(r, args.seconds) for r in results)
        per_request = statistics.median(r.client_cpu_seconds / max(r.requests, 1) * 1e6 for r in results)
        lines.append(f"| {condition} | {workload} | {connections} | {protocol} | {server} | {rps:.0f} [{low:.0f}-{high:.0f}] "
                     f"| {_median(results, 'p50_seconds')[0] * 1000:.2f} | {_median(results, 'p99_seconds')[0] * 1000:.2f} "
                     f"| {_median(results, 'max_seconds')[0] * 1000:.1f} | {sum(r.errors for r in results)} "
                     f"| {cpu:.0f} ({per_request:.0f}) | {versus} |")
    return "\n".join(lines + [""] + targets(measured, rss)) + "\n"


def targets(measured: dict, rss: dict[str, list[float]]) -> list[str]:
    """Issue 19's targets, each with the numbers it was judged on (quiet condition)."""
    lines = []
    cells = sorted({(w, c) for (condition, w, c, s) in measured if condition == "quiet" and s in GRPC_SERVERS})
    for workload, connections in cells:
        key = ("quiet", workload, connections)
        peers = {peer: measured[(*key, peer)] for peer in GRPC_PEERS if (*key, peer) in measured}
        for server in ("forkserve-grpc-tfs", "forkserve-grpc-v2"):
            if (*key, server) not in measured or not peers:
                continue
            ours = measured[(*key, server)]
            best = max(_rps(measured, (*key, peer)) for peer in peers)
            p99 = statistics.median(r.p99_seconds for r in ours)
            lowest_peer_p99 = min(statistics.median(r.p99_seconds for r in results) for results in peers.values())
            ratio = _rps(measured, (*key, server)) / best
            if connections > 1:
                lines.append(f"- {workload} c={connections} {server}: {ratio:.2f}× the best peer's gRPC req/s "
                             f"({'met' if ratio >= 1.5 else 'NOT met'}: ≥ 1.5×); p99 {p99 * 1000:.2f} ms against the "
                             f"lowest peer p99 {lowest_peer_p99 * 1000:.2f} ms ({'met' if p99 < lowest_peer_p99 else 'NOT met'})")
    for workload in ("cnn", "cnn_heavy"):
        for connections in sorted({c for (_, w, c, _) in measured if w == workload}):
            grpc, rest = (_rps(measured, ("quiet", workload, connections, s)) for s in ("forkserve-grpc-v2", "forkserve"))
            if grpc and rest:
                lines.append(f"- {workload} c={connections}: V2 gRPC raw float32 {grpc:.0f} req/s against REST base64 JPEG "
                             f"{rest:.0f} req/s ({'met' if grpc >= rest else 'NOT met'}: ≥)")
    if rss:
        growth = (statistics.mean(rss["gRPC on"]) / statistics.mean(rss["gRPC off"]) - 1) * 100
        lines.append(f"- idle RSS per worker with gRPC on: {growth:+.1f} % ({'met' if growth <= 5 else 'NOT met'}: ≤ 5 %)")
    return ["Targets (issue 19, quiet condition):", "", *lines] if lines else []


def plot(measured: dict, path: Path, workloads: tuple[str, ...], concurrency: tuple[int, ...]) -> None:
    """req/s and p99 against connections, per workload (quiet condition)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, len(workloads), figsize=(5.5 * len(workloads), 8), squeeze=False)
    for column, workload in enumerate(workloads):
        for server in SERVERS:
            cells = [(c, measured.get(("quiet", workload, c, server))) for c in concurrency]
            cells = [(c, results) for c, results in cells if results]
            if not cells:
                continue
            xs = [c for c, _ in cells]
            axes[0][column].plot(xs, [_median(r, "requests_per_second")[0] for _, r in cells], "o-", label=server)
            axes[1][column].plot(xs, [_median(r, "p99_seconds")[0] * 1000 for _, r in cells], "o-", label=server)
        axes[0][column].set(title=f"{workload}: throughput", xlabel="connections", ylabel="requests/s", xscale="log")
        axes[1][column].set(title=f"{workload}: p99 latency", xlabel="connections", ylabel="ms", xscale="log", yscale="log")
    finish_figure(figure, axes, concurrency, path)


if __name__ == "__main__":
    main()
