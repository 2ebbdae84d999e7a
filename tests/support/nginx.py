"""Run the shipped nginx configs (conf/nginx*.conf, REST and gRPC) on loopback in front of test servers."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import requests

from tests.support.harness import ROOT, free_port, wait_until


def nginx_binary() -> str:
    """The nginx executable; missing is a failure in CI and a skip elsewhere."""
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is not installed (.ci/run installs it)")
        pytest.skip("nginx is not installed (apt-get install nginx)")
    return path


class Nginx:
    """conf/NAME with its listen port and upstream servers pointed at test instances (and `locations` added to its server).

    `edits` replaces text of the shipped config (each must occur), for a test that needs, say, a shorter timeout.
    """

    def __init__(self, work: Path, upstream_ports: list[int], conf_name: str = "nginx.conf", locations: str = "",
                 edits: dict[str, str] | None = None) -> None:
        self.work = work
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_target = f"127.0.0.1:{self.port}"  # for a config whose listener is HTTP/2 (gRPC)
        text = (ROOT / "conf" / conf_name).read_text()
        for old, new in (edits or {}).items():
            assert old in text, old
            text = text.replace(old, new)
        text, listens = re.subn(r"^(\s*)listen 127\.0\.0\.1:\d+", rf"\g<1>listen 127.0.0.1:{self.port}", text, flags=re.M)
        assert listens == 1, listens
        self.http2 = f"listen 127.0.0.1:{self.port} http2;" in text
        if locations:
            assert text.count("        location / {") == 1
            text = text.replace("        location / {", f"{locations}\n        location / {{")
        shipped = re.findall(r"server 127\.0\.0\.1:(\d+)", text)
        assert len(shipped) == len(upstream_ports), (shipped, upstream_ports)
        for old, new in zip(shipped, upstream_ports):
            text = text.replace(f"server 127.0.0.1:{old} ", f"server 127.0.0.1:{new} ", 1)
        text = text.replace("/var/log/nginx/", f"{work}/")
        work.mkdir(parents=True, exist_ok=True)
        self.conf = work / "nginx.conf"
        self.conf.write_text(text)
        directives = f"daemon off; pid {work}/nginx.pid; error_log {work}/error.log warn;"
        self.process = subprocess.Popen(
            [nginx_binary(), "-p", str(work), "-c", str(self.conf), "-g", directives],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_until(self._answers, 20, "nginx to listen")

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"nginx exited: {(self.work / 'error.log').read_text(errors='replace')}")
        if self.http2:  # NOTE: an h2c-only listener answers no HTTP/1.1 request: listening is what there is to see
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
                return True
            except OSError:
                return False
        try:
            requests.get(self.url + "/healthz", timeout=2)
            return True
        except requests.ConnectionError:
            return False

    def access_log(self) -> str:
        """What nginx logged, one request a line."""
        path = self.work / ("forkserve-grpc.access.log" if self.http2 else "forkserve.access.log")
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(20)
