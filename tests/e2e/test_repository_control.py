"""Triton's model repository extension against a real 2-worker server in explicit mode, with tritonclient unmodified.

Loads and unloads go through the master's readiness-gated rollout (two worker starts each): this
module makes three of them. NOTE: this process imports tritonclient's `inference.*` messages, so it
never imports server.protocols.v2.protos.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_http_aio
from tritonclient.utils import InferenceServerException

from tests.support.grpc_traffic import GrpcTraffic, loopback_clients
from tests.support.harness import Server, free_port, wait_until
from tests.support.models import copy_models
from tests.support.traffic import Traffic

LOADED, OTHER = "mlp", "half_plus_two"


@pytest.fixture(scope="module")
def explicit(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Explicit model control over mlp, half_plus_two and k3cnn, with mlp loaded at start."""
    run_dir = tmp_path_factory.mktemp("explicit-run")
    repo = copy_models(model_repo, tmp_path_factory.mktemp("explicit-models"), LOADED, OTHER, "k3cnn")
    port = free_port()  # NOTE: on every loopback address: each gRPC traffic client connects from its own (loopback_clients)
    instance = Server(models_dir=repo, run_dir=run_dir, workers=2, grpc_port=port,
                      env={"FORKSERVE_MODEL_CONTROL": "explicit", "FORKSERVE_LOAD_MODELS": LOADED,
                           "FORKSERVE_GRPC_BIND": f"0.0.0.0:{port}"}).start()
    yield instance
    instance.stop()


def http_client(server: Server) -> triton_http.InferenceServerClient:
    return triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=120)


def half_plus_two(client: triton_http.InferenceServerClient | triton_grpc.InferenceServerClient) -> np.ndarray:
    """half_plus_two's answer for 1, 2, 5 through either client library."""
    library = triton_http if isinstance(client, triton_http.InferenceServerClient) else triton_grpc
    x = np.array([[1.0], [2.0], [5.0]], dtype=np.float32)
    tensor = library.InferInput("x", [3, 1], "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(OTHER, [tensor]).as_numpy("y")


def states(server: Server) -> dict[str, str]:
    """name -> state of the repository index (a served model's versions under one name)."""
    return {entry["name"]: entry.get("state", "") for entry in http_client(server).get_model_repository_index()}


def test_it_starts_live_and_ready_with_the_startup_list_only(explicit: Server) -> None:
    client = http_client(explicit)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(LOADED) and not client.is_model_ready(OTHER)
    assert states(explicit) == {LOADED: "READY", OTHER: "", "k3cnn": ""}
    assert "model_repository" in client.get_server_metadata()["extensions"]


def test_a_load_under_traffic_to_another_model_serves_on_every_worker_and_fails_no_request(explicit: Server) -> None:
    rest = Traffic(f"{explicit.url}/v1/models/{LOADED}:predict")
    grpc = GrpcTraffic(loopback_clients(explicit.grpc_port, 2))
    rest.start(4)
    grpc.start()
    try:
        http_client(explicit).load_model(OTHER)
        # at once, from any client, on either transport: every worker serves it now
        for _ in range(6):
            np.testing.assert_array_equal(half_plus_two(http_client(explicit)), [[2.5], [3.0], [4.5]])
        with triton_grpc.InferenceServerClient(explicit.grpc_target) as client:
            np.testing.assert_array_equal(half_plus_two(client), [[2.5], [3.0], [4.5]])
    finally:
        rest.finish()
        grpc.finish()
    assert rest.failures() == [] and grpc.failures() == []
    assert len(rest.answers) > 20 and len(grpc.answers) > 20
    wait_until(lambda: explicit.all_serve(OTHER, [123]), 30, "the caller's worker to finish leaving")
    index = http_client(explicit).get_model_repository_index()
    assert {"name": OTHER, "version": "123", "state": "READY", "reason": ""} in index


def test_loads_that_cannot_be_done_fail_with_why_and_change_nothing(explicit: Server) -> None:
    client = http_client(explicit)
    with pytest.raises(InferenceServerException) as missing:
        client.load_model("nope")
    assert missing.value.status() == "400" and "failed to load 'nope'" in missing.value.message()
    with triton_grpc.InferenceServerClient(explicit.grpc_target) as over_grpc:
        for config, why in (("{not json", "is not JSON"), ('{"instance_group": []}', "forkserve cannot set instance_group"),
                            ('{"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [2, 3]}}',
                             "allowed_batch_sizes must increase and end with max_batch_size")):
            with pytest.raises(InferenceServerException) as refused:
                over_grpc.load_model(OTHER, config=config)
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", config
            assert refused.value.message().startswith(f"failed to load '{OTHER}'") and why in refused.value.message()
    answer = requests.post(f"{explicit.url}/v2/repository/models/{OTHER}/load", timeout=30,
                           json={"parameters": {"file:1/model.savedmodel": "AAAA"}})
    assert answer.status_code == 400 and "model files come from the repository" in answer.json()["error"]
    assert states(explicit)[OTHER] == "READY" and client.get_model_config(OTHER)["max_batch_size"] == 64


def test_a_load_with_a_config_override_over_asyncio_grpc_applies_it(explicit: Server) -> None:
    async def load() -> dict:
        client = triton_grpc_aio.InferenceServerClient(explicit.grpc_target)
        try:
            override = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 500}}
            await client.load_model(OTHER, config=json.dumps(override))
            return (await client.get_model_config(OTHER, as_json=True))["config"]
        finally:
            await client.close()

    config = asyncio.run(load())
    assert config["max_batch_size"] == 8
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 500
    np.testing.assert_array_equal(half_plus_two(http_client(explicit)), [[2.5], [3.0], [4.5]])


def test_an_unload_takes_the_model_out_of_every_worker_at_once(explicit: Server) -> None:
    with triton_grpc.InferenceServerClient(explicit.grpc_target) as client:
        client.unload_model(OTHER)
        with pytest.raises(InferenceServerException) as gone:
            half_plus_two(client)
        assert gone.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException):
        half_plus_two(http_client(explicit))

    async def index() -> list[dict]:
        client = triton_http_aio.InferenceServerClient(explicit.url.removeprefix("http://"))
        try:
            return await client.get_model_repository_index()
        finally:
            await client.close()

    entries = {entry["name"]: entry for entry in asyncio.run(index())}
    assert entries[OTHER]["state"] == "UNAVAILABLE" and entries[OTHER]["reason"] == "unloaded"
    assert entries[LOADED]["state"] == "READY"
    log = explicit.log_path.read_text()  # type: ignore[union-attr]
    assert f"repository: unload of '{OTHER}' asked by ipv4:127.0.0.1" in log
    assert f"forkserve: unload of model '{OTHER}' (request" in log and f"unloaded '{OTHER}'" in log


def test_the_default_poll_mode_refuses_loads_and_unloads_saying_why(server: Server) -> None:
    client = http_client(server)
    for call in (lambda: client.load_model("mlp"), lambda: client.unload_model("mlp")):
        with pytest.raises(InferenceServerException) as refused:
            call()
        assert refused.value.status() == "400"
        assert "explicit model load / unload is not allowed: FORKSERVE_MODEL_CONTROL=poll" in refused.value.message()
    assert client.is_model_ready("mlp")
    assert {"name": "mlp", "version": "1", "state": "READY", "reason": ""} in client.get_model_repository_index()
