"""What the benchmarks share: their command line and the look of their plots."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tests.support.harness import ROOT


def arguments(doc: str, seconds: float = 8.0, rounds: int = 3) -> argparse.ArgumentParser:
    """--seconds per cell, --rounds of interleaved cells, --out for the results (add more, then parse)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=seconds, help="wrk duration per measurement")
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds (medians are reported)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    return parser


def finish_figure(figure, axes, concurrency: tuple[int, ...], path: Path) -> None:
    """Connection counts as ticks, legends and grids on every axis, then save."""
    for axis in axes.flat:
        axis.set_xticks(concurrency, [str(c) for c in concurrency])
        axis.legend(fontsize=7)
        axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def save_table(out: Path, name: str, table: str) -> None:
    """Write a results table into --out and show it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(table)
    print(table)


class NoisyNeighbour:
    """One CPU-bound process at normal priority, as a log shipper or a sidecar would be."""

    def __enter__(self) -> "NoisyNeighbour":
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


def process_cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes so far (a server's workers)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def batching_totals(base_url: str, model: str) -> dict[str, float]:
    """A server's running totals for `model`: TF calls and their rows, requests and their wait for a request thread."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    totals = {"calls": 0.0, "rows": 0.0, "waits": 0.0, "wait_seconds": 0.0}
    text = requests.get(f"{base_url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name == "forkserve_batch_size_rows_count":
                totals["calls"] += sample.value
            elif sample.name == "forkserve_batch_size_rows_sum":
                totals["rows"] += sample.value
            elif sample.labels.get("stage") == "thread_wait" and sample.name.endswith("_count"):
                totals["waits"] += sample.value
            elif sample.labels.get("stage") == "thread_wait" and sample.name.endswith("_sum"):
                totals["wait_seconds"] += sample.value
    return totals


def rss_mib(pids: list[int]) -> float:
    """Resident set size of these processes, MiB each on average."""
    sizes = []
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        sizes.append(int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024)
    return sum(sizes) / max(len(sizes), 1)


def timed(step: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds `step` took, what it returned): the in-process benchmarks' one clock."""
    started = time.perf_counter()
    result = step()
    return time.perf_counter() - started, result
