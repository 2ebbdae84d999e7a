"""Triton's statistics and model configuration extensions against the shared 2-worker server, with tritonclient unmodified.

NOTE: this process imports tritonclient's `inference.*` messages, so it never imports server.protocols.v2.protos.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import numpy as np
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_http_aio
from prometheus_client.mmap_dict import MmapedDict

from tests.support.harness import Server, wait_until

MODEL, VERSION = "mlp", "1"


def stats(server: Server, version: str = VERSION) -> dict[str, Any]:
    """The version's statistics over REST."""
    answer = server.get(f"/v2/models/{MODEL}/versions/{version}/stats")
    assert answer.status_code == 200, answer.text
    (found,) = answer.json()["model_stats"]
    return found


def quiet_stats(server: Server) -> dict[str, Any]:
    """The version's statistics once nothing is left in a worker's buffer: two reads a flush interval apart agree.

    NOTE: a worker writes its metric updates every 0.5 s (server.telemetry.buffer): read at once after
    another module's requests, a count may still grow by them.
    """
    last: dict[str, Any] = {}

    def steady() -> dict[str, Any] | None:
        nonlocal last
        now, before = stats(server), last
        last = now
        return now if now == before else None

    return wait_until(steady, 15, "the statistics to stop changing", interval=0.6)


def requests_per_worker(server: Server) -> dict[int, float]:
    """pid -> the model version's requests counted in that worker's own metric file."""
    counted = {}
    for pid in server.worker_pids():
        path = server.run_dir / "metrics" / f"counter_{pid}.db"
        values = MmapedDict.read_all_values_from_file(str(path)) if path.exists() else []
        counted[pid] = sum(value for key, value, _, _ in values
                           if json.loads(key)[1] == "forkserve_requests_total"
                           and json.loads(key)[2].get("model") == MODEL and json.loads(key)[2].get("version") == VERSION)
    return counted


def mlp_input(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).uniform(0, 1, (rows, 4)).astype(np.float32)


def test_statistics_count_every_request_on_both_workers_and_both_transports(server: Server, restores_workers: None) -> None:
    """Half the REST requests while one worker is stopped, half while the other is: each worker answers some."""
    metadata = server.get(f"/v2/models/{MODEL}").json()
    name, width = metadata["inputs"][0]["name"], metadata["inputs"][0]["shape"][1]
    before, per_worker = quiet_stats(server), requests_per_worker(server)
    sent = 0
    for stopped in server.worker_pids():
        os.kill(stopped, signal.SIGSTOP)  # NOTE: new connections queue on the shared socket; the other worker takes them
        try:
            for rows in (1, 2, 3) * 5:
                body = {"inputs": [{"name": name, "datatype": "FP32", "shape": [rows, width], "data": [0.5] * rows * width}]}
                answer = requests.post(f"{server.url}/v2/models/{MODEL}/versions/{VERSION}/infer", json=body, timeout=30)
                assert answer.ok, answer.text
                sent += 1
        finally:
            os.kill(stopped, signal.SIGCONT)
    with triton_grpc.InferenceServerClient(server.grpc_target) as client:
        tensor = triton_grpc.InferInput(name, [2, width], "FP32")
        tensor.set_data_from_numpy(np.full((2, width), 0.25, np.float32))
        for _ in range(30):
            client.infer(MODEL, [tensor], model_version=VERSION)
            sent += 1
    bad = requests.post(f"{server.url}/v2/models/{MODEL}/versions/{VERSION}/infer", timeout=30,
                        json={"inputs": [{"name": name, "datatype": "FP32",
                                          "shape": [1, width + 1], "data": [0.5] * (width + 1)}]})
    assert bad.status_code == 400

    def settled() -> dict[str, Any] | None:
        after = stats(server)
        done = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] >= sent
        return after if done and after["inference_stats"]["fail"]["count"] > before["inference_stats"]["fail"]["count"] else None

    wait_until(settled, 10, f"the statistics to count {sent} requests")
    after = quiet_stats(server)
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == sent
    grown = {pid: count - per_worker.get(pid, 0) for pid, count in requests_per_worker(server).items()}
    assert len(grown) == 2 and all(count > 0 for count in grown.values()), f"one worker got no traffic: {grown}"
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1
    for kind in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert after["inference_stats"][kind]["ns"] > before["inference_stats"][kind]["ns"], kind
    assert after["inference_count"] - before["inference_count"] == 10 * (1 + 2 + 3) + 30 * 2
    assert after["execution_count"] > before["execution_count"]
    assert after["last_inference"] > before["last_inference"]
    assert {2} <= {batch["batch_size"] for batch in after["batch_stats"]}


