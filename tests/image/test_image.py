"""The container image, built and run with podman: the demo answers, a published version is served, SIGTERM drains.

`make image-test` runs this (FORKSERVE_IMAGE_TEST=1): a bookworm base from Debian's packages
(scripts/make-base-image.sh), then `podman build` of the Dockerfile.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests

from tests.e2e.harness import ROOT, free_port, wait_until
from tests.e2e.traffic import Traffic

IMAGE = "localhost/forkserve:test"
BASE = "localhost/forkserve-base:bookworm"


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed (apt-get install podman debootstrap)")
    subprocess.run([str(ROOT / "scripts" / "make-base-image.sh")], check=True, timeout=1200)
    started = time.monotonic()
    subprocess.run(["podman", "build", "--network", "host", "--build-arg", f"BASE={BASE}", "-t", IMAGE, "."],
                   cwd=ROOT, check=True, timeout=2400)
    print(f"image built in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return IMAGE


class Container:
    """`podman run` of the image with a host directory as /models."""

    def __init__(self, image: str, models: Path, log: Path) -> None:
        self.port = free_port()
        self.name = f"forkserve-test-{self.port}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                ["podman", "run", "--rm", "--name", self.name, "-p", f"127.0.0.1:{self.port}:8000",
                 "-v", f"{models}:/models", "-e", "FORKSERVE_POLL_INTERVAL=0.5", image],
                stdout=out, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-3000:]
        try:
            return requests.get(f"{self.url}/readyz", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            subprocess.run(["podman", "stop", "-t", "5", self.name], capture_output=True)
            self.process.wait(60)


@pytest.fixture(scope="module")
def container(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    work = tmp_path_factory.mktemp("image")
    models = work / "models"
    shutil.copytree(ROOT / "models", models)
    models.chmod(0o777)  # the image's user (10001) takes the publish lock; the host publishes as root
    (models / "digits").chmod(0o777)
    started = time.monotonic()
    running = Container(image, models, work / "container.log")
    wait_until(running.ready, 300, "the container's /readyz")
    print(f"ready {time.monotonic() - started:.1f} s after podman run", file=sys.stderr)
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
    inside = subprocess.run(["podman", "exec", container.name, "id", "-u"], capture_output=True, text=True)
    assert inside.stdout.strip() == "10001"  # not root
    health = subprocess.run(["podman", "healthcheck", "run", container.name], capture_output=True, text=True)
    assert health.returncode == 0, health.stdout + health.stderr


def test_a_version_published_into_the_mounted_repository_is_served(container: Container) -> None:
    published = subprocess.run([sys.executable, "-m", "server", "publish", "digits",
                                str(ROOT / "models" / "digits" / "1" / "model.keras"), "--models", str(container.models)],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert published.returncode == 0 and published.stdout.strip() == "3", published.stderr

    def served() -> bool:
        status = requests.get(f"{container.url}/v1/models/digits/versions/3", timeout=5)
        return status.ok and status.json()["model_version_status"][0]["state"] == "AVAILABLE"

    wait_until(served, 180, "digits version 3 served by the container")
    image = base64.b64encode((ROOT / "examples" / "digit.png").read_bytes()).decode()
    answer = requests.post(f"{container.url}/v1/models/digits/versions/3:predict", json={"instances": [{"b64": image}]}, timeout=30)
    assert answer.status_code == 200 and answer.headers["X-Model-Version"] == "3"


def test_sigterm_under_traffic_drains_and_exits_zero(container: Container) -> None:
    image = base64.b64encode((ROOT / "examples" / "digit.png").read_bytes()).decode()
    traffic = Traffic(f"{container.url}/v1/models/digits/versions/1:predict", body={"instances": [{"b64": image}]})
    traffic.start(4)
    wait_until(lambda: len(traffic.answers) > 100, 60, "traffic")
    sent_at = time.monotonic()
    subprocess.run(["podman", "kill", "--signal", "TERM", container.name], check=True, capture_output=True)
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
