"""`python -m server tfserving FLAGS...` and `tensorflow_model_server FLAGS...`: TF Serving's command line, forkserve's server.

Takes tensorflow_model_server's flags (`--name=value`, a bool also as `--name`), turns them into
forkserve's settings (FORKSERVE_* variables) and replaces itself with gunicorn, so the process
is the server (signals, exit status, a container's PID 1). A flag that forkserve cannot honour
stops it with one line naming the flag and what to use instead; a flag that only tunes
something forkserve does otherwise is taken with a note on stderr. Nothing is silently ignored.
Runs without TensorFlow: the files are checked by the master as it starts.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from server.config import ConfigError
from server.protocols.tfserving import config_files

ROOT = Path(__file__).resolve().parents[2]  # the checkout (or image directory) holding gunicorn.conf.py


class FlagError(ValueError):
    """A command line forkserve does not take: one line, exit status 2."""


@dataclass(frozen=True)
class Flag:
    """One tensorflow_model_server flag forkserve takes: its type and TF Serving's default."""

    kind: type
    default: Any


TAKEN: dict[str, Flag] = {
    "port": Flag(int, 8500),
    "rest_api_port": Flag(int, 0),
    "rest_api_timeout_in_ms": Flag(int, 30000),
    "model_name": Flag(str, "default"),
    "model_base_path": Flag(str, ""),
    "model_config_file": Flag(str, ""),
    "model_config_file_poll_wait_seconds": Flag(int, 0),
    "file_system_poll_wait_seconds": Flag(int, 1),
    "enable_batching": Flag(bool, False),
    "batching_parameters_file": Flag(str, ""),
    "monitoring_config_file": Flag(str, ""),
    "enable_model_warmup": Flag(bool, True),
    "tensorflow_intra_op_parallelism": Flag(int, 0),
    "tensorflow_inter_op_parallelism": Flag(int, 0),
    "grpc_channel_arguments": Flag(str, ""),
    "allow_version_labels_for_unavailable_models": Flag(bool, False),
    "enable_grpc_healthcheck_service": Flag(bool, False),
    "saved_model_tags": Flag(str, "serve"),
    "enable_signature_method_name_check": Flag(bool, False),
    "enable_serialization_as_tensor_content": Flag(bool, False),
    "version": Flag(bool, False),
}

# Flags that tune what forkserve does its own way: taken, with this note.
NO_EFFECT = {
    "rest_api_num_threads": "each worker has FORKSERVE_THREADS request threads",
    "grpc_max_threads": "each worker's gRPC server is asyncio; FORKSERVE_GRPC_MAX_CALLS bounds its calls",
    "num_load_threads": "each worker loads its models in turn, after fork",
    "num_unload_threads": "workers are replaced, not unloaded",
    "max_num_load_retries": "a version that fails FORKSERVE_ROLLOUT_ATTEMPTS times is marked failed",
    "load_retry_interval_micros": "FORKSERVE_ROLLOUT_BACKOFF sets the wait before a rollout is tried again",
    "flush_filesystem_caches": "forkserve leaves the page cache to the kernel",
    "remove_unused_fields_from_bundle_metagraph": "forkserve keeps no MetaGraphDef",
    "num_request_iterations_for_warmup": "each warm-up record is replayed once",
    "enable_profiler": "forkserve has no profiler service",
    "skip_initialize_tpu": "forkserve serves on CPU",
}

# Flags forkserve cannot honour: the start stops with this line.
REFUSED = {
    "grpc_socket_path": "forkserve's gRPC listens on TCP (--port); a local client connects to 127.0.0.1",
    "rest_api_enable_cors_support": "add CORS headers in the proxy in front (conf/nginx.conf)",
    "ssl_config_file": "set FORKSERVE_TLS_CERT and FORKSERVE_TLS_KEY (and FORKSERVE_TLS_CLIENT_CA): TLS on both ports",
    "use_alts_credentials": "use TLS (FORKSERVE_TLS_CERT, FORKSERVE_TLS_KEY)",
    "platform_config_file": "forkserve serves TensorFlow SavedModels and Keras files; set per-model settings in "
                            "conf/models.toml (FORKSERVE_CONF)",
    "tensorflow_session_config_file": "use --tensorflow_intra_op_parallelism and --tensorflow_inter_op_parallelism",
    "tensorflow_session_parallelism": "use --tensorflow_intra_op_parallelism and --tensorflow_inter_op_parallelism",
    "per_process_gpu_memory_fraction": "forkserve serves on CPU",
    "enable_per_model_batching_parameters": "set a model's batching in its [models.NAME] table of conf/models.toml "
                                            "(FORKSERVE_CONF)",
    "thread_pool_factory_config_file": "set FORKSERVE_THREADS and the TensorFlow thread flags",
    "mixed_precision": "export the model with the precision it should run in",
    "prefer_tflite_model": "forkserve serves TensorFlow SavedModels and Keras files, not TF Lite",
    "num_tflite_pools": "forkserve serves TensorFlow SavedModels and Keras files, not TF Lite",
    "num_tflite_interpreters_per_pool": "forkserve serves TensorFlow SavedModels and Keras files, not TF Lite",
    "xla_cpu_compilation_enabled": "compile with XLA when exporting (jit_compile=True)",
    "xla_gpu_compilation_enabled": "forkserve serves on CPU",
}

