"""Process-wide settings: the only module that reads forkserve's FORKSERVE_* variables (no TensorFlow here).

The standard variables of the libraries forkserve configures are read where those libraries are:
OTEL_* by server.telemetry.tracing (as the OpenTelemetry SDK itself does), PROMETHEUS_MULTIPROC_DIR
by prometheus_client (Settings.export sets it); server.worker.hooks sets TensorFlow's and gRPC's
own variables before their import.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from server import run_dir as run_directory

DEFAULT_BIND = "127.0.0.1:8000"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_GRPC_BIND = "127.0.0.1:8500"  # TF Serving's gRPC port
DEFAULT_THREADS = 32  # request threads per worker: bounds the requests in flight, so the batch sizes (docs/performance.md)


def conf_path_from_env() -> Path:
    """The per-model settings file: $FORKSERVE_CONF, else conf/models.toml (the CLI reads it too)."""
    return Path(os.environ.get("FORKSERVE_CONF", "conf/models.toml")).resolve()


def given_run_dir() -> str | None:
    """$FORKSERVE_RUN_DIR when set (the CLI's reload looks for the master there)."""
    return os.environ.get("FORKSERVE_RUN_DIR") or None


def available_cpus() -> int:
    """CPUs this process may use: affinity mask and cgroup v2 quota, whichever is smaller."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count)


def _env_value(name: str, convert: type, what: str) -> int | float | None:
    """A number from the environment, None when unset; a ValueError names the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return convert(raw)
    except ValueError:
        raise ValueError(f"{name} must be {what}, got {raw!r}") from None


def _env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment, or the default."""
    value = _env_value(name, float, "a number of seconds")
    if value is None:
        return default
    if not 0 < value < math.inf:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return value


def _env_zero_or_positive(name: str, default: float, unit: str, zero: str) -> float:
    """A number of `unit` from the environment, 0 meaning `zero`, or the default."""
    value = _env_value(name, float, f"a number of {unit}")
    if value is None:
        return default
    if not 0 <= value < math.inf:
        raise ValueError(f"{name} must be 0 ({zero}) or a positive number of {unit}, got {value!r}")
    return value


def _env_seconds_or_off(name: str, default: float) -> float:
    """Seconds from the environment, 0 meaning never, or the default."""
    return _env_zero_or_positive(name, default, "seconds", "never")


def _env_milliseconds(name: str, default: float) -> float:
    """Milliseconds from the environment, 0 meaning off, or the default."""
    return _env_zero_or_positive(name, default, "milliseconds", "off")


def _env_int(name: str, default: int) -> int:
    """A non-negative integer from the environment, or the default."""
    value = _env_value(name, int, "an integer")
    if value is None:
        return default
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value


PIN_MODES = {"auto": "auto", "1": "on", "true": "on", "on": "on", "yes": "on", "0": "off", "false": "off", "off": "off", "no": "off"}


def _env_flag(name: str, default: str = "1") -> bool:
    """A FORKSERVE_* switch: on unless 0, false, off or no."""
    return os.environ.get(name, default).strip().lower() not in ("0", "false", "off", "no")


def _pin_mode(raw: str) -> str:
    """FORKSERVE_PIN_CPUS as "auto", "on" or "off"."""
    mode = PIN_MODES.get(raw.strip().lower())
    if mode is None:
        raise ValueError(f"FORKSERVE_PIN_CPUS must be auto, 1 or 0, got {raw!r}")
    return mode


def _model_control(raw: str) -> str:
    """FORKSERVE_MODEL_CONTROL as "poll" or "explicit" (Triton's --model-control-mode)."""
    mode = raw.strip().lower()
    if mode not in MODEL_CONTROL_MODES:
        raise ValueError(f"FORKSERVE_MODEL_CONTROL must be one of {', '.join(MODEL_CONTROL_MODES)}, got {raw!r}")
    return mode


def _load_models(raw: str) -> tuple[str, ...]:
    """FORKSERVE_LOAD_MODELS: comma-separated model names, each once, in order."""
    names = [name.strip() for name in raw.split(",") if name.strip()]
    return tuple(dict.fromkeys(names))


def _module_names(raw: str) -> tuple[str, ...]:
    """FORKSERVE_ZYGOTE_PRELOAD: comma-separated dotted module names, each once, in order."""
    names = tuple(dict.fromkeys(name.strip() for name in raw.split(",") if name.strip()))
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"FORKSERVE_ZYGOTE_PRELOAD must list module names separated by commas, got {name!r}")
    return names


def _payload_sink(raw: str) -> str:
    """FORKSERVE_PAYLOAD_LOG checked: "file:DIR" (DIR made absolute), "http(s)://HOST..." or "" (off)."""
    raw = raw.strip()
    if not raw:
        return ""
    if raw.startswith("file:") and raw[len("file:"):].strip():
        return "file:" + os.path.abspath(raw[len("file:"):].strip())
    scheme, _, rest = raw.partition("://")
    if scheme.lower() in ("http", "https") and rest and not rest.startswith("/"):
        return raw
    raise ValueError(f"FORKSERVE_PAYLOAD_LOG must be file:DIR, http://URL or https://URL, got {raw!r}")


def _tls_files(cert: str, key: str, client_ca: str) -> tuple[Path | None, Path | None, Path | None]:
    """FORKSERVE_TLS_CERT, _KEY and _CLIENT_CA as absolute paths (None: unset); a key without its certificate is refused.

    NOTE: made absolute, never resolved: a Kubernetes secret volume swaps a `..data` symlink above
    tls.crt and tls.key, and a resolved path would keep reading the old files (server.tls re-reads them).
    """
    cert, key, client_ca = cert.strip(), key.strip(), client_ca.strip()
    if bool(cert) != bool(key):
        raise ValueError("FORKSERVE_TLS_CERT and FORKSERVE_TLS_KEY go together: set both (TLS on both ports) or neither")
    if client_ca and not cert:
        raise ValueError("FORKSERVE_TLS_CLIENT_CA needs FORKSERVE_TLS_CERT and FORKSERVE_TLS_KEY (client certificates are checked over TLS)")

    def absolute(given: str) -> Path | None:
        return Path(os.path.abspath(given)) if given else None

    return absolute(cert), absolute(key), absolute(client_ca)


def _without_last_link(given: str) -> Path:
    """An absolute path with its parent resolved and its last part kept: a symlink there is refused, not followed."""
    path = Path(os.path.abspath(given))
    return path.parent.resolve() / path.name if path.name else path


def _models_dir(raw: str) -> Path | None:
    """FORKSERVE_MODELS as an absolute path; empty: no repository (the models with a base_path only)."""
    return Path(raw).resolve() if raw.strip() else None


def _absolute_or_none(raw: str) -> Path | None:
    return Path(os.path.abspath(raw.strip())) if raw.strip() else None


def _one_model(raw: str) -> tuple[str, str] | None:
    """FORKSERVE_TFSERVING_MODEL: NAME=BASE_PATH."""
    if not raw.strip():
        return None
    name, equals, base_path = raw.strip().partition("=")
    if not equals or not name or not base_path:
        raise ValueError(f"FORKSERVE_TFSERVING_MODEL must be NAME=BASE_PATH, got {raw!r}")
    return name, base_path


def _json_table(name: str) -> dict:
    """A JSON object from the environment ({} when unset)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, got {raw!r}")
    return value


MODEL_CONTROL_MODES = ("poll", "explicit")
# The REST port's own routes: TF Serving's metrics path may be none of these, nor under the APIs' prefixes.
RESERVED_PATHS = ("/metrics", "/healthz", "/readyz", "/openapi.json")
RESERVED_PREFIXES = ("/v1", "/v2")


def _tfserving_metrics_path(raw: str) -> str:
    """FORKSERVE_TFSERVING_METRICS_PATH checked: "" (off) or an absolute URL path no other route answers."""
    path = raw.strip()
    if not path:
        return ""
    name = "FORKSERVE_TFSERVING_METRICS_PATH"
    malformed = any(c in "?#<>%\\" or c.isspace() or not c.isprintable() for c in path)  # NOTE: < > would be a Flask converter
    if not path.startswith("/") or path == "/" or malformed:
        raise ValueError(f"{name} must be a URL path such as /monitoring/prometheus/metrics, got {raw!r}")
    taken = path.rstrip("/")
    if taken in RESERVED_PATHS:
        raise ValueError(f"{name} must not be {taken} (forkserve answers there), got {raw!r}")
    for prefix in RESERVED_PREFIXES:
        if taken == prefix or taken.startswith(prefix + "/"):
            raise ValueError(f"{name} must not be under {prefix}/ (forkserve's APIs), got {raw!r}")
    return path


_current: "Settings | None" = None


@dataclass(frozen=True)
class Settings:
    """Everything forkserve reads from its environment, resolved once."""

    models_dir: Path | None  # the repository; None (FORKSERVE_MODELS empty): only models with a base_path
    conf_path: Path
    bind: str
    workers: int
    threads: int
    cpus: int
    intra_op_threads: int  # 0 = derive from cpus // workers
    inter_op_threads: int
    max_body_bytes: int
    log_level: str
    access_log: bool  # one gunicorn access-log line per request (costs CPU: see docs/performance.md)
    gc_freeze: bool  # gc.freeze() after loading: full collections skip TensorFlow's heap (docs/performance.md)
    balance_connections: bool  # workers shed keep-alive connections above an even share (server.connection_board)
    fast_predict: bool  # TF Serving predict without a handler skips Flask's request machinery (server.http.fast_predict)
    slow_request_ms: float  # log the stage times of inference requests slower than this inside the worker (0: never)
    run_dir: Path  # worker state files and the metrics directory; one per instance (server.run_dir)
    metrics_dir: Path  # prometheus_client multiprocess directory
    multiprocess_metrics: bool  # PROMETHEUS_MULTIPROC_DIR is set (always under gunicorn.conf.py)
    poll_interval: float  # seconds between repository scans in the master
    boot_timeout: float  # seconds a new worker has to load and warm up during a rollout
    pin_cpus: str  # "auto", "on" or "off": each worker on its own CPUs (FORKSERVE_PIN_CPUS=auto|1|0)
    rollout_attempts: int  # tries of a rollout whose new worker died or timed out, and deaths that fail a version
    rollout_backoff: float  # seconds before the second try; doubled for each later one
    client_timeout: float  # seconds a client may stay silent in the middle of a request (body or headers)
    strict_readiness: bool = False  # ready only when every model of the repository serves (FORKSERVE_STRICT_READINESS)
    grpc_bind: str = DEFAULT_GRPC_BIND  # HOST:PORT every worker's gRPC server listens on ("" turns gRPC off)
    grpc_max_connection_age: float = 5.0  # seconds before a worker asks a gRPC client to reconnect (0: never; server.rpc.listener)
    grpc_max_connection_age_grace: float = 30.0  # ... and how long the calls in flight on it then have
    grpc_max_calls: int = 0  # gRPC calls at work at once per worker, more are refused (RESOURCE_EXHAUSTED); 0: 2 x threads
    payload_log: str = ""  # FORKSERVE_PAYLOAD_LOG: "file:DIR", "http(s)://URL" or "" (off; server.telemetry.payloads)
    payload_log_max_mb: float = 100.0  # FORKSERVE_PAYLOAD_LOG_MAX_MB: a worker's file is rotated past this size
    payload_log_queue: int = 1000  # FORKSERVE_PAYLOAD_LOG_QUEUE: records waiting for the writer; more are dropped
    payload_log_queue_mb: float = 64.0  # FORKSERVE_PAYLOAD_LOG_QUEUE_MB: ... and their bytes (bodies reach 32 MiB each)
    tls_cert: Path | None = None  # FORKSERVE_TLS_CERT: PEM certificate chain; with tls_key, TLS on both ports (server.tls)
    tls_key: Path | None = None  # FORKSERVE_TLS_KEY: its unencrypted PEM private key
    tls_client_ca: Path | None = None  # FORKSERVE_TLS_CLIENT_CA: PEM CAs; clients must present a certificate one of them signed
    model_control: str = "poll"  # FORKSERVE_MODEL_CONTROL: "poll" (the repository is the API) or "explicit" (load / unload calls)
    load_models: tuple[str, ...] = ()  # FORKSERVE_LOAD_MODELS: models explicit mode loads at start
    repository_api: bool = True  # FORKSERVE_REPOSITORY_API: the repository index, load and unload calls (0: refused, 403)
    repository_timeout: float = 600.0  # FORKSERVE_REPOSITORY_TIMEOUT: seconds a load or unload call waits for every worker
    tfserving_metrics_path: str = ""  # FORKSERVE_TFSERVING_METRICS_PATH: TF Serving's Prometheus path on the REST port ("": off)
    # TF Serving's model configuration (server.master.model_server_config; `python -m server tfserving` sets these):
    tfserving_model_config: Path | None = None  # FORKSERVE_TFSERVING_MODEL_CONFIG: a ModelServerConfig text-proto file
    tfserving_model: tuple[str, str] | None = None  # FORKSERVE_TFSERVING_MODEL: NAME=BASE_PATH, one model (--model_name)
    tfserving_model_config_poll: float = 0.0  # FORKSERVE_TFSERVING_MODEL_CONFIG_POLL: seconds between reads (0: once)
    tfserving_defaults: dict = field(default_factory=dict)  # FORKSERVE_TFSERVING_DEFAULTS: a JSON [defaults] table
    tfserving_labels_for_unavailable: bool = False  # FORKSERVE_TFSERVING_LABELS_FOR_UNAVAILABLE_MODELS
    warmup_records: bool = True  # FORKSERVE_WARMUP_RECORDS: replay assets.extra/tf_serving_warmup_requests (0: skip)
    new_versions: bool = True  # FORKSERVE_NEW_VERSIONS: look for new version directories (0: a model's versions when first seen)
    zygote: bool = True  # FORKSERVE_ZYGOTE: fork workers from a process that imported TensorFlow once (server.master.zygote)
    zygote_preload: tuple[str, ...] = ()  # FORKSERVE_ZYGOTE_PRELOAD: more modules the zygote imports (your handlers' libraries)

    @property
    def tfserving(self) -> bool:
        """Whether TF Serving's model configuration decides the served models."""
        return self.tfserving_model_config is not None or self.tfserving_model is not None

    @property
    def tls(self) -> bool:
        """Whether both ports speak TLS."""
        return self.tls_cert is not None

    @classmethod
    def from_env(cls) -> "Settings":
        """Build settings from FORKSERVE_* variables with documented defaults."""
        cpus = available_cpus()
        given = given_run_dir()
        # NOTE: the default name is unpredictable, and export() makes it with O_EXCL semantics (mkdir):
        # another local user can neither plant it nor anything in it. Nothing is created here.
        run_dir = _without_last_link(given) if given else (
            Path(tempfile.gettempdir()).resolve() / f"{run_directory.PREFIX}{os.getpid()}-{secrets.token_hex(6)}")
        multiproc_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        model_control = _model_control(os.environ.get("FORKSERVE_MODEL_CONTROL", "poll"))
        load_models = _load_models(os.environ.get("FORKSERVE_LOAD_MODELS", ""))
        if load_models and model_control != "explicit":  # NOTE: as Triton's --load-model: poll mode serves the whole repository
            raise ValueError("FORKSERVE_LOAD_MODELS needs FORKSERVE_MODEL_CONTROL=explicit (poll mode serves every model)")
        if model_control == "explicit" and (os.environ.get("FORKSERVE_TFSERVING_MODEL_CONFIG") or os.environ.get("FORKSERVE_TFSERVING_MODEL")):
            raise ValueError("FORKSERVE_MODEL_CONTROL=explicit does not go with TF Serving's model configuration, "
                             "which names the served models itself (HandleReloadConfigRequest changes them)")
        tls_cert, tls_key, tls_client_ca = _tls_files(
            os.environ.get("FORKSERVE_TLS_CERT", ""), os.environ.get("FORKSERVE_TLS_KEY", ""),
            os.environ.get("FORKSERVE_TLS_CLIENT_CA", ""))
        return cls(
            models_dir=_models_dir(os.environ.get("FORKSERVE_MODELS", "models")),
            conf_path=conf_path_from_env(),
            bind=os.environ.get("FORKSERVE_BIND", DEFAULT_BIND),
            workers=_env_int("FORKSERVE_WORKERS", cpus) or cpus,
            threads=_env_int("FORKSERVE_THREADS", DEFAULT_THREADS) or DEFAULT_THREADS,
            cpus=cpus,
            intra_op_threads=_env_int("FORKSERVE_INTRA_OP_THREADS", 0),
            inter_op_threads=_env_int("FORKSERVE_INTER_OP_THREADS", 1) or 1,
            max_body_bytes=_env_int("FORKSERVE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES) or DEFAULT_MAX_BODY_BYTES,
            log_level=os.environ.get("FORKSERVE_LOG_LEVEL", "info"),
            access_log=_env_flag("FORKSERVE_ACCESS_LOG"),
            gc_freeze=_env_flag("FORKSERVE_GC_FREEZE"),
            balance_connections=_env_flag("FORKSERVE_BALANCE_CONNECTIONS"),
            fast_predict=_env_flag("FORKSERVE_FAST_PREDICT"),
            slow_request_ms=_env_milliseconds("FORKSERVE_SLOW_REQUEST_MS", 1000.0),
            run_dir=run_dir,
            metrics_dir=Path(multiproc_dir).resolve() if multiproc_dir else run_dir / "metrics",  # never through a link in the run directory
            multiprocess_metrics=bool(multiproc_dir),
            poll_interval=_env_seconds("FORKSERVE_POLL_INTERVAL", 2.0),
            boot_timeout=_env_seconds("FORKSERVE_BOOT_TIMEOUT", 300.0),
            pin_cpus=_pin_mode(os.environ.get("FORKSERVE_PIN_CPUS", "auto")),
            rollout_attempts=_env_int("FORKSERVE_ROLLOUT_ATTEMPTS", 3) or 1,
            rollout_backoff=_env_seconds("FORKSERVE_ROLLOUT_BACKOFF", 5.0),
            client_timeout=_env_seconds("FORKSERVE_CLIENT_TIMEOUT", 15.0),
            strict_readiness=_env_flag("FORKSERVE_STRICT_READINESS", "0"),
            grpc_bind=os.environ.get("FORKSERVE_GRPC_BIND", DEFAULT_GRPC_BIND).strip(),
            grpc_max_connection_age=_env_seconds_or_off("FORKSERVE_GRPC_MAX_CONNECTION_AGE", 5.0),
            grpc_max_connection_age_grace=_env_seconds("FORKSERVE_GRPC_MAX_CONNECTION_AGE_GRACE", 30.0),
            grpc_max_calls=_env_int("FORKSERVE_GRPC_MAX_CALLS", 0),
            payload_log=_payload_sink(os.environ.get("FORKSERVE_PAYLOAD_LOG", "")),
            payload_log_max_mb=_env_seconds("FORKSERVE_PAYLOAD_LOG_MAX_MB", 100.0),  # NOTE: "seconds": any positive number
            payload_log_queue=_env_int("FORKSERVE_PAYLOAD_LOG_QUEUE", 1000) or 1000,
            payload_log_queue_mb=_env_seconds("FORKSERVE_PAYLOAD_LOG_QUEUE_MB", 64.0),
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=tls_client_ca,
            model_control=model_control,
            load_models=load_models,
            repository_api=_env_flag("FORKSERVE_REPOSITORY_API", "1"),
            repository_timeout=_env_seconds("FORKSERVE_REPOSITORY_TIMEOUT", 600.0),
            tfserving_metrics_path=_tfserving_metrics_path(os.environ.get("FORKSERVE_TFSERVING_METRICS_PATH", "")),
            tfserving_model_config=_absolute_or_none(os.environ.get("FORKSERVE_TFSERVING_MODEL_CONFIG", "")),
            tfserving_model=_one_model(os.environ.get("FORKSERVE_TFSERVING_MODEL", "")),
            tfserving_model_config_poll=_env_zero_or_positive("FORKSERVE_TFSERVING_MODEL_CONFIG_POLL", 0.0, "seconds", "read once"),
            tfserving_defaults=_json_table("FORKSERVE_TFSERVING_DEFAULTS"),
            tfserving_labels_for_unavailable=_env_flag("FORKSERVE_TFSERVING_LABELS_FOR_UNAVAILABLE_MODELS", "0"),
            warmup_records=_env_flag("FORKSERVE_WARMUP_RECORDS"),
            new_versions=_env_flag("FORKSERVE_NEW_VERSIONS"),
            zygote=_env_flag("FORKSERVE_ZYGOTE"),
            zygote_preload=_module_names(os.environ.get("FORKSERVE_ZYGOTE_PRELOAD", "")),
        )

    @classmethod
    def current(cls) -> "Settings":
        """This process's settings, resolved once (a worker inherits the master's through fork).

        NOTE: resolved in the master before any worker is pinned, so `cpus` is the whole machine's
        count in every process; a pinned worker's own affinity mask would say one slot's.
        """
        global _current
        if _current is None:
            _current = cls.from_env()
        return _current

    def export(self) -> None:
        """Master only: make or check the run directory (server.run_dir), and pin the paths in the environment for the workers.

        Raises run_dir.RunDirError (one line: the directory and the errno) when it cannot be used.
        NOTE: must run before prometheus_client is first imported: it picks its multiprocess
        value class from PROMETHEUS_MULTIPROC_DIR at import time.
        """
        run_directory.prepare(self.run_dir, self.metrics_dir)
        os.environ["FORKSERVE_RUN_DIR"] = str(self.run_dir)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)

    def pins_for(self, workers: int) -> bool:
        """Whether to pin `workers` workers; auto: when each gets whole CPUs and no cgroup quota is narrower than the mask.

        Master only: `workers` is gunicorn's configured count (-w wins over FORKSERVE_WORKERS), and
        a pinned worker's own affinity mask would make the check see one slot's CPUs.
        """
        if self.pin_cpus != "auto":
            return self.pin_cpus == "on"
        unlimited = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) == self.cpus
        return unlimited and 2 <= workers <= self.cpus and self.intra_op_threads <= self.cpus // workers

    def worker_environment(self, intra: int) -> dict[str, str]:
        """The variables a worker sets before TensorFlow, grpc and OpenBLAS load (the zygote, before it imports them).

        OpenMP, oneDNN and OpenBLAS read their thread counts once, when they load.
        """
        environment = {"OMP_NUM_THREADS": str(intra), "TF_NUM_INTRAOP_THREADS": str(intra),
                       "TF_NUM_INTEROP_THREADS": str(self.inter_op_threads),
                       "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
        if self.tls:
            # NOTE: grpc-core logs every failed TLS handshake (a plaintext client, a port scan, a client without
            # its certificate) as an unformatted INFO line on stderr, one per connection. Read when grpc is imported.
            environment["GRPC_VERBOSITY"] = os.environ.get("GRPC_VERBOSITY", "ERROR")
        return environment

    def intra_op_for(self, workers: int) -> int:
        """TensorFlow intra-op threads for one worker when `workers` share the CPUs."""
        if self.intra_op_threads:
            return self.intra_op_threads
        return max(1, self.cpus // max(1, workers))


def split_address(bind: str) -> tuple[str, int]:
    """("host", port) of a gRPC bind: HOST:PORT, [IPv6]:PORT or :PORT (every address)."""
    host, colon, port = bind.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) <= 65535:
        # NOTE: port 0 would give every worker a port of its own that no client knows
        raise ValueError(f"FORKSERVE_GRPC_BIND must be HOST:PORT with a port from 1 to 65535, got {bind!r}")
    return host.strip("[]") or "0.0.0.0", int(port)
