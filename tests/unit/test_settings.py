"""Process settings from FORKSERVE_* environment variables."""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import tempfile
from pathlib import Path

import pytest

from server.settings import (
    DEFAULT_BIND,
    DEFAULT_MAX_BODY_BYTES,
    Settings,
    available_cpus,
    split_address,
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No FORKSERVE_* (or PROMETHEUS_MULTIPROC_DIR) variables set, and tmp_path as the working directory."""
    for name in list(os.environ):
        if name.startswith("FORKSERVE_") or name == "PROMETHEUS_MULTIPROC_DIR":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_available_cpus_is_positive_and_within_affinity() -> None:
    cpus = available_cpus()
    assert cpus >= 1
    assert cpus <= len(os.sched_getaffinity(0))


def test_from_env_defaults(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = Settings.from_env()
    cpus = available_cpus()
    assert settings.models_dir == (tmp_path / "models").resolve()
    assert settings.conf_path == (tmp_path / "conf" / "models.toml").resolve()
    assert settings.bind == DEFAULT_BIND == "127.0.0.1:8000"
    assert settings.cpus == cpus
    assert settings.workers == cpus
    assert settings.threads == 32
    assert settings.intra_op_threads == 0
    assert settings.inter_op_threads == 1
    assert settings.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 32 * 1024 * 1024
    assert settings.log_level == "info"
    # Unpredictable, and nothing made until export(): `forkserve-<pid>-<random>` under $TMPDIR.
    assert settings.run_dir.parent == Path(tempfile.gettempdir()).resolve()
    assert re.fullmatch(rf"forkserve-{os.getpid()}-[0-9a-f]{{12}}", settings.run_dir.name)
    assert not settings.run_dir.exists() and Settings.from_env().run_dir != settings.run_dir


def test_from_env_reads_every_variable(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("FORKSERVE_MODELS", "repo")
    clean_env.setenv("FORKSERVE_CONF", str(tmp_path / "etc" / "m.toml"))
    clean_env.setenv("FORKSERVE_BIND", "0.0.0.0:9000")
    clean_env.setenv("FORKSERVE_WORKERS", "3")
    clean_env.setenv("FORKSERVE_THREADS", " 16 ")
    clean_env.setenv("FORKSERVE_INTRA_OP_THREADS", "2")
    clean_env.setenv("FORKSERVE_INTER_OP_THREADS", "4")
    clean_env.setenv("FORKSERVE_MAX_BODY_BYTES", "1000")
    clean_env.setenv("FORKSERVE_LOG_LEVEL", "debug")
    clean_env.setenv("FORKSERVE_RUN_DIR", "run")
    settings = Settings.from_env()
    assert settings.models_dir == (tmp_path / "repo").resolve()  # relative paths resolve against the cwd
    assert settings.models_dir.is_absolute()
    assert settings.conf_path == tmp_path / "etc" / "m.toml"
    assert settings.bind == "0.0.0.0:9000"
    assert settings.workers == 3
    assert settings.threads == 16
    assert settings.intra_op_threads == 2
    assert settings.inter_op_threads == 4
    assert settings.max_body_bytes == 1000
    assert settings.log_level == "debug"
    assert settings.run_dir == (tmp_path / "run").resolve()


def test_metrics_dir_defaults_under_the_run_dir(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("FORKSERVE_RUN_DIR", str(tmp_path / "run"))
    assert Settings.from_env().metrics_dir == tmp_path / "run" / "metrics"
    clean_env.setenv("PROMETHEUS_MULTIPROC_DIR", "prom")
    assert Settings.from_env().metrics_dir == tmp_path / "prom"


def test_export_pins_derived_paths_for_forked_workers(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("FORKSERVE_RUN_DIR", "run")  # relative: resolved against the master's cwd
    clean_env.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # so monkeypatch restores it after export() sets it
    first = Settings.from_env()
    first.export()
    assert os.environ["FORKSERVE_RUN_DIR"] == str(tmp_path / "run")
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path / "run" / "metrics")
    assert first.metrics_dir.is_dir()
    clean_env.chdir(tmp_path.parent)  # a worker re-reading the environment gets the same directories
    again = Settings.from_env()
    assert (again.run_dir, again.metrics_dir) == (first.run_dir, first.metrics_dir)


def test_the_default_run_dir_is_private_and_never_a_planted_one(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The predictable $TMPDIR/forkserve-<pid> another user planted (a symlink to the victim's files) is not used."""
    clean_env.setattr(tempfile, "tempdir", str(tmp_path))
    clean_env.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # so monkeypatch restores it after export() sets it
    victim = tmp_path / "victim"
    (victim / "metrics").mkdir(parents=True)
    (victim / "metrics" / "keep.txt").write_text("mine")
    (tmp_path / f"forkserve-{os.getpid()}").symlink_to(victim)
    settings = Settings.from_env()
    settings.export()
    assert settings.run_dir.parent == tmp_path and settings.run_dir.name.startswith(f"forkserve-{os.getpid()}-")
    assert stat.S_IMODE(os.lstat(settings.run_dir).st_mode) == 0o700 and not settings.run_dir.is_symlink()
    assert settings.metrics_dir == settings.run_dir / "metrics" and settings.metrics_dir.is_dir()
    assert sorted(p.name for p in victim.rglob("*")) == ["keep.txt", "metrics"]


def test_a_given_run_dir_keeps_its_last_part_unresolved(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    clean_env.setenv("FORKSERVE_RUN_DIR", "link/run")  # a symlink in the parents is followed ...
    assert Settings.from_env().run_dir == tmp_path / "real" / "run"
    clean_env.setenv("FORKSERVE_RUN_DIR", "link")  # ... the last part is kept, for export() to refuse
    assert Settings.from_env().run_dir == tmp_path / "link"
    assert Settings.from_env().metrics_dir == tmp_path / "link" / "metrics"


def test_zero_or_empty_counts_fall_back_to_defaults(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FORKSERVE_WORKERS", "0")
    clean_env.setenv("FORKSERVE_THREADS", "0")
    clean_env.setenv("FORKSERVE_INTER_OP_THREADS", "0")
    clean_env.setenv("FORKSERVE_INTRA_OP_THREADS", "")
    settings = Settings.from_env()
    assert settings.workers == available_cpus()
    assert settings.threads == 32
    assert settings.inter_op_threads == 1
    assert settings.intra_op_threads == 0


@pytest.mark.parametrize("value", ["-1", "lots", "1.5"])
def test_bad_integer_variable_raises_value_error(clean_env: pytest.MonkeyPatch, value: str) -> None:
    clean_env.setenv("FORKSERVE_WORKERS", value)
    with pytest.raises(ValueError):
        Settings.from_env()


def test_negative_variable_error_names_the_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FORKSERVE_THREADS", "-4")
    with pytest.raises(ValueError, match="FORKSERVE_THREADS must not be negative, got -4"):
        Settings.from_env()


def test_non_integer_variable_error_names_the_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FORKSERVE_WORKERS", "lots")
    with pytest.raises(ValueError, match="FORKSERVE_WORKERS"):
        Settings.from_env()


def settings_with(cpus: int, intra_op_threads: int = 0) -> Settings:
    """Settings from the current environment with `cpus` CPUs and the given intra-op override."""
    return dataclasses.replace(Settings.from_env(), cpus=cpus, intra_op_threads=intra_op_threads)


@pytest.mark.parametrize(
    ("cpus", "workers", "expected"),
    [(8, 1, 8), (8, 2, 4), (8, 3, 2), (8, 8, 1), (2, 4, 1), (4, 0, 4), (1, 1, 1)],
)
def test_intra_op_for_shares_cpus_between_workers(
    clean_env: pytest.MonkeyPatch, cpus: int, workers: int, expected: int
) -> None:
    assert settings_with(cpus).intra_op_for(workers) == expected


def test_intra_op_for_uses_the_explicit_setting(clean_env: pytest.MonkeyPatch) -> None:
    assert settings_with(8, intra_op_threads=3).intra_op_for(4) == 3


def test_settings_are_frozen(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings_with(2).cpus = 4  # type: ignore[misc]


@pytest.mark.parametrize(("mode", "expected"), [("1", True), ("on", True), ("0", False), ("off", False)])
def test_pin_cpus_explicit_modes(clean_env: pytest.MonkeyPatch, mode: str, expected: bool) -> None:
    clean_env.setenv("FORKSERVE_PIN_CPUS", mode)
    assert Settings.from_env().pins_for(1) is expected
    assert Settings.from_env().pins_for(64) is expected


def test_pin_cpus_auto_needs_two_workers_with_whole_cpus_each(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings.from_env()
    unlimited = len(os.sched_getaffinity(0)) == settings.cpus
    assert settings.pins_for(1) is False  # the count gunicorn runs (-w), not FORKSERVE_WORKERS
    assert settings.pins_for(settings.cpus + 1) is False
    if settings.cpus >= 2:
        assert settings.pins_for(2) is unlimited
        clean_env.setenv("FORKSERVE_INTRA_OP_THREADS", str(settings.cpus // 2 + 1))  # more threads than its slot
        assert Settings.from_env().pins_for(2) is False


def test_pin_cpus_rejects_other_values(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FORKSERVE_PIN_CPUS", "sometimes")
    with pytest.raises(ValueError, match="FORKSERVE_PIN_CPUS"):
        Settings.from_env()


def test_grpc_settings_default_and_off(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings.from_env()
    assert (settings.grpc_bind, settings.grpc_max_connection_age) == ("127.0.0.1:8500", 5.0)
    clean_env.setenv("FORKSERVE_GRPC_BIND", " ")
    clean_env.setenv("FORKSERVE_GRPC_MAX_CONNECTION_AGE", "0")
    settings = Settings.from_env()
    assert (settings.grpc_bind, settings.grpc_max_connection_age) == ("", 0.0)
    clean_env.setenv("FORKSERVE_GRPC_MAX_CONNECTION_AGE", "-1")
    with pytest.raises(ValueError, match="FORKSERVE_GRPC_MAX_CONNECTION_AGE must be 0"):
        Settings.from_env()


@pytest.mark.parametrize(
    ("raw", "sink"),
    [("", ""), ("file:logs", "file:{cwd}/logs"), ("file:/var/log/p", "file:/var/log/p"),
     ("http://collector:8080/events", "http://collector:8080/events"), ("https://h/x", "https://h/x")],
)
def test_payload_log_sinks(clean_env: pytest.MonkeyPatch, tmp_path: Path, raw: str, sink: str) -> None:
    clean_env.setenv("FORKSERVE_PAYLOAD_LOG", raw)
    settings = Settings.from_env()
    assert settings.payload_log == sink.format(cwd=tmp_path)
    assert (settings.payload_log_max_mb, settings.payload_log_queue) == (100.0, 1000)


@pytest.mark.parametrize("raw", ["logs", "file:", "ftp://h/x", "http://", "http:///path", "s3://bucket"])
def test_a_bad_payload_log_sink_is_refused_at_start(clean_env: pytest.MonkeyPatch, raw: str) -> None:
    clean_env.setenv("FORKSERVE_PAYLOAD_LOG", raw)
    with pytest.raises(ValueError, match="FORKSERVE_PAYLOAD_LOG must be file:DIR, http://URL or https://URL"):
        Settings.from_env()


def test_payload_log_sizes(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FORKSERVE_PAYLOAD_LOG_MAX_MB", "0.5")
    clean_env.setenv("FORKSERVE_PAYLOAD_LOG_QUEUE", "10")
    settings = Settings.from_env()
    assert (settings.payload_log_max_mb, settings.payload_log_queue) == (0.5, 10)
    clean_env.setenv("FORKSERVE_PAYLOAD_LOG_MAX_MB", "0")
    with pytest.raises(ValueError, match="FORKSERVE_PAYLOAD_LOG_MAX_MB"):
        Settings.from_env()


def test_tls_is_off_by_default_and_the_three_files_are_absolute_and_not_resolved(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert not Settings.from_env().tls and Settings.from_env().tls_cert is None
    (tmp_path / "..2026_01").mkdir()
    (tmp_path / "..data").symlink_to("..2026_01")  # a Kubernetes secret volume: ..data swapped on renewal
    clean_env.setenv("FORKSERVE_TLS_CERT", "..data/tls.crt")
    clean_env.setenv("FORKSERVE_TLS_KEY", f" {tmp_path}/..data/tls.key ")
    clean_env.setenv("FORKSERVE_TLS_CLIENT_CA", "ca.pem")
    settings = Settings.from_env()
    assert settings.tls
    assert (settings.tls_cert, settings.tls_key) == (tmp_path / "..data" / "tls.crt", tmp_path / "..data" / "tls.key")
    assert settings.tls_client_ca == tmp_path / "ca.pem"


@pytest.mark.parametrize("given, message", [
    ({"FORKSERVE_TLS_CERT": "tls.crt"}, "FORKSERVE_TLS_CERT and FORKSERVE_TLS_KEY go together"),
    ({"FORKSERVE_TLS_KEY": "tls.key"}, "FORKSERVE_TLS_CERT and FORKSERVE_TLS_KEY go together"),
    ({"FORKSERVE_TLS_CLIENT_CA": "ca.pem"}, "FORKSERVE_TLS_CLIENT_CA needs FORKSERVE_TLS_CERT"),
])
def test_half_a_tls_setting_is_refused_at_start(clean_env: pytest.MonkeyPatch, given: dict[str, str], message: str) -> None:
    for name, value in given.items():
        clean_env.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        Settings.from_env()


def test_split_address_reads_host_port_ipv6_and_every_address() -> None:
    assert split_address("127.0.0.1:8500") == ("127.0.0.1", 8500)
    assert split_address("[::1]:8500") == ("::1", 8500)
    assert split_address(":8500") == ("0.0.0.0", 8500)


def test_model_control_defaults_to_poll_and_takes_a_startup_list_only_in_explicit_mode(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings.from_env()
    assert (settings.model_control, settings.load_models, settings.repository_api) == ("poll", (), True)
    clean_env.setenv("FORKSERVE_LOAD_MODELS", "a, b,,a")
    with pytest.raises(ValueError, match="FORKSERVE_LOAD_MODELS needs FORKSERVE_MODEL_CONTROL=explicit"):
        Settings.from_env()
    clean_env.setenv("FORKSERVE_MODEL_CONTROL", " Explicit ")
    assert (Settings.from_env().model_control, Settings.from_env().load_models) == ("explicit", ("a", "b"))
    clean_env.setenv("FORKSERVE_MODEL_CONTROL", "none")
    with pytest.raises(ValueError, match="FORKSERVE_MODEL_CONTROL must be one of poll, explicit"):
        Settings.from_env()
    clean_env.setenv("FORKSERVE_REPOSITORY_API", "0")
    clean_env.setenv("FORKSERVE_MODEL_CONTROL", "poll")
    clean_env.delenv("FORKSERVE_LOAD_MODELS")
    assert Settings.from_env().repository_api is False


def test_tfserving_metrics_path_is_off_by_default(clean_env: pytest.MonkeyPatch) -> None:
    assert Settings.from_env().tfserving_metrics_path == ""


@pytest.mark.parametrize("raw", ["/monitoring/prometheus/metrics", " /tfs/metrics ", "/metricsz", "/v1x", "/prometheus/"])
def test_tfserving_metrics_path_is_taken_as_given(clean_env: pytest.MonkeyPatch, raw: str) -> None:
    clean_env.setenv("FORKSERVE_TFSERVING_METRICS_PATH", raw)
    assert Settings.from_env().tfserving_metrics_path == raw.strip()


@pytest.mark.parametrize(("raw", "why"), [
    ("monitoring/metrics", "must be a URL path"),
    ("/", "must be a URL path"),
    ("/a b", "must be a URL path"),
    ("/m?x=1", "must be a URL path"),
    ("/<path:p>", "must be a URL path"),
    ("/m%2Fx", "must be a URL path"),
    ("/metrics", "must not be /metrics"),
    ("/metrics/", "must not be /metrics"),
    ("/readyz", "must not be /readyz"),
    ("/v1/models/m/metrics", "must not be under /v1/"),
    ("/v2", "must not be under /v2/"),
    ("/v2/metrics", "must not be under /v2/"),
])
def test_a_bad_tfserving_metrics_path_is_refused_at_start(clean_env: pytest.MonkeyPatch, raw: str, why: str) -> None:
    clean_env.setenv("FORKSERVE_TFSERVING_METRICS_PATH", raw)
    with pytest.raises(ValueError, match=f"^FORKSERVE_TFSERVING_METRICS_PATH {why}"):
        Settings.from_env()