# --grpc_channel_arguments that map: gRPC argument -> (forkserve variable, the argument's unit in seconds).
CHANNEL_ARGUMENTS = {
    "grpc.max_connection_age_ms": ("FORKSERVE_GRPC_MAX_CONNECTION_AGE", 0.001),
    "grpc.max_connection_age_grace_ms": ("FORKSERVE_GRPC_MAX_CONNECTION_AGE_GRACE", 0.001),
    "grpc.max_receive_message_length": ("FORKSERVE_MAX_BODY_BYTES", 0),
}


def parse_flags(argv: list[str]) -> dict[str, Any]:
    """TF Serving's flags with its defaults; FlagError for one forkserve does not take (NO_EFFECT ones are noted)."""
    values = {name: flag.default for name, flag in TAKEN.items()}
    values["_no_effect"], values["_given"] = [], set()
    for arg in argv:
        if not arg.startswith("--"):
            raise FlagError(f"unknown argument: {arg} (flags are --name=value)")
        name, equals, raw = arg[2:].partition("=")
        if name in REFUSED:
            raise FlagError(f"--{name} is not taken by forkserve: {REFUSED[name]}")
        if name in NO_EFFECT:
            values["_no_effect"].append(f"--{name} has no effect in forkserve: {NO_EFFECT[name]}")
            continue
        flag = TAKEN.get(name)
        if flag is None:
            raise FlagError(f"unknown flag --{name}: not a tensorflow_model_server flag forkserve knows "
                            "(python -m server tfserving --help lists them)")
        values[name] = _value(name, flag, raw if equals else None)  # NOTE: a flag given twice: the last wins, as in TF Serving
        values["_given"].add(name)
    return values


def _value(name: str, flag: Flag, raw: str | None) -> Any:
    """One flag's value as TF Serving's parser reads it: --name=value, a bool also bare."""
    if flag.kind is bool:
        if raw is None or raw.lower() in ("true", "1"):
            return True
        if raw.lower() in ("false", "0"):
            return False
        raise FlagError(f"--{name} takes true or false, got {raw!r}")
    if raw is None:
        raise FlagError(f"--{name} needs a value: --{name}=VALUE")
    if flag.kind is int:
        try:
            return int(raw)
        except ValueError:
            raise FlagError(f"--{name} takes an integer, got {raw!r}") from None
    return raw


