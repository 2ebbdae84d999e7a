"""The container image run natively, built and run with podman: the demo answers, a published version is served, SIGTERM drains.

`make image-test` runs this (FORKSERVE_IMAGE_TEST=1): a bookworm base from Debian's packages
(scripts/make-base-image.sh), then `podman build` of the Dockerfile.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests

from tests.image.container import Container
from tests.support.harness import ROOT, wait_until
from tests.support.traffic import Traffic


def demo_request(url: str) -> None:
    """The README's demo request: the answer it quotes."""
    image = base64.b64encode((ROOT / "examples" / "digit.png").read_bytes()).decode()
    answer = requests.post(f"{url}/v1/models/digits:predict", json={"image": image}, timeout=30)
    readme = (ROOT / "README.md").read_text().splitlines()
    quoted = json.loads(next(line for line in readme if line.startswith('{"digit"')))
    assert answer.status_code == 200 and answer.json()["digit"] == quoted["digit"]
    assert abs(answer.json()["probability"] - quoted["probability"]) < 1e-6


def runs_as_the_image_s_user(container: Container) -> None:
    status = Path(f"/proc/{container.pid()}/status").read_text()
    assert re.search(r"^Uid:\s+10001\s", status, re.M), status  # not root


def test_with_nothing_mounted_the_image_serves_its_demo(image: str, tmp_path: Path) -> None:
    bare = Container(image, tmp_path, volumes={}, env={})
    try:
        wait_until(bare.ready, 300, "the container's /readyz")
        demo_request(bare.url)
        runs_as_the_image_s_user(bare)
        assert bare.healthcheck() == 0
        assert "serving the demo models in /opt/forkserve/demo-models" in bare.log.read_text()
    finally:
        bare.stop()


def test_an_empty_volume_at_models_is_served_not_the_demo(image: str, tmp_path: Path) -> None:
    """A fresh repository that a publish job fills later: the entrypoint tells a mount from the image's empty /models."""
    empty = tmp_path / "models"
    empty.mkdir()
    mounted = Container(image, tmp_path, volumes={"/models": empty}, env={})
    try:
        wait_until(lambda: mounted.answers("/healthz"), 300, "the container's /healthz")  # no model: never ready
        assert "serving the model repository in /models" in mounted.log.read_text()
        assert requests.get(f"{mounted.url}/v1/models/digits", timeout=30).status_code == 404
    finally:
        mounted.stop()


@pytest.fixture(scope="module")
def container(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    """The image over a host directory at /models: a copy of the repository's models."""
    work = tmp_path_factory.mktemp("image")
    models = work / "models"
    shutil.copytree(ROOT / "models", models)
    models.chmod(0o777)  # the image's user (10001) takes the publish lock; the host publishes as root
    (models / "digits").chmod(0o777)
    started = time.monotonic()
    running = Container(image, work, volumes={"/models": models}, env={"FORKSERVE_POLL_INTERVAL": "0.5"})
    wait_until(running.ready, 300, "the container's /readyz")
    print(f"ready {time.monotonic() - started:.1f} s after the start ({running.runner})", file=sys.stderr)
    running.models = models
    yield running
    running.stop()


def test_a_mounted_repository_is_served_natively(container: Container) -> None:
    demo_request(container.url)  # the repository's own copy of the demo
    assert "serving the model repository in /models" in container.log.read_text()
    runs_as_the_image_s_user(container)
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
