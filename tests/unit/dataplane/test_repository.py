"""The repository calls in a worker, without a master: refusals, the request written, each kind of answer, the wait's end."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Iterator

import pytest

from server import control
from server.config import ModelConfig
from server.dataplane import repository
from server.errors import ApiError, InvalidArgument
from server.models.flow import run_blocking
from server.models.registry import AVAILABLE, Model, ModelRegistry, ModelVersion
from server.repository import VersionSource
from server.rpc.calls import status_code
from server.settings import Settings


@pytest.fixture()
def explicit(tmp_path: Path) -> Settings:
    return dataclasses.replace(Settings.current(), run_dir=tmp_path, model_control="explicit", repository_timeout=5.0)


@pytest.fixture()
def stopped_accepting() -> Iterator[threading.Event]:
    """The worker-wide event a retiring worker sets, cleared around the test."""
    repository.STOPPED_ACCEPTING.clear()
    yield repository.STOPPED_ACCEPTING
    repository.STOPPED_ACCEPTING.clear()


def master_answers(run_dir: Path, ok: bool, message: str, retiring: bool = False) -> threading.Thread:
    """The master's side: wait for the request, answer it."""

    def answer() -> None:
        for _ in range(200):
            found = control.pending(run_dir)
            if found:
                control.answer(run_dir, found[0], ok, message, retiring)
                return
            threading.Event().wait(0.02)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def test_turned_off_every_call_is_forbidden_and_maps_to_permission_denied(explicit: Settings) -> None:
    off = dataclasses.replace(explicit, repository_api=False)
    registry = ModelRegistry(explicit.run_dir)
    with pytest.raises(repository.Forbidden) as caught:
        repository.repository_index(registry, off, False, "peer")
    assert caught.value.status == 403 and "FORKSERVE_REPOSITORY_API=0" in caught.value.message
    with pytest.raises(repository.Forbidden):
        run_blocking(repository.change(off, "load", "m", None, "peer"))
    assert status_code(caught.value).name == "PERMISSION_DENIED"
    assert not (explicit.run_dir / control.REQUESTS).exists()


def test_poll_mode_refuses_before_writing_anything(explicit: Settings) -> None:
    with pytest.raises(InvalidArgument, match="explicit model load / unload is not allowed: FORKSERVE_MODEL_CONTROL=poll"):
        run_blocking(repository.change(dataclasses.replace(explicit, model_control="poll"), "unload", "m", None, "peer"))
    assert not (explicit.run_dir / control.REQUESTS).exists()


def test_a_load_writes_its_override_and_returns_the_master_s_answer(explicit: Settings) -> None:
    answering = master_answers(explicit.run_dir, True, "loaded 'm'")
    assert run_blocking(repository.change(explicit, "load", "m", '{"max_batch_size": 4}', "peer")) == "loaded 'm'"
    answering.join(5)
    assert not list((explicit.run_dir / control.ANSWERS).iterdir())  # taken


def test_a_failed_load_is_the_master_s_message_as_invalid_argument(explicit: Settings) -> None:
    master_answers(explicit.run_dir, False, "failed to load 'm': every version failed")
    with pytest.raises(InvalidArgument, match="failed to load 'm': every version failed"):
        run_blocking(repository.change(explicit, "load", "m", None, "peer"))


def test_a_retiring_worker_answers_only_once_it_stopped_accepting(explicit: Settings, stopped_accepting: threading.Event,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repository, "STOP_KEEPALIVE_LINGER", 0.2)
    quick = dataclasses.replace(explicit, grpc_bind="")
    master_answers(explicit.run_dir, True, "unloaded 'm'", retiring=True)
    answered = threading.Event()
    threading.Thread(target=lambda: (run_blocking(repository.change(quick, "unload", "m", None, "peer")), answered.set()),
                     daemon=True).start()
    assert not answered.wait(1.0)
    stopped_accepting.set()
    assert answered.wait(10.0)


def test_a_worker_that_stops_before_the_master_answers_ends_the_call_with_503(
        explicit: Settings, stopped_accepting: threading.Event) -> None:
    """A rollout retired it before its call was taken up: 503 within a second, not graceful_timeout's hold."""
    stopped_accepting.set()
    with pytest.raises(ApiError) as caught:
        run_blocking(repository.change(explicit, "load", "m", None, "peer"))
    assert caught.value.status == 503 and "the call goes on" in caught.value.message
    assert len(control.pending(explicit.run_dir)) == 1  # the master still takes it up


