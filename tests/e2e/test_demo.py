"""The README's demo: `gunicorn -c gunicorn.conf.py` over the bundled models/ and conf/ answers the example."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from tests.support.harness import ROOT, Server, wait_until


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The bundled repository with the bundled conf, one worker."""
    instance = Server(
        models_dir=ROOT / "models", run_dir=tmp_path_factory.mktemp("demo"), conf_path=ROOT / "conf" / "models.toml", workers=1
    ).start()
    yield instance
    instance.stop()


def test_demo_is_ready_and_answers_the_readme_request(demo: Server) -> None:
    ready = demo.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["models"]["digits"]["serving"] == [2, 1]
    result = subprocess.run(
        ["bash", str(ROOT / "examples" / "predict_digit.sh")],
        env={"FORKSERVE_URL": demo.url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    handled, plain = (json.loads(line) for line in result.stdout.splitlines() if line.strip())
    assert handled["digit"] == 3 and handled["probability"] > 0.99
    predictions = plain["predictions"][0]
    assert max(range(10), key=lambda i: predictions[i]) == 3


ANSWER = r"digit (?P<digit>\d) probability (?P<probability>[0-9.]+) \(version (?P<version>\d+)\)"


def test_the_grpc_example_answers_over_tf_serving_s_client(demo: Server) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "predict_digit_grpc.py"), "--target", demo.grpc_target],
        capture_output=True, text=True, timeout=120, check=True,
    )
    answer = re.fullmatch(ANSWER, result.stdout.strip())
    assert answer and answer["digit"] == "3" and answer["version"] == "1", result.stdout
    # The README's line is the same answer; the last digits of a float may differ by CPU, so compare numbers.
    quoted = next(re.fullmatch(ANSWER, line) for line in (ROOT / "README.md").read_text().splitlines()
                  if re.fullmatch(ANSWER, line))
    assert (quoted["digit"], quoted["version"]) == ("3", "1")
    assert np.isclose(float(quoted["probability"]), float(answer["probability"]), atol=1e-6)
    # ... and the same probability REST gives for the same image and version.
    b64 = base64.b64encode((ROOT / "examples" / "digit.png").read_bytes()).decode()
    rest = demo.post("/v1/models/digits/versions/1:predict", json={"instances": [{"b64": b64}]}).json()
    assert np.isclose(rest["predictions"][0][3], float(answer["probability"]), atol=1e-6)


def test_readme_shows_the_real_answers(demo: Server) -> None:
    b64 = base64.b64encode((ROOT / "examples" / "digit.png").read_bytes()).decode()
    handled = demo.post("/v1/models/digits:predict", json={"image": b64})
    plain = demo.post("/v1/models/digits/versions/1:predict", json={"instances": [{"b64": b64}]})
    assert handled.headers["X-Model-Version"] == "2" and plain.headers["X-Model-Version"] == "1"
    readme = (ROOT / "README.md").read_text().splitlines()
    # The README quotes each answer in the first line that starts like it; they must be these.
    quoted_handled = json.loads(next(line for line in readme if line.startswith('{"digit"')))
    quoted_plain = json.loads(next(line for line in readme if line.startswith('{"predictions"')))
    assert quoted_handled["digit"] == handled.json()["digit"]
    assert np.isclose(quoted_handled["probability"], handled.json()["probability"], atol=1e-6)
    assert np.allclose(quoted_plain["predictions"], plain.json()["predictions"], atol=1e-6)


def test_sigterm_stops_the_server_gracefully(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    instance = Server(models_dir=tmp_path / "empty", run_dir=tmp_path / "run", workers=1).start(timeout=60)
    assert instance.get("/readyz").status_code == 200
    assert instance.stop() == 0
    wait_until(lambda: instance.process is not None and instance.process.poll() is not None, 10, "master exit")
    # The master removed everything it made in the run directory; only the test's own log is left.
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["gunicorn.log"]
