"""32 concurrent clients across 2 workers get exactly the answers of the model run in-process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import requests

from tests.support.harness import Server

CLIENTS = 32
REQUESTS_PER_CLIENT = 8


def test_concurrent_mixed_batches_match_in_process_model(server: Server, keras_models: dict) -> None:
    rng = np.random.default_rng(11)
    batches = [rng.normal(size=(int(rng.integers(1, 9)), 20)).astype(np.float32) for _ in range(CLIENTS)]
    expected = [keras_models["mlp"](x, training=False).numpy() for x in batches]

    def client(index: int) -> list[np.ndarray]:
        session = requests.Session()
        answers = []
        for _ in range(REQUESTS_PER_CLIENT):
            response = session.post(
                f"{server.url}/v1/models/mlp:predict", json={"instances": batches[index].tolist()}, timeout=60
            )
            assert response.status_code == 200, response.text
            answers.append(np.array(response.json()["predictions"], dtype=np.float32))
        return answers

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(client, range(CLIENTS)))
    for index, answers in enumerate(results):
        for answer in answers:
            np.testing.assert_allclose(answer, expected[index], atol=1e-5)