def test_no_answer_in_time_is_a_504_and_the_request_is_withdrawn(explicit: Settings) -> None:
    impatient = dataclasses.replace(explicit, repository_timeout=0.3)
    with pytest.raises(ApiError) as caught:
        run_blocking(repository.change(impatient, "load", "m", None, "peer"))
    assert caught.value.status == 504 and "FORKSERVE_REPOSITORY_TIMEOUT" in caught.value.message
    assert control.pending(explicit.run_dir) == []


def test_bad_names_and_parameters_fail_before_any_request(explicit: Settings) -> None:
    with pytest.raises(InvalidArgument, match="invalid model name"):
        run_blocking(repository.change(explicit, "load", "../m", None, "peer"))
    with pytest.raises(InvalidArgument, match="model files come from the repository"):
        repository.load_config_parameter({"file:1/model.keras": b"x"})
    assert repository.load_config_parameter({"config": "{}"}) == "{}" and repository.load_config_parameter(None) is None


def test_the_index_lists_a_served_model_per_version_from_this_worker(explicit: Settings) -> None:
    registry = ModelRegistry(explicit.run_dir)
    versions = {n: ModelVersion(VersionSource("m", n, Path("/x"), "keras"), ModelConfig(), state=AVAILABLE) for n in (1, 2)}
    registry.models["m"] = Model("m", ModelConfig(), versions)
    control.write_index(explicit.run_dir, "explicit", {
        "m": {"state": control.READY, "reason": "", "versions": [1, 2]},
        "n": {"state": control.UNAVAILABLE, "reason": "unloaded", "versions": []}})
    every = repository.repository_index(registry, explicit, False, "peer")
    assert [(e["name"], e["version"], e["state"]) for e in every] == [("m", "2", "READY"), ("m", "1", "READY"),
                                                                      ("n", "", "UNAVAILABLE")]
    assert [e["name"] for e in repository.repository_index(registry, explicit, True, "peer")] == ["m", "m"]


def test_a_config_reload_is_checked_in_the_worker_before_the_master_hears_of_it(explicit: Settings) -> None:
    tfserving = dataclasses.replace(explicit, model_control="poll", tfserving_model=("a", "/m/a"))
    one = 'model_config_list { config { name: "a" base_path: "%s" model_platform: "tensorflow" } }'
    cases = [
        (dataclasses.replace(tfserving, tfserving_model=None), one % "/m/a", "UNIMPLEMENTED", "needs a server started"),
        (tfserving, "custom_model_config { }", "INVALID_ARGUMENT", "Only ModelConfigList is currently supported"),
        (tfserving, one % "relative/a", "INVALID_ARGUMENT", "Expected model a to have an absolute path or URI"),
        (tfserving, one % ("/m/" + "é" * 800_000), "RESOURCE_EXHAUSTED", "larger than"),  # \u00e9 six times over
    ]
    for settings, text, code, message in cases:
        with pytest.raises(ApiError) as refused:
            run_blocking(repository.reload_config(settings, text, "peer"))
        assert (status_code(refused.value).name, message in refused.value.message) == (code, True)
    assert not (explicit.run_dir / control.REQUESTS).exists()


def test_a_config_reload_answers_as_tf_serving_by_the_masters_words(explicit: Settings) -> None:
    tfserving = dataclasses.replace(explicit, model_control="poll", tfserving_model=("a", "/m/a"))
    text = 'model_config_list { config { name: "a" base_path: "/m/a" model_platform: "tensorflow" } }'
    for answer, code in (("failed to load model a: no version directory", "UNKNOWN"),
                         ("Request to assign label to version 2 of model a, which is not currently available for inference",
                          "FAILED_PRECONDITION")):
        answering = master_answers(explicit.run_dir, False, answer)
        with pytest.raises(ApiError) as failed:
            run_blocking(repository.reload_config(tfserving, text, "peer"))
        answering.join(5)
        assert (status_code(failed.value).name, failed.value.message) == (code, answer)
