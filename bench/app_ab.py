"""The REST app's CPU per request, in-process (no HTTP, no other load's noise), of this checkout against another one.

    .venv/bin/python -m bench.app_ab --baseline /path/to/other/checkout [--workloads mlp cnn] [--rounds 7] [--calls 3000]

Each round runs one child process per checkout, in alternating order (baseline then this, then
this then baseline): the child builds the app (the fast path in front of Flask, as a worker
serves it) from the same bench models, loads them with one intra-op thread, and measures the CPU
time of all its threads per TF Serving predict called as WSGI, one request at a time (the same
measurement as bench.budget's "app" row). CPU time, not wall time, so a busy machine slows
both sides alike without changing the figures much. Prints medians [min-max] and this/baseline;
writes app-ab.md into --out. Make the baseline with `git worktree add /tmp/base COMMIT`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import arguments, save_table
from tests.support.harness import ROOT

CHILD = """
import json, sys
from dataclasses import replace
from pathlib import Path
from bench.budget import cpu_us, wsgi_call
from bench.run import request_bodies
from server.http.app import create_app
from server.settings import Settings

models_dir, calls, workloads = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
app = create_app(replace(Settings.current(), models_dir=models_dir, run_dir=None))
app.extensions["forkserve"].load_all(1, 1)
bodies = request_bodies()
print(json.dumps({w: cpu_us(wsgi_call(app, f"/v1/models/{w}:predict", bodies[w]), calls) for w in workloads}))
"""


def measure(root: Path, models_dir: Path, calls: int, workloads: list[str]) -> dict[str, float]:
    """CPU microseconds per request of each workload in a child process running `root`'s code."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(models_dir), str(calls), *workloads], cwd=root,
                          capture_output=True, text=True, check=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(root)})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = arguments(__doc__, rounds=7)
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout of forkserve (git worktree)")
    parser.add_argument("--workloads", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--calls", type=int, default=3000, help="requests measured per child")
    args = parser.parse_args()
    checkouts = {"baseline": args.baseline.resolve(), "this": ROOT}
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="forkserve-app-ab-") as work:
        models_dir = Path(work) / "models"
        subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from bench import models; "
                        "models.build(Path(sys.argv[1]), tuple(sys.argv[2:]))", str(models_dir), *args.workloads],
                       check=True, cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        for round_number in range(args.rounds):
            order = list(checkouts) if round_number % 2 == 0 else list(reversed(checkouts))
            for label in order:
                for workload, cost in measure(checkouts[label], models_dir, args.calls, args.workloads).items():
                    results.setdefault((workload, label), []).append(cost)
                    print(f"round {round_number + 1} {label:8s} {workload} {cost:7.1f} us CPU/request", flush=True)
    save_table(args.out, "app-ab.md", report(results, args))


def report(results: dict[tuple[str, str], list[float]], args: object) -> str:
    """Medians [min-max] per workload and checkout, and this/baseline."""
    lines = [f"# The REST app in-process (fast path, one request at a time): this checkout against {args.baseline}", "",
             f"CPU microseconds per TF Serving predict, {args.rounds} alternating rounds of {args.calls} requests, "
             "median [min-max]", "",
             "| workload | baseline us | this us | this/baseline |", "|---|---|---|---|"]
    for workload in args.workloads:
        base, this = results[(workload, "baseline")], results[(workload, "this")]
        lines.append(f"| {workload} | {statistics.median(base):.1f} [{min(base):.1f}-{max(base):.1f}] | "
                     f"{statistics.median(this):.1f} [{min(this):.1f}-{max(this):.1f}] | "
                     f"{statistics.median(this) / statistics.median(base):.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
