"""Drive a server with wrk for a fixed time and parse requests/s, p50, p99 and errors."""

from __future__ import annotations

import dataclasses
import re
import resource
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("{body}", "rb")
wrk.body = f:read("*a")
f:close()
"""
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


@dataclass(frozen=True)
class LoadResult:
    """What one wrk run measured."""

    requests_per_second: float
    p50_seconds: float
    p99_seconds: float
    max_seconds: float
    requests: int
    errors: int
    client_cpu_seconds: float = 0.0  # the load generator's own CPU over the run


def children_cpu_seconds() -> float:
    """User + system CPU of this process's waited-for children so far (a load generator, once it has exited)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _seconds(text: str) -> float:
    """'1.23ms' -> 0.00123."""
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    assert match, text
    return float(match[1]) * UNITS[match[2]]


def parse_wrk(output: str) -> LoadResult:
    """Pull the numbers out of `wrk --latency` output."""
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output)[1])
    p50 = _seconds(re.search(r"^\s+50%\s+(\S+)", output, re.M)[1])
    p99 = _seconds(re.search(r"^\s+99%\s+(\S+)", output, re.M)[1])
    latency_max = _seconds(re.search(r"^\s+Latency\s+\S+\s+\S+\s+(\S+)", output, re.M)[1])
    total = int(re.search(r"(\d+) requests in", output)[1])
    errors = 0
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    if non2xx:
        errors += int(non2xx[1])
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    if socket:
        errors += sum(int(x) for x in socket.groups())
    return LoadResult(rps, p50, p99, latency_max, total, errors)


def run_wrk(url: str, body: bytes, connections: int, seconds: float, threads: int = 1) -> LoadResult:
    """POST `body` to `url` from `connections` keep-alive connections for `seconds`."""
    with tempfile.TemporaryDirectory() as work:
        body_file = Path(work) / "body.json"
        body_file.write_bytes(body)
        script = Path(work) / "post.lua"
        script.write_text(LUA.format(body=body_file))
        command = [
            "wrk", f"-t{min(threads, connections)}", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency",
            "--timeout", "10s", "-s", str(script), url,
        ]
        before = children_cpu_seconds()
        output = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
        cpu = children_cpu_seconds() - before
    return dataclasses.replace(parse_wrk(output), client_cpu_seconds=cpu)