def environment(flags: dict[str, Any], given: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(forkserve's environment for these flags over `given`, notes for stderr); FlagError for what cannot be served."""
    env, notes = dict(given), list(flags["_no_effect"])
    for name in ("FORKSERVE_WARMUP_RECORDS", "FORKSERVE_TFSERVING_LABELS_FOR_UNAVAILABLE_MODELS", "FORKSERVE_NEW_VERSIONS"):
        env.pop(name, None)  # NOTE: the flags alone decide these, not a variable left in the environment
    _refuse_settings_that_change_answers(flags)
    _ports(flags, env, notes)
    _models(flags, env, notes)
    defaults: dict[str, Any] = {}
    if "rest_api_timeout_in_ms" in flags["_given"]:  # NOTE: TF Serving's default is forkserve's (30 s): models.toml's stays
        if flags["rest_api_timeout_in_ms"] <= 0:
            raise FlagError(f"--rest_api_timeout_in_ms must be positive, got {flags['rest_api_timeout_in_ms']}")
        defaults["request_timeout_s"] = flags["rest_api_timeout_in_ms"] / 1000.0
    defaults.update(_batching(flags, notes))
    env["FORKSERVE_TFSERVING_DEFAULTS"] = json.dumps(defaults)
    env.pop("FORKSERVE_TFSERVING_METRICS_PATH", None)  # NOTE: the monitoring file alone decides, as in TF Serving
    if flags["monitoring_config_file"]:
        path = _read_text(flags["monitoring_config_file"], "--monitoring_config_file")
        metrics_path = _config(config_files.prometheus_path, path)
        if metrics_path:
            env["FORKSERVE_TFSERVING_METRICS_PATH"] = metrics_path
        else:
            notes.append(f"{flags['monitoring_config_file']}: prometheus_config is not enabled: "
                         "metrics are served at /metrics only")
    if not flags["enable_model_warmup"]:
        env["FORKSERVE_WARMUP_RECORDS"] = "0"
    for flag, variable in (("tensorflow_intra_op_parallelism", "FORKSERVE_INTRA_OP_THREADS"),
                           ("tensorflow_inter_op_parallelism", "FORKSERVE_INTER_OP_THREADS")):
        if flags[flag] < 0:
            raise FlagError(f"--{flag} must not be negative, got {flags[flag]}")
        if flags[flag]:
            env[variable] = str(flags[flag])
    _channel_arguments(flags["grpc_channel_arguments"], env)
    if flags["allow_version_labels_for_unavailable_models"]:
        env["FORKSERVE_TFSERVING_LABELS_FOR_UNAVAILABLE_MODELS"] = "1"
    if not flags["enable_grpc_healthcheck_service"] and flags["port"]:
        notes.append("the standard gRPC health service (grpc.health.v1.Health) is always on in forkserve")
    env.setdefault("FORKSERVE_CONF", os.devnull)  # NOTE: TF Serving's files are the configuration; models.toml only when given
    return env, notes


def _refuse_settings_that_change_answers(flags: dict[str, Any]) -> None:
    """Flags whose non-default value forkserve cannot honour."""
    if {tag.strip() for tag in flags["saved_model_tags"].split(",")} != {"serve"}:
        raise FlagError(f"--saved_model_tags={flags['saved_model_tags']} is not taken by forkserve: it loads the "
                        "'serve' meta graph of a SavedModel (export the model with that tag)")
    if flags["enable_signature_method_name_check"]:
        raise FlagError("--enable_signature_method_name_check is not taken by forkserve: Classify and Regress follow "
                        "TF Serving's default (the check off), which also serves TF2 models")
    if flags["enable_serialization_as_tensor_content"]:
        raise FlagError("--enable_serialization_as_tensor_content is not taken by forkserve: gRPC Predict answers "
                        "in the typed fields (float_val, ...), TF Serving's default; tf.make_ndarray reads both")


def _ports(flags: dict[str, Any], env: dict[str, str], notes: list[str]) -> None:
    """--port (gRPC) and --rest_api_port (REST) on every interface, as TF Serving listens."""
    grpc_port, rest_port = flags["port"], flags["rest_api_port"]
    for name, port in (("port", grpc_port), ("rest_api_port", rest_port)):
        if not 0 <= port <= 65535:
            raise FlagError(f"--{name} must be a port from 0 to 65535, got {port}")
    if grpc_port and grpc_port == rest_port:
        raise FlagError(f"--port and --rest_api_port must be different, both are {grpc_port}")
    env["FORKSERVE_GRPC_BIND"] = f"0.0.0.0:{grpc_port}" if grpc_port else ""
    if rest_port:
        env["FORKSERVE_BIND"] = f"0.0.0.0:{rest_port}"
    else:  # NOTE: gunicorn needs a listener (health, readiness, metrics): a loopback port nobody outside reaches
        port = _free_loopback_port()
        env["FORKSERVE_BIND"] = f"127.0.0.1:{port}"
        notes.append(f"--rest_api_port=0: the REST API is off for clients; health and metrics answer on 127.0.0.1:{port}")


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _models(flags: dict[str, Any], env: dict[str, str], notes: list[str]) -> None:
    """--model_config_file (polled every --model_config_file_poll_wait_seconds), else --model_name and --model_base_path."""
    env["FORKSERVE_MODELS"] = ""  # NOTE: no repository root: TF Serving serves the models its configuration names
    for name in ("FORKSERVE_TFSERVING_MODEL_CONFIG", "FORKSERVE_TFSERVING_MODEL"):
        env.pop(name, None)
    if flags["model_config_file"]:
        if flags["model_base_path"]:
            notes.append("--model_name and --model_base_path are ignored: --model_config_file names the models "
                         "(as in TF Serving)")
        path = Path(flags["model_config_file"]).absolute()
        _config(lambda raw, where: config_files.model_tables(config_files.model_server_config(raw, where), where),
                _read_text(str(path), "--model_config_file"), str(path))
        env["FORKSERVE_TFSERVING_MODEL_CONFIG"] = str(path)
        if flags["model_config_file_poll_wait_seconds"] < 0:
            raise FlagError("--model_config_file_poll_wait_seconds must not be negative")
        env["FORKSERVE_TFSERVING_MODEL_CONFIG_POLL"] = str(flags["model_config_file_poll_wait_seconds"])
    elif flags["model_base_path"]:
        text = config_files.single_model_config(flags["model_name"], flags["model_base_path"])
        _config(lambda raw, where: config_files.model_tables(config_files.model_server_config(raw, where), where),
                text.encode(), "--model_name/--model_base_path")
        env["FORKSERVE_TFSERVING_MODEL"] = f"{flags['model_name']}={flags['model_base_path']}"
    else:
        raise FlagError("Both server_options.model_base_path and server_options.model_config_file are empty! "
                        "(give --model_base_path=DIR, or --model_config_file=FILE)")
    wait = flags["file_system_poll_wait_seconds"]
    if wait < 0:
        raise FlagError(f"--file_system_poll_wait_seconds must not be negative, got {wait}")
    if wait:
        env["FORKSERVE_POLL_INTERVAL"] = str(wait)
    else:  # NOTE: the master's passes go on (the config file's polls, reloads, TLS): only new versions are not looked for
        env["FORKSERVE_NEW_VERSIONS"] = "0"


def _batching(flags: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """[defaults] settings from --enable_batching and --batching_parameters_file."""
    path = flags["batching_parameters_file"]
    if not flags["enable_batching"]:
        if path:
            notes.append("--batching_parameters_file has no effect without --enable_batching (as in TF Serving)")
        return {}
    if not path:
        return {}
    table, file_notes = _config(config_files.batching_defaults, _read_text(path, "--batching_parameters_file"), path)
    notes.extend(file_notes)
    return table


def _channel_arguments(raw: str, env: dict[str, str]) -> None:
    """--grpc_channel_arguments=name=value,...: those with a forkserve setting; any other stops the start."""
    for pair in filter(None, (part.strip() for part in raw.split(","))):
        name, equals, value = pair.partition("=")
        if name not in CHANNEL_ARGUMENTS or not equals:
            raise FlagError(f"--grpc_channel_arguments: {pair!r} is not taken by forkserve; it takes "
                            f"{', '.join(sorted(CHANNEL_ARGUMENTS))}")
        variable, unit = CHANNEL_ARGUMENTS[name]
        try:
            number = int(value)
        except ValueError:
            raise FlagError(f"--grpc_channel_arguments: {name} takes an integer, got {value!r}") from None
        if number <= 0:
            raise FlagError(f"--grpc_channel_arguments: {name} must be positive in forkserve, got {number} "
                            "(every limit and age has a value here)")
        env[variable] = str(number * unit if unit else number)


def _read_text(path: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise FlagError(f"{flag}={path}: cannot read it: {exc.strerror or exc}") from None


def _config(parse: Callable[..., Any], raw: bytes, where: str | None = None) -> Any:
    """A TF Serving file parsed; its ConfigError as a FlagError (one line with the parser's line:column)."""
    try:
        return parse(raw, where) if where is not None else parse(raw, "")
    except ConfigError as exc:
        raise FlagError(str(exc)) from None


def version() -> str:
    """What --version prints: TF Serving's two lines, naming forkserve."""
    def of(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "unknown"

    return (f"TensorFlow ModelServer: forkserve {of('forkserve')} (TF Serving API {of('tensorflow-serving-api')})\n"
            f"TensorFlow Library: {of('tensorflow-cpu') if of('tensorflow-cpu') != 'unknown' else of('tensorflow')}")


def main(argv: list[str]) -> int:
    """Check the flags and become gunicorn; one line and status 2 for a command line forkserve does not take."""
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    try:
        flags = parse_flags(argv)
        if flags["version"]:
            print(version())
            return 0
        env, notes = environment(flags, dict(os.environ))
    except FlagError as exc:
        print(f"tensorflow_model_server (forkserve): {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"tensorflow_model_server (forkserve): note: {note}", file=sys.stderr)
    command = [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, command, env)
    return 1  # not reached


def usage() -> str:
    """The flags forkserve takes, notes and refuses."""
    lines = ["usage: python -m server tfserving --flag=value ... (tensorflow_model_server's flags)", "", "taken:"]
    lines += [f"  --{name}={flag.default!r}" for name, flag in TAKEN.items()]
    lines += ["", "taken, with no effect:"] + [f"  --{name}: {why}" for name, why in NO_EFFECT.items()]
    lines += ["", "not taken (the start stops):"] + [f"  --{name}: {why}" for name, why in REFUSED.items()]
    return "\n".join(lines)
