"""docs/from-flask.md, done for real: the wine example's client gets the same answers from the Flask app and from forkserve."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import pytest
import requests

from tests.support.harness import GUNICORN, ROOT, Server, free_port, wait_until
from tests.support.nginx import Nginx

WINE = ROOT / "examples" / "wine"
SAMPLES = [json.loads((WINE / "sample.json").read_text()),
           {**json.loads((WINE / "sample.json").read_text()), "flavanoids": 0.6, "color_intensity": 7.5, "hue": 0.6},
           {**json.loads((WINE / "sample.json").read_text()), "proline": 480.0, "color_intensity": 2.9, "alcohol": 12.2}]


def client(url: str, sample: dict) -> tuple[str, float]:
    """examples/wine/client.py, run as the team runs it, on one sample."""
    sys.path.insert(0, str(WINE))
    try:
        from client import classify
    finally:
        sys.path.remove(str(WINE))
    return classify(url, sample)


@pytest.fixture(scope="module")
def flask_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The "before": examples/wine/flask_app.py on gunicorn, as its docstring runs it."""
    port, log = free_port(), tmp_path_factory.mktemp("flask") / "flask.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([str(GUNICORN), "--chdir", str(WINE), "-b", f"127.0.0.1:{port}", "flask_app:app"],
                                   cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/predict"

    def up() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            return requests.post(url, json={}, timeout=5).status_code == 400
        except (requests.ConnectionError, requests.Timeout):  # the worker is still importing Keras
            return False

    wait_until(up, 120, "the Flask app")
    yield url
    process.terminate()
    process.wait(30)


@pytest.fixture(scope="module")
def forkserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The "after": handler = true, examples/wine/version published with the CLI and served."""
    repo, run_dir = tmp_path_factory.mktemp("wine-models"), tmp_path_factory.mktemp("wine-run")
    conf = run_dir / "models.toml"
    conf.write_text("[models.wine]\nhandler = true\n")  # first: publish checks the version with these settings
    published = subprocess.run([sys.executable, "-m", "server", "publish", "wine", str(WINE / "version"), "--models", str(repo),
                                "--conf", str(conf)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert published.returncode == 0 and published.stdout.strip() == "1", published.stderr
    server = Server(models_dir=repo, run_dir=run_dir, conf_path=conf, workers=1).start()
    yield f"{server.url}/v1/models/wine:predict"
    server.stop()


def test_the_same_client_gets_the_same_answers_before_and_after(flask_app: str, forkserve: str) -> None:
    before = [client(flask_app, sample) for sample in SAMPLES]
    after = [client(forkserve, sample) for sample in SAMPLES]
    assert len({label for label, _ in before}) >= 2  # the samples are not all one class
    assert [label for label, _ in after] == [label for label, _ in before]
    assert [score for _, score in after] == pytest.approx([score for _, score in before], abs=1e-5)


def test_the_client_script_prints_the_answer(forkserve: str) -> None:
    printed = subprocess.run([sys.executable, str(WINE / "client.py"), forkserve], capture_output=True, text=True, timeout=60)
    label, score = client(forkserve, SAMPLES[0])
    assert printed.returncode == 0 and printed.stdout == f"{label} {score:.4f}\n"


def test_a_missing_measurement_is_the_same_400_before_and_after(flask_app: str, forkserve: str) -> None:
    partial = {name: value for name, value in SAMPLES[0].items() if name != "hue"}
    answers = [requests.post(url, json=partial, timeout=30) for url in (flask_app, forkserve)]
    assert [a.status_code for a in answers] == [400, 400]
    assert answers[0].json() == answers[1].json() == {"error": "missing measurements: hue"}


def test_old_clients_keep_their_url_through_the_documented_nginx_rewrite(flask_app: str, forkserve: str, tmp_path: Path) -> None:
    """The `location = /predict` of docs/from-flask.md in the shipped nginx.conf: the same answers and 400s at /predict."""
    (snippet,) = re.findall(r"```nginx\n(.*?)```", (ROOT / "docs" / "from-flask.md").read_text(), re.S)
    nginx = Nginx(tmp_path / "nginx", [urlsplit(forkserve).port], locations=snippet)
    try:
        old_url = f"{nginx.url}/predict"
        before = [client(flask_app, sample) for sample in SAMPLES]
        after = [client(old_url, sample) for sample in SAMPLES]
        assert [label for label, _ in after] == [label for label, _ in before]
        assert [score for _, score in after] == pytest.approx([score for _, score in before], abs=1e-5)
        partial = {name: value for name, value in SAMPLES[0].items() if name != "hue"}
        refused = requests.post(old_url, json=partial, timeout=30)
        assert refused.status_code == 400 and refused.json() == {"error": "missing measurements: hue"}
        assert requests.get(old_url, timeout=30).status_code == 405
        assert '"POST /predict HTTP/1.1" 200' in nginx.access_log()
    finally:
        nginx.stop()
