"""What a handler costs: the digits model with and without one, at 16 connections, in one server.

    .venv/bin/python -m bench.handler_cost [--seconds 8] [--rounds 3] [--out bench/results]

One forkserve (2 workers) serves three versions of the same weights: 1 plain, 2 the demo's
handler (models/digits/2: base64 PNG in, {"digit", "probability"} out), 3 a trivial handler that
passes TensorFlow Serving's body through (`instances` in, `predictions` out). Pairs with the same
work on each side are compared: plain vs trivial handler on the same float body (the handler
machinery's own cost), plain image path vs the demo handler on the same PNG. Cells interleave
round by round; worker CPU per request is the workers' utime + stime over the cell divided by
the requests wrk completed. Writes handler-cost.md into --out.
"""

from __future__ import annotations

import argparse
import base64
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np
import orjson
from PIL import Image

from bench.common import arguments, process_cpu_seconds, save_table
from bench.load import LoadResult, run_wrk
from tests.support.harness import ROOT, Server

TRIVIAL_HANDLER = '''
import numpy as np


class Handler:
    """Pass-through: TensorFlow Serving's body in and out, through the handler machinery."""

    def preprocess(self, body):
        return {"image": np.asarray(body["instances"], dtype=np.float32)}

    def postprocess(self, outputs, body):
        return {"predictions": outputs["probabilities"]}
'''
CONF = """
[models.digits]
version_policy = "all"
handler = true
"""
CONNECTIONS = 16


def repository(root: Path) -> Path:
    """digits/1 plain, digits/2 the demo handler, digits/3 the trivial handler."""
    demo = ROOT / "models" / "digits"
    shutil.copytree(demo / "1", root / "digits" / "1")
    shutil.copytree(demo / "2", root / "digits" / "2")
    shutil.copytree(demo / "1", root / "digits" / "3")
    (root / "digits" / "3" / "handler.py").write_text(TRIVIAL_HANDLER)
    return root


def bodies() -> dict[str, bytes]:
    """The same digit as floats and as a PNG, in each version's request shape."""
    png = (ROOT / "examples" / "digit.png").read_bytes()
    with Image.open(ROOT / "examples" / "digit.png") as image:
        pixels = np.asarray(image.convert("L").resize((8, 8), Image.Resampling.BOX), dtype=np.float32) / 255
    floats = orjson.dumps({"instances": pixels[np.newaxis, :, :, np.newaxis].round(4).tolist()})
    encoded = base64.b64encode(png).decode()
    return {"floats": floats, "png-plain": orjson.dumps({"instances": [{"b64": encoded}]}),
            "png-handler": orjson.dumps({"image": encoded})}


CELLS = {  # name: (version, body)
    "plain, floats": (1, "floats"),
    "trivial handler, floats": (3, "floats"),
    "plain, PNG": (1, "png-plain"),
    "demo handler, PNG": (2, "png-handler"),
}


def worker_cpu_seconds(server: Server) -> float:
    """utime + stime of the server's workers so far."""
    return process_cpu_seconds(server.worker_pids())


def cell(server: Server, version: int, body: bytes, seconds: float) -> tuple[LoadResult, float]:
    """One wrk run; its result and the worker CPU milliseconds per request."""
    url = f"{server.url}/v1/models/digits/versions/{version}:predict"
    run_wrk(url, body, CONNECTIONS, 1, threads=2)
    before = worker_cpu_seconds(server)
    result = run_wrk(url, body, CONNECTIONS, seconds, threads=2)
    cpu = worker_cpu_seconds(server) - before
    assert result.errors == 0, f"{result.errors} failed requests to version {version}"
    return result, cpu / result.requests * 1000


def main() -> None:
    parser = arguments(__doc__)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forkserve-handler-bench-"))
    (work / "run").mkdir()
    (work / "run" / "models.toml").write_text(CONF)
    server = Server(models_dir=repository(work / "models"), run_dir=work / "run", conf_path=work / "run" / "models.toml",
                    workers=2, env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    measured: dict[str, list[tuple[LoadResult, float]]] = {name: [] for name in CELLS}
    try:
        server.start()
        payloads = bodies()
        for round_number in range(args.rounds):
            for name, (version, body) in CELLS.items():
                result, cpu_ms = cell(server, version, payloads[body], args.seconds)
                measured[name].append((result, cpu_ms))
                print(f"round {round_number + 1} {name:24s} {result.requests_per_second:8.1f} req/s "
                      f"p99 {result.p99_seconds * 1000:6.2f} ms  worker CPU {cpu_ms:.3f} ms/request", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    table = report(measured, args)
    save_table(args.out, "handler-cost.md", table)


def report(measured: dict[str, list[tuple[LoadResult, float]]], args: argparse.Namespace) -> str:
    """Medians per cell, and each handler's CPU per request against its plain pair."""
    median = {name: (statistics.median(r.requests_per_second for r, _ in runs),
                     statistics.median(r.p99_seconds for r, _ in runs) * 1000,
                     statistics.median(c for _, c in runs)) for name, runs in measured.items()}
    lines = [f"# Handler cost: digits at {CONNECTIONS} connections, 2 workers, median of {args.rounds} "
             f"interleaved rounds of {args.seconds:.0f} s", "",
             "| path | req/s | p99 ms | worker CPU ms/request | CPU vs plain |", "|---|---|---|---|---|"]
    pairs = {"trivial handler, floats": "plain, floats", "demo handler, PNG": "plain, PNG"}
    for name, (rps, p99, cpu) in median.items():
        versus = f"{cpu / median[pairs[name]][2] - 1:+.1%}" if name in pairs else ""
        lines.append(f"| {name} | {rps:.0f} | {p99:.2f} | {cpu:.3f} | {versus} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
