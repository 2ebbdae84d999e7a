"""The image, built and run with podman (or, FORKSERVE_IMAGE_RUNNER=chroot, its file system run by hand): tests/image's tools."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.harness import ROOT, free_port

IMAGE = "localhost/forkserve:test"
BASE = "localhost/forkserve-base:bookworm"


def build() -> str:
    """Build the image from the Dockerfile on a bookworm base made from Debian's packages; its name."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed (apt-get install podman debootstrap)")
    subprocess.run([str(ROOT / "scripts" / "make-base-image.sh")], check=True, timeout=1200)
    started = time.monotonic()
    ca = Path("/etc/ssl/certs/ca-certificates.crt")  # this machine's CAs (a TLS-inspecting proxy's among them)
    secret = ["--secret", f"id=pip_ca,src={ca}"] if ca.exists() else []
    isolation = ["--isolation", "chroot"] if os.environ.get("FORKSERVE_IMAGE_RUNNER") == "chroot" else []
    subprocess.run(["podman", "build", "--format", "docker", "--network", "host", *isolation, *secret, "--build-arg", f"BASE={BASE}", "-t", IMAGE, "."],
                   cwd=ROOT, check=True, timeout=2400)
    print(f"image built in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return IMAGE


def inspect(image: str, field: str):
    """One field of the image's configuration."""
    out = subprocess.run(["podman", "image", "inspect", image, "--format", "{{json .Config.%s}}" % field],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


class Container:
    """The image run with host directories mounted (`volumes`: path in the container -> host directory) and `env` added.

    Natively (REST on 8000) or, `tfserving`, as TF Serving's image is run (REST on 8501); gRPC on 8500 both ways.
    `url` and `grpc_target` reach them from the host.

    NOTE: the chroot runner exists for sandboxes whose kernel refuses the rlimits every OCI runtime
    sets (crun/runc: "setrlimit RLIMIT_NPROC: Operation not permitted"). It runs the image's own
    file system, environment, user, entrypoint and command, as PID 1 of a new PID namespace, on the
    host's network: everything the image decides, without podman's runtime. Natively it moves the
    ports (FORKSERVE_BIND, FORKSERVE_GRPC_BIND) to free ones; as TF Serving, they are 8500 and 8501
    of the host, as the entrypoint composes them.
    """

    def __init__(self, image: str, work: Path, volumes: dict[str, Path], env: dict[str, str], tfserving: bool = False) -> None:
        self.image, self.root = image, work / "rootfs"
        self.runner = os.environ.get("FORKSERVE_IMAGE_RUNNER", "podman")
        rest = 8501 if tfserving else 8000
        if self.runner == "podman" or not tfserving:
            self.ports = {rest: free_port(), 8500: free_port()}  # container port -> host port
        else:
            self.ports = {rest: rest, 8500: 8500}
        self.name = f"forkserve-test-{self.ports[rest]}"
        self.url = f"http://127.0.0.1:{self.ports[rest]}"
        self.grpc_target = f"127.0.0.1:{self.ports[8500]}"
        self.log = work / "container.log"
        if self.runner == "podman":
            published = [arg for inside, outside in self.ports.items() for arg in ("-p", f"127.0.0.1:{outside}:{inside}")]
            mounted = [arg for inside, host in volumes.items() for arg in ("-v", f"{host}:{inside}")]
            given = [arg for item in env.items() for arg in ("-e", "=".join(item))]
            command = ["podman", "run", "--rm", "--name", self.name, *published, *mounted, *given, image]
        else:
            moved = {} if tfserving else {"FORKSERVE_BIND": f"0.0.0.0:{self.ports[8000]}", "FORKSERVE_GRPC_BIND": f"0.0.0.0:{self.ports[8500]}"}
            command = self._chroot_command(volumes, {**env, **moved})
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def _chroot_command(self, volumes: dict[str, Path], env: dict[str, str]) -> list[str]:
        self.root.mkdir()
        created = subprocess.run(["podman", "create", self.image], capture_output=True, text=True, check=True).stdout.strip()
        exported = subprocess.Popen(["podman", "export", created], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-C", str(self.root), "-x"], stdin=exported.stdout, check=True)
        exported.wait()
        subprocess.run(["podman", "rm", created], capture_output=True, check=True)
        environment = [*inspect(self.image, "Env"), *("=".join(item) for item in env.items())]
        user, workdir = inspect(self.image, "User"), inspect(self.image, "WorkingDir")
        command = (inspect(self.image, "Entrypoint") or []) + (inspect(self.image, "Cmd") or [])
        mounts = [f"mkdir -p {self.root}{inside} && mount --bind {host} {self.root}{inside}" for inside, host in sorted(volumes.items())]
        start = " && ".join([*mounts, f"mount -t proc proc {self.root}/proc",
                             f"mount -t tmpfs tmpfs {self.root}/run/forkserve && chown {user} {self.root}/run/forkserve",
                             f"cd {self.root}{workdir}",
                             f"exec chroot --userspec={user}:{user} {self.root} env -i {shlex.join(environment)}"
                             f" sh -c {shlex.quote(f'cd {workdir} && exec {shlex.join(command)}')}"])
        return ["unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", start]

    def pid(self) -> int:
        """PID 1 of the container, as the host sees it."""
        if self.runner == "podman":
            return int(subprocess.run(["podman", "inspect", self.name, "--format", "{{.State.Pid}}"],
                                      capture_output=True, text=True, check=True).stdout)
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return int(children[0])

    def healthcheck(self) -> int:
        """Run the image's HEALTHCHECK command in the container; its exit status."""
        if self.runner == "podman":
            return subprocess.run(["podman", "healthcheck", "run", self.name], capture_output=True).returncode
        test = inspect(self.image, "Healthcheck")["Test"]
        assert test[0] == "CMD"
        ports = {str(inside): str(outside) for inside, outside in self.ports.items()}
        path = next(v for v in inspect(self.image, "Env") if v.startswith("PATH="))
        command = [ports.get(arg, arg) for arg in test[1:]]
        return subprocess.run(["nsenter", "-t", str(self.pid()), "-m", "-p", "chroot", "--userspec=10001:10001",
                               str(self.root), "env", "-i", path, *command]).returncode

    def terminate(self) -> None:
        """SIGTERM to the container's PID 1, as `podman stop` and the kubelet send it."""
        if self.runner == "podman":
            subprocess.run(["podman", "kill", "--signal", "TERM", self.name], check=True, capture_output=True)
        else:
            os.kill(self.pid(), signal.SIGTERM)

    def answers(self, path: str) -> bool:
        """Whether `path` answers 200 on the REST port (the container still running)."""
        assert self.process.poll() is None, self.log.read_text()[-3000:]
        try:
            return requests.get(f"{self.url}{path}", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def ready(self) -> bool:
        return self.answers("/readyz")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.terminate()
            self.process.wait(60)
