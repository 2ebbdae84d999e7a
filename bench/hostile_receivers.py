"""What a hostile payload receiver or OTLP collector costs a worker: its peak RSS, CPU seconds, and redirects followed.

    .venv/bin/python -m bench.hostile_receivers [--cases payload-huge otlp-gzip ...] [--requests 2] [--size-mb 1536]

One 1-worker server (the bench MLP, every request's payload logged to one receiver, every request
traced to another: tests/support/hostile_receiver.py); each case switches one receiver to a hostile mode,
resets the worker's peak RSS (/proc/PID/clear_refs), sends `--requests` predicts and waits until the
worker's CPU stops moving. `*-trickle` cases also say how long the writer (or exporter) stays held:
the seconds until a record (span) sent after the hostile one gets through, once the receiver is
healthy again. Prints one line per case.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import requests

from bench import models
from bench.common import process_cpu_seconds
from tests.support.harness import Server
from tests.support.hostile_receiver import HostileReceiver

CASES = ("payload-huge", "payload-gzip", "payload-endless", "payload-redirect", "payload-trickle",
         "payload-trickle_headers",
         "otlp-huge", "otlp-gzip", "otlp-redirect", "otlp-trickle")
HELD_CAP_S = 60.0


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def settle(pid: int, receiver: HostileReceiver, posts: int, quiet_s: float = 2.0, cap_s: float = 180.0) -> float:
    """Wait until the receiver got `posts` POSTs and finished answering them, and the worker used no CPU for
    `quiet_s` (at most cap_s; a trickling answer never finishes: then CPU alone); the seconds waited."""
    started = time.monotonic()
    last, still_since = process_cpu_seconds([pid]), time.monotonic()
    trickling = receiver.mode.startswith("trickle")
    while time.monotonic() - started < cap_s:
        time.sleep(0.25)
        now = process_cpu_seconds([pid])
        if now - last > 0.02:
            last, still_since = now, time.monotonic()
        done = trickling or (receiver.posts >= posts and receiver.answering == 0)
        if done and time.monotonic() - still_since >= quiet_s:
            break
    return time.monotonic() - started


def wait_for(condition: Callable[[], bool], cap_s: float) -> bool:
    """Poll `condition` until true (True) or cap_s passed (False)."""
    deadline = time.monotonic() + cap_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def predict(server: Server, request_id: str) -> None:
    body = {"instances": [[0.5] * models.MLP_FEATURES]}
    response = requests.post(f"{server.url}/v1/models/mlp:predict", json=body, timeout=30,
                             headers={"X-Request-Id": request_id})
    response.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--size-mb", type=int, default=1536, help="the huge and gzip answers' size")
    args = parser.parse_args()
    size = args.size_mb << 20
    with tempfile.TemporaryDirectory() as work, HostileReceiver(size=size) as events, \
            HostileReceiver(size=size) as collector, HostileReceiver() as elsewhere:
        models.build(Path(work) / "models", ("mlp",))
        conf = Path(work) / "models.toml"
        conf.write_text("[defaults]\npayload_log = { sample = 1.0 }\n")
        server = Server(models_dir=Path(work) / "models", run_dir=Path(work) / "run", conf_path=conf, workers=1, env={
            "FORKSERVE_PAYLOAD_LOG": events.url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100", "FORKSERVE_GRPC_BIND": ""}).start()
        try:
            [pid] = server.worker_pids()
            for case in args.cases:
                target, mode = case.split("-", 1)
                receiver = events if target == "payload" else collector
                redirected_before, posts_before = elsewhere.posts, receiver.posts
                settle(pid, receiver, posts_before)
                receiver.mode, receiver.location = mode, elsewhere.url
                Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
                rss, cpu = rss_mib(pid), process_cpu_seconds([pid])
                for number in range(args.requests):
                    predict(server, f"{case}-{number}")
                wait_for(lambda: receiver.posts > posts_before, 30)
                hostile_at = time.monotonic()
                # a record is 2 events (1 when the first fails: a redirect); the requests' spans go in one export
                expected = 1 if target == "otlp" else args.requests * (1 if mode == "redirect" else 2)
                waited = settle(pid, receiver, posts_before + expected)
                line = (f"{case:24} rss {rss:6.0f} MiB  peak +{peak_rss_mib(pid) - rss:6.0f} MiB  "
                        f"cpu {process_cpu_seconds([pid]) - cpu:6.2f} s  settled in {waited:5.1f} s  "
                        f"posts {receiver.posts - posts_before}  redirects followed {elsewhere.posts - redirected_before}")
                receiver.mode = "ok"
                if mode.startswith("trickle"):  # how long the writer (exporter) stays held by one hostile answer
                    answered = receiver.answered
                    predict(server, f"{case}-after")
                    freed = wait_for(lambda: receiver.answered > answered, HELD_CAP_S)
                    line += f"  held {'' if freed else '> '}{time.monotonic() - hostile_at:.1f} s"
                print(line, flush=True)
        finally:
            events.stopping.set()
            collector.stopping.set()
            server.stop()


if __name__ == "__main__":
    main()