def test_every_client_reads_the_same_statistics(server: Server) -> None:
    """tritonclient http and grpc, sync and asyncio; one model, one version, every model; a model not served is 404."""
    http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    with triton_grpc.InferenceServerClient(server.grpc_target) as grpc_client:
        rest = http.get_inference_statistics(MODEL, VERSION)["model_stats"][0]
        over_grpc = grpc_client.get_inference_statistics(MODEL, VERSION, as_json=True)["model_stats"][0]
        assert (over_grpc["name"], over_grpc["version"]) == (MODEL, VERSION)
        assert int(over_grpc["inference_stats"]["success"]["count"]) == rest["inference_stats"]["success"]["count"]
        every = grpc_client.get_inference_statistics(as_json=True)["model_stats"]
        assert {(MODEL, VERSION), ("half_plus_two", "123")} <= {(s["name"], s["version"]) for s in every}
    assert server.get("/v2/models/nope/stats").status_code == 404
    assert server.get(f"/v2/models/{MODEL}/versions/x/stats").status_code == 400

    async def both() -> tuple[dict, dict]:
        aio_http = triton_http_aio.InferenceServerClient(server.url.removeprefix("http://"))
        aio_grpc = triton_grpc_aio.InferenceServerClient(server.grpc_target)
        try:
            return (await aio_http.get_inference_statistics(MODEL), await aio_grpc.get_inference_statistics(MODEL, as_json=True))
        finally:
            await aio_http.close()
            await aio_grpc.close()

    aio_rest, aio_grpc = asyncio.run(both())
    assert [s["version"] for s in aio_rest["model_stats"]] == [s["version"] for s in aio_grpc["model_stats"]]


def test_model_config_in_triton_s_shape_on_both_transports(server: Server) -> None:
    metadata = server.get(f"/v2/models/{MODEL}").json()
    config = triton_http.InferenceServerClient(server.url.removeprefix("http://")).get_model_config(MODEL)
    assert config["name"] == MODEL and config["max_batch_size"] == 64 and config["backend"] == "tensorflow"
    assert [(t["name"], t["data_type"], [-1] + t["dims"]) for t in config["input"]] == [
        (t["name"], "TYPE_" + t["datatype"], t["shape"]) for t in metadata["inputs"]]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    with triton_grpc.InferenceServerClient(server.grpc_target) as client:
        over_grpc = client.get_model_config(MODEL, as_json=True)["config"]
        assert [int(d) for d in over_grpc["input"][0]["dims"]] == config["input"][0]["dims"]
        assert over_grpc["max_batch_size"] == 64 and over_grpc["version_policy"] == config["version_policy"]
        assert client.get_model_config("half_plus_two", "123").config.platform == "tensorflow_savedmodel"
    assert server.get("/v2/models/nope/config").status_code == 404
    assert server.get(f"/v2/models/{MODEL}/versions/7/config").status_code == 404


def test_server_metadata_lists_the_extensions_each_transport_has(server: Server) -> None:
    rest = server.get("/v2").json()["extensions"]
    with triton_grpc.InferenceServerClient(server.grpc_target) as client:
        over_grpc = client.get_server_metadata(as_json=True)["extensions"]
    assert {"model_configuration", "statistics"} <= set(over_grpc) and "binary_tensor_data" not in over_grpc
    assert set(rest) == set(over_grpc) | {"binary_tensor_data"}


def test_each_worker_answers_the_statistics_of_all(server: Server, restores_workers: None) -> None:
    """The same numbers whichever worker reads them (the other one stopped while it does)."""
    seen = []
    for stopped in server.worker_pids():
        os.kill(stopped, signal.SIGSTOP)
        try:
            seen.append(stats(server)["inference_stats"]["success"]["count"])
        finally:
            os.kill(stopped, signal.SIGCONT)
    assert len(seen) == 2 and seen[0] == seen[1]
