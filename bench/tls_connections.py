"""A/B: a worker's CPU per new HTTPS connection, forkserve's TLS (one context per worker) against gunicorn's own (one per connection).

    .venv/bin/python -m bench.tls_connections [--rounds 3] [--connections 400]

Two 1-worker servers over the MLP with the same test certificate (made by openssl, P-256):
FORKSERVE_TLS_CERT/_KEY (server.tls: the master's SSLContext, served through gunicorn's ssl_context
hook) and gunicorn's --certfile/--keyfile with forkserve's TLS off (gunicorn 27 builds a context from
the files for every connection). Each round opens `--connections` connections one after the other,
each answered `/healthz`, and reads the worker's CPU time from /proc; rounds alternate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import requests

from bench import models
from tests.certificates import make_ca, make_cert
from tests.support.harness import Server


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=400)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tls-connections-"))
    models.build(work / "models", ("mlp",))
    ca = make_ca(work / "pki", "ca")
    cert = make_cert(work / "pki", ca, "server", "localhost", 1)
    common = {"TF_CPP_MIN_LOG_LEVEL": "3", "FORKSERVE_GRPC_BIND": ""}
    servers = {
        "forkserve (one context)": Server(models_dir=work / "models", run_dir=work / "run-0", workers=1, tls_ca=ca.cert,
                                          env={**common, "FORKSERVE_TLS_CERT": str(cert.cert), "FORKSERVE_TLS_KEY": str(cert.key)}),
        "gunicorn (per connection)": Server(models_dir=work / "models", run_dir=work / "run-1", workers=1, tls_ca=ca.cert,
                                            env=common, extra_args=["--certfile", str(cert.cert), "--keyfile", str(cert.key)]),
    }
    try:
        for server in servers.values():
            server.start()
        results: dict[str, list[float]] = {name: [] for name in servers}
        for round_ in range(args.rounds):
            for name, server in servers.items():
                pid = server.worker_pids()[0]
                before, started = cpu_seconds(pid), time.perf_counter()
                for _ in range(args.connections):
                    assert requests.get(server.url + "/healthz", verify=str(ca.cert), timeout=10).status_code == 200
                per_connection = (cpu_seconds(pid) - before) / args.connections * 1000
                results[name].append(per_connection)
                print(f"round {round_ + 1} {name:26} {per_connection:5.2f} ms worker CPU per connection, "
                      f"{(time.perf_counter() - started) / args.connections * 1000:5.2f} ms each", flush=True)
        for name, runs in results.items():
            print(f"{name:26} median {statistics.median(runs):5.2f} ms worker CPU per new connection")
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
