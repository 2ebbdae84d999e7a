"""TF Serving's model configuration in the master: the file's polls, TF Serving's label rule, a reload and its settling."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from server.config import ConfigError, ServerConfig
from server.master.config_watch import ConfigWatch
from server.master.model_server_config import ModelServerConfigSource


def config_text(*models: tuple[str, str]) -> str:
    """A ModelServerConfig of (name, extra fields) models."""
    body = "".join(f'config {{ name: "{name}" base_path: "/m/{name}" model_platform: "tensorflow" {extra} }} '
                   for name, extra in models)
    return f"model_config_list {{ {body}}}"


def polled(path: Path, text: str, **kwargs: object) -> ModelServerConfigSource:
    path.write_text(text)
    source = ModelServerConfigSource(path, poll_seconds=0.001, **kwargs)  # type: ignore[arg-type]
    source.initial()
    return source


def poll(source: ModelServerConfigSource, serving: set[tuple[str, int]] = frozenset()) -> dict:  # type: ignore[assignment]
    time.sleep(0.002)  # NOTE: past the (tiny) poll interval of these sources, not a wait for a server
    return source.refresh(set(serving))


def test_a_change_is_taken_once_two_reads_agree(tmp_path: Path) -> None:
    path = tmp_path / "models.config"
    source = polled(path, config_text(("a", "")))
    path.write_text(config_text(("a", ""), ("b", "")))
    assert set(poll(source)) == {"a"}  # read once: maybe half-written
    assert set(poll(source)) == {"a", "b"}
    assert source.tables["b"]["base_path"] == "/m/b"


def test_a_malformed_or_missing_file_keeps_the_last_good_models(tmp_path: Path) -> None:
    path = tmp_path / "models.config"
    source = polled(path, config_text(("a", "")))
    path.write_text("model_config_list { config { nme: 'b' } }")
    poll(source)
    assert set(poll(source)) == {"a"} and source.problem.startswith(f"{path}:1:30 : ")
    path.unlink()
    assert set(poll(source)) == {"a"} and "is missing" in source.problem
    path.write_text(config_text(("a", "")))
    assert set(poll(source)) == {"a"} and source.problem == ""


def test_a_malformed_poll_is_reported_as_a_failed_reload(tmp_path: Path) -> None:
    path = tmp_path / "models.config"
    source = polled(path, config_text(("a", "")))
    reports: list[bool] = []
    watch = ConfigWatch(tmp_path / "none.toml", ServerConfig(), reports.append, model_server=source)
    path.write_text("model_config_list {")
    for _ in range(2):
        time.sleep(0.002)
        watch.refresh()
    assert reports == [True, False] and set(watch.accepted.models) == {"a"}
    path.write_text(config_text(("a", "")))
    time.sleep(0.002)
    watch.refresh()
    assert reports == [True, False, True] and watch.problem is None


def test_the_file_is_read_once_when_the_poll_is_zero(tmp_path: Path) -> None:
    path = tmp_path / "models.config"
    path.write_text(config_text(("a", "")))
    source = ModelServerConfigSource(path)
    source.initial()
    path.write_text(config_text(("b", "")))
    assert set(source.refresh(set())) == set(source.refresh(set())) == {"a"}


def test_labels_name_only_served_versions_unless_allowed_as_tf_serving_does(tmp_path: Path) -> None:
    labelled = config_text(("a", "version_labels { key: 'stable' value: 2 }"))
    with pytest.raises(ConfigError, match="Request to assign label to version 2 of model a, which is not currently "
                                          "available for inference"):
        polled(tmp_path / "start.config", labelled)
    assert set(polled(tmp_path / "allowed.config", labelled, labels_for_unavailable=True).tables) == {"a"}

    path = tmp_path / "models.config"
    source = polled(path, config_text(("a", "")))
    path.write_text(labelled)
    poll(source)
    assert poll(source)["a"]["labels"] == {} and "version 2 of model a" in source.problem
    poll(source, {("a", 2)})
    assert poll(source, {("a", 2)})["a"]["labels"] == {"stable": 2}  # read again: taken once version 2 serves

    allowed = polled(tmp_path / "moved.config", labelled, labels_for_unavailable=True)
    with pytest.raises(ConfigError, match="version 3 of model a"):  # an existing label moves only to a served version
        allowed.replace(config_text(("a", "version_labels { key: 'stable' value: 3 }")), set())


def test_a_reload_keeps_the_dropped_models_until_it_settles(tmp_path: Path) -> None:
    source = polled(tmp_path / "models.config", config_text(("a", ""), ("b", "")))
    source.replace(config_text(("b", ""), ("c", "")), set())
    assert set(source.compose(ServerConfig()).models) == {"a", "b", "c"}  # a serves while c loads
    source.settle(True)
    assert set(source.compose(ServerConfig()).models) == {"b", "c"}

    source.replace(config_text(("d", "")), set())
    source.settle(False)  # d did not load: the set before it returns
    assert set(source.compose(ServerConfig()).models) == {"b", "c"}


def test_the_watch_composes_models_toml_under_the_model_config_and_reports_a_clash(tmp_path: Path) -> None:
    conf = tmp_path / "models.toml"
    conf.write_text("[models.a]\nmax_batch_size = 8\nlabels = { old = 1 }\n")
    path = tmp_path / "models.config"
    source = polled(path, config_text(("a", "")))
    from server.config import load_config

    watch = ConfigWatch(conf, load_config(conf), model_server=source)
    model = watch.accepted.for_model("a")
    assert (model.base_path, model.max_batch_size, model.labels) == ("/m/a", 8, {})  # TF Serving's file decides labels
    conf.write_text("[models.a]\nmax_batch_size = 8\nallowed_batch_sizes = [4, 16]\n")  # does not end with 8
    watch.refresh()
    assert watch.refresh().for_model("a").max_batch_size == 8 and watch.problem is not None
    conf.write_text("[models.a]\nmax_batch_size = 4\n")
    watch.refresh()
    assert watch.refresh().for_model("a").max_batch_size == 4 and watch.problem is None
    conf.write_text("[models.b]\nbase_path = '/m/b'\n")  # a model TF Serving's file does not list
    watch.refresh()
    assert "b" not in watch.refresh().models and "base_path does not go with" in watch.problem.message


def test_a_poll_waits_while_a_reload_is_in_progress(tmp_path: Path) -> None:
    path = tmp_path / "models.config"
    source = polled(path, config_text(("a", "")))
    source.replace(config_text(("b", "")), set())
    path.write_text(config_text(("c", "")))
    poll(source)
    assert set(poll(source)) == {"b"}  # the reload's answer is what it asked for
    source.settle(False)
    poll(source)
    assert set(poll(source)) == {"c"}  # then the file's edit is taken, not lost


def test_versions_and_labels_below_one_are_refused_as_they_are_read(tmp_path: Path) -> None:
    source = polled(tmp_path / "models.config", config_text(("a", "")), labels_for_unavailable=True)
    for extra in ("model_version_policy { specific { versions: 0 } }", "version_labels { key: 'x' value: 0 }"):
        with pytest.raises(ConfigError, match="versions and version labels must name versions >= 1"):
            source.replace(config_text(("a", extra)), set())
    assert set(source.tables) == {"a"}
