"""The container image, built and run with podman: the demo answers, a published version is served, SIGTERM drains.

`make image-test` runs this (FORKSERVE_IMAGE_TEST=1): a bookworm base from Debian's packages
(scripts/make-base-image.sh), then `podman build` of the Dockerfile.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests

from tests.support.harness import ROOT, free_port, wait_until
from tests.support.traffic import Traffic

IMAGE = "localhost/forkserve:test"
BASE = "localhost/forkserve-base:bookworm"


@pytest.fixture(scope="module")
def image() -> str:
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
    """The image run with a host directory as /models, by podman, or (FORKSERVE_IMAGE_RUNNER=chroot) by hand.

    NOTE: the chroot runner exists for sandboxes whose kernel refuses the rlimits every OCI runtime
    sets (crun/runc: "setrlimit RLIMIT_NPROC: Operation not permitted"). It runs the image's own
    file system, environment, user and command, as PID 1 of a new PID namespace, on the host's
    network: everything the image decides, without podman's runtime.
    """

    def __init__(self, image: str, models: Path, work: Path) -> None:
        self.port = free_port()
        self.name = f"forkserve-test-{self.port}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = work / "container.log"
        self.runner = os.environ.get("FORKSERVE_IMAGE_RUNNER", "podman")
        with open(self.log, "wb") as out:
            if self.runner == "podman":
                command = ["podman", "run", "--rm", "--name", self.name, "-p", f"127.0.0.1:{self.port}:8000",
                           "-v", f"{models}:/models", "-e", "FORKSERVE_POLL_INTERVAL=0.5", image]
            else:
                command = self._chroot_command(image, models, work)
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def _chroot_command(self, image: str, models: Path, work: Path) -> list[str]:
        self.root = work / "rootfs"
        self.root.mkdir()
        created = subprocess.run(["podman", "create", image], capture_output=True, text=True, check=True).stdout.strip()
        exported = subprocess.Popen(["podman", "export", created], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-C", str(self.root), "-x"], stdin=exported.stdout, check=True)
        exported.wait()
        subprocess.run(["podman", "rm", created], capture_output=True, check=True)
        env = [*inspect(image, "Env"), f"FORKSERVE_BIND=0.0.0.0:{self.port}", "FORKSERVE_POLL_INTERVAL=0.5"]
        user, workdir, cmd = inspect(image, "User"), inspect(image, "WorkingDir"), inspect(image, "Cmd")
        start = (f"mount --bind {models} {self.root}/models && mount -t proc proc {self.root}/proc"
                 f" && mount -t tmpfs tmpfs {self.root}/run/forkserve && chown {user} {self.root}/run/forkserve"
                 f" && cd {self.root}{workdir} && exec chroot --userspec={user}:{user} {self.root}"
                 f" env -i {' '.join(env)} sh -c 'cd {workdir} && exec {' '.join(cmd)}'")
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
        test = inspect(IMAGE, "Healthcheck")["Test"]
        assert test[0] == "CMD"
        command = [arg.replace("127.0.0.1:8000", f"127.0.0.1:{self.port}") for arg in test[1:]]
        return subprocess.run(["nsenter", "-t", str(self.pid()), "-m", "-p", "chroot", "--userspec=10001:10001",
                               str(self.root), "/opt/forkserve/venv/bin/python3", *command[1:]]).returncode

    def terminate(self) -> None:
        """SIGTERM to the container's PID 1, as `podman stop` and the kubelet send it."""
        if self.runner == "podman":
            subprocess.run(["podman", "kill", "--signal", "TERM", self.name], check=True, capture_output=True)
        else:
            os.kill(self.pid(), signal.SIGTERM)

    def ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-3000:]
        try:
            return requests.get(f"{self.url}/readyz", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.terminate()
            self.process.wait(60)


@pytest.fixture(scope="module")
def container(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    work = tmp_path_factory.mktemp("image")
    models = work / "models"
    shutil.copytree(ROOT / "models", models)
    models.chmod(0o777)  # the image's user (10001) takes the publish lock; the host publishes as root
    (models / "digits").chmod(0o777)
    started = time.monotonic()
    running = Container(image, models, work)
    wait_until(running.ready, 300, "the container's /readyz")
    print(f"ready {time.monotonic() - started:.1f} s after the start ({running.runner})", file=sys.stderr)
    running.models = models
    yield running
    running.stop()


def test_the_image_answers_the_readme_s_demo_request(container: Container) -> None:
    image = base64.b64encode((ROOT / "examples" / "digit.png").read_bytes()).decode()
    answer = requests.post(f"{container.url}/v1/models/digits:predict", json={"image": image}, timeout=30)
    readme = (ROOT / "README.md").read_text().splitlines()
    quoted = json.loads(next(line for line in readme if line.startswith('{"digit"')))
    assert answer.status_code == 200 and answer.json()["digit"] == quoted["digit"]
    assert abs(answer.json()["probability"] - quoted["probability"]) < 1e-6
    status = Path(f"/proc/{container.pid()}/status").read_text()
    assert re.search(r"^Uid:\s+10001\s", status, re.M), status  # not root
    assert container.healthcheck() == 0


def test_a_version_published_into_the_mounted_repository_is_served(container: Container) -> None:
    # The plain model over version 2's handler: its clients would change, which publish must be told.
    published = subprocess.run([sys.executable, "-m", "server", "publish", "digits", "--change-request-shape",
                                str(ROOT / "models" / "digits" / "1" / "model.keras"), "--models", str(container.models)],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert published.returncode == 0 and published.stdout.strip() == "3", published.stderr

    image = base64.b64encode((ROOT / "examples" / "digit.png").read_bytes()).decode()

    def served_by_every_worker() -> bool:  # fresh connections land on either worker
        answers = [requests.post(f"{container.url}/v1/models/digits/versions/3:predict", json={"instances": [{"b64": image}]},
                                 headers={"Connection": "close"}, timeout=30) for _ in range(8)]
        return all(a.status_code == 200 for a in answers)

    wait_until(served_by_every_worker, 180, "digits version 3 served by every worker of the container")
    answer = requests.post(f"{container.url}/v1/models/digits/versions/3:predict", json={"instances": [{"b64": image}]}, timeout=30)
    assert answer.status_code == 200 and answer.headers["X-Model-Version"] == "3"


def test_sigterm_under_traffic_drains_and_exits_zero(container: Container) -> None:
    image = base64.b64encode((ROOT / "examples" / "digit.png").read_bytes()).decode()
    traffic = Traffic(f"{container.url}/v1/models/digits/versions/1:predict", body={"instances": [{"b64": image}]})
    traffic.start(4)
    wait_until(lambda: len(traffic.answers) > 100, 60, "traffic")
    sent_at = time.monotonic()
    container.terminate()
    code = container.process.wait(60)
    stopped_in = time.monotonic() - sent_at
    traffic.finish()
    assert code == 0, container.log.read_text()[-3000:]
    assert stopped_in < 45  # the Deployment's terminationGracePeriodSeconds
    # Every request sent before SIGTERM was answered (in flight ones included); after it, a new
    # connection may be refused, but nothing gets an error status or half an answer.
    before = [a for a in traffic.answers if a[0] < sent_at]
    assert before and all(a[1] == 200 for a in before), [a for a in before if a[1] != 200][:3]
    assert all(a[1] in (200, 0) for a in traffic.answers), [a for a in traffic.answers if a[1] not in (200, 0)][:3]
    print(f"SIGTERM to exit 0 in {stopped_in:.1f} s; {len(traffic.answers)} requests, "
          f"{sum(a[1] == 200 for a in traffic.answers)} answered", file=sys.stderr)
