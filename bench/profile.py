"""Where a worker's GIL time goes under load: py-spy on one forkserve worker, stacks sorted into stages.

    .venv/bin/python -m bench.profile [--workload mlp] [--connections 16] [--seconds 8]

Starts forkserve (CPU-count workers) on the bench models, drives it with wrk, records one worker
with `py-spy record --gil` (samples of the thread holding the GIL: the Python work that the GIL
serialises) and prints the share of each stage; writes bench/results/profile-<workload>-c<N>.txt.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench import models
from bench.load import run_wrk
from bench.run import request_bodies
from server.settings import available_cpus
from tests.e2e.harness import ROOT, Server

# (stage, file pattern, function pattern): a sample belongs to the stage of the frame nearest its
# leaf that matches a rule, so a numpy call made by a codec counts as decoding.
RULES = [
    ("waking another thread (Condition.notify, reply lock release)", r"server/worker/reply\.py|threading\.py", r"set_result|set_exception|notify"),
    ("numpy <-> tensor conversion", r"constant_op\.py|framework/ops\.py|tensor_conversion", r""),
    ("numpy <-> tensor conversion", r"server/worker/runtime\.py|server/compat\.py", r"dictcomp|flat"),
    ("TensorFlow call", r"tensorflow/|keras/|server/worker/runtime\.py", r""),
    ("executor batching and hand-off (queue, padding, reply)", r"server/worker/executor\.py|server/worker/reply\.py", r""),
    ("metrics (buffered, flusher thread)", r"server/telemetry/(buffer|metrics|flusher|files)\.py|prometheus_client/", r""),
    ("access log (buffered, flusher thread)", r"server/telemetry/access_log\.py|gunicorn/glogging\.py", r""),
    ("response encode", r"server/http/common\.py|server/http/codecs/jsonio\.py", r"json_response|encode|dumps"),
    ("request decode and validation (orjson, numpy, signature checks)", r"server/http/codecs/|server/http/common\.py|server/signature\.py", r""),
    ("connection balancing (board reads and writes)", r"server/connection_board\.py", r""),
    ("forkserve views and instrumentation", r"server/", r""),
    ("Flask / Werkzeug request handling", r"flask/|werkzeug/", r""),
    ("gunicorn HTTP parsing and response writing", r"gunicorn/http/|gunicorn/util\.py", r""),
    ("gunicorn worker loop (poll, accept, keep-alive)", r"gunicorn/|selectors\.py|concurrent/futures/|socket\.py", r""),
]
GIL_FLAG = ["--gil"]  # samples of the thread holding the GIL only
FRAME_RE = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def stage_of(frames: list[str]) -> str:
    """The stage of one sampled stack (frames root first)."""
    for frame in reversed(frames):
        match = FRAME_RE.match(frame)
        if not match:
            continue
        for stage, file_pattern, function_pattern in RULES:
            if re.search(file_pattern, match["file"]) and re.search(function_pattern, match["function"]):
                return stage
    return "other"


def summarize(raw: str) -> tuple[int, list[tuple[str, int]]]:
    """py-spy's raw (collapsed) output -> total samples and samples per stage, largest first."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[stage_of(stack.split(";"))] += int(count)
    return sum(counts.values()), counts.most_common()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--raw", type=Path, help="also keep py-spy's collapsed stacks here")
    args = parser.parse_args()
    pyspy = Path(sys.executable).with_name("py-spy")
    with tempfile.TemporaryDirectory(prefix="forkserve-profile-") as work:
        models.build(Path(work) / "models")
        body = request_bodies()[args.workload]
        server = Server(models_dir=Path(work) / "models", run_dir=Path(work) / "run", workers=available_cpus()).start()
        try:
            url = f"{server.url}/v1/models/{args.workload}:predict"
            run_wrk(url, body, args.connections, 2, threads=2)  # warm
            load = threading.Thread(target=run_wrk, args=(url, body, args.connections, args.seconds + 3), kwargs={"threads": 2})
            load.start()
            raw_path = Path(work) / "profile.raw"
            subprocess.run(
                [str(pyspy), "record", *GIL_FLAG, "-p", str(server.worker_pids()[0]), "-d", str(round(args.seconds)),
                 "-r", "500", "-f", "raw", "-o", str(raw_path)],
                check=True, capture_output=True, timeout=args.seconds + 60,
            )
            load.join()
        finally:
            server.stop()
        if args.raw:
            args.raw.write_text(raw_path.read_text())
        total, stages = summarize(raw_path.read_text())
    lines = [f"py-spy record --gil, one of {available_cpus()} workers, {args.workload.upper()}, wrk -c{args.connections}: "
             f"{total} samples of the thread holding the GIL"]
    lines += [f"{100 * count / total:5.1f} %  {stage}" for stage, count in stages]
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"profile-{args.workload}-c{args.connections}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
