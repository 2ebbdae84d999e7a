"""The models one worker serves: their versions, load states and executors.

Loading runs in the worker after fork (post_worker_init), before it accepts a request. No
TensorFlow at import time: runtime is imported inside `load_all`, in the worker.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from server.config import ConfigError, ModelConfig, ServerConfig
from server.errors import NotFound, Unavailable, VersionFailed
from server.models import warmup_records
from server.models.executor import ModelExecutor
from server.models.handlers import (
    Handler,
    HandlerError,
    check_example,
    check_signature,
    discard,
    handler_module_name,
    has_handler,
    load_handler,
)
from server.repository import VersionSource, model_dir, scan, select_versions
from server.settings import Settings
from server.signature import SignatureInfo
from server.target import (
    ConfigProblem,
    Target,
    describe_problem,
    failed_reason,
    read_failed,
    read_target,
)
from server.telemetry import metrics

log = logging.getLogger("forkserve.models")

# TF Serving's ManagerState names; a version that failed to load is END with an error status.
START, LOADING, AVAILABLE, END = "START", "LOADING", "AVAILABLE", "END"


@dataclass
class ModelVersion:
    """One version of one model in this worker."""

    source: VersionSource
    config: ModelConfig
    state: str = START
    error: str = ""
    load_seconds: float = 0.0
    servable: Any = None
    executor: ModelExecutor | None = None
    handler: Handler | None = None  # the version's handler.py, when conf/models.toml turns handlers on

    @property
    def name(self) -> str:
        return self.source.model

    @property
    def version(self) -> int:
        return self.source.version

    def signature(self, name: str) -> SignatureInfo:
        """A signature by name, or NotFound listing the ones there are."""
        signatures = self.servable.signatures
        if name not in signatures:
            raise NotFound(
                f"signature {name!r} not found in model {self.name} version {self.version}; "
                f"it has {sorted(signatures)}"
            )
        return signatures[name]

    def status(self) -> dict[str, Any]:
        """TF Serving's model_version_status entry."""
        return {
            "version": str(self.version),
            "state": self.state,
            "status": {"error_code": "UNKNOWN" if self.error else "OK", "error_message": self.error},
        }


@dataclass
class Model:
    """A model name, its settings and the versions this worker tried to load (newest first)."""

    name: str
    config: ModelConfig
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    failed: Callable[[int], str | None] = lambda version: None  # why the master marked a version failed
    unservable: str = ""  # why the master left this model out of the target (a model this worker never loaded)

    def available(self) -> list[ModelVersion]:
        """Versions that serve, newest first."""
        return sorted((v for v in self.versions.values() if v.state == AVAILABLE), key=lambda v: -v.version)

    def resolve(self, version: int | None = None, label: str | None = None) -> ModelVersion:
        """The version a request addresses: explicit, by label, or the latest available."""
        if label is not None:
            if label not in self.config.labels:
                raise NotFound(f"label {label!r} not found for model {self.name}")
            version = self.config.labels[label]
        if version is None:
            ready = self.available()
            if ready:
                return ready[0]
            raise self._not_serving()
        found = self.versions.get(version)
        if found is None:
            reason = self.failed(version)
            if reason is not None:  # never loaded here because a rollout failed it: say so, as the status does
                raise VersionFailed(f"model {self.name} version {version} is {END}: {reason}")
            raise NotFound(f"Servable not found for request: Specific({self.name}, {version})")
        if found.state != AVAILABLE:
            detail = f": {found.error}" if found.error else ""
            raise (VersionFailed if found.state == END else Unavailable)(f"model {self.name} version {version} is {found.state}{detail}")
        return found

    def _not_serving(self) -> Exception:
        """Why no version of this model can answer."""
        loading = [v.version for v in self.versions.values() if v.state in (START, LOADING)]
        if loading:
            return Unavailable(f"model {self.name} is loading version(s) {loading}")
        failed = [f"version {v.version}: {v.error}" for v in self.versions.values() if v.error]
        if failed:
            return VersionFailed(f"model {self.name} has no version that loaded ({'; '.join(failed)})")
        return NotFound(f"Servable not found for request: Latest({self.name})" + (f": {self.unservable}" if self.unservable else ""))


class ModelRegistry:
    """Every model this worker serves, by name."""

    def __init__(
        self, models_dir: Path | None, run_dir: Path | None = None, config: ServerConfig | Callable[[], ServerConfig] | None = None,
        strict_readiness: bool = False,
    ) -> None:
        self.models_dir = models_dir
        self.run_dir = run_dir
        self.strict_readiness = strict_readiness  # ready only when every model serves (FORKSERVE_STRICT_READINESS)
        self._fallback_config = config  # used only when no master published a target
        self.config = ServerConfig()
        self.models: dict[str, Model] = {}
        self.loaded = False
        self.generation = ""  # the master's target this worker loaded ("" without a master)
        self.problem = ""  # why nothing could be loaded (a broken configuration without a master)
        self.listener_problem = ""  # why this worker's gRPC server could not start (the worker is then not ready)

    def get(self, name: str) -> Model:
        """A model by name (one the master reports unservable too), or TF Serving's NotFound."""
        model = self.models.get(name) or self._unservable_model(name, read_target(self.run_dir) if self.run_dir else None)
        if model is None:
            raise NotFound(f"Servable not found for request: Latest({name})")
        return model

    def _unservable_model(self, name: str, target: Target | None) -> Model | None:
        """A model the master left out of the target, as a model whose versions all ended: None if it did not.

        NOTE: built per call from the master's reports, so a version that failed in a rollout
        answers END with its reason on every API, as the same failure at this worker's boot does.
        """
        if self.run_dir is None:
            return None
        reason = target.unservable.get(name, "") if target is not None else ""
        failed = read_failed(self.run_dir).get(name, {})
        if not reason and not failed:
            return None
        model = Model(name, self.config.for_model(name), unservable=reason)
        for version, entry in sorted(failed.items(), reverse=True):
            directory = model_dir(self.models_dir, self.config, name) or Path(name)
            source = VersionSource(name, version, directory / str(version), "", entry.reason)
            model.versions[version] = ModelVersion(source, model.config, state=END, error=entry.reason)
        return model

    def plan(self) -> list[tuple[Model, list[VersionSource], int]]:
        """Register each model with the versions to try: the master's target, else a scan."""
        target = read_target(self.run_dir) if self.run_dir is not None else None
        plan = []
        if target is None:
            try:
                fallback = self._fallback_config
                self.config = fallback() if callable(fallback) else (fallback or ServerConfig())
            except ConfigError as exc:  # NOTE: never raise here: a worker boot error halts gunicorn
                self.problem = str(exc)
                log.error("forkserve: %s; serving no models", exc)
                return []
            for name, sources in scan(self.models_dir, self.config).items():
                candidates, keep = select_versions(sources, self.config.for_model(name))
                plan.append((name, candidates, keep))
        else:
            self.config, self.generation = target.config, target.generation
            found = scan(self.models_dir, self.config)
            for name, wanted in target.models.items():
                by_version = {source.version: source for source in found.get(name, [])}
                plan.append((name, [by_version[v] for v in wanted.candidates if v in by_version], wanted.keep))
        return [(self._register(name), candidates, keep) for name, candidates, keep in plan]

    def _register(self, name: str) -> Model:
        """The model `name`, created on first use with its settings and the master's failed list."""
        model = self.models.get(name)
        if model is None:
            run_dir = self.run_dir
            lookup = (lambda version: failed_reason(run_dir, name, version)) if run_dir is not None else Model.failed
            model = self.models[name] = Model(name, self.config.for_model(name), failed=lookup)
        return model

    def statuses(self, name: str) -> list[dict[str, Any]]:
        """model_version_status of every version this worker tried, and of versions a rollout failed."""
        model = self.get(name)
        entries = {v.version: v.status() for v in model.versions.values()}
        if self.run_dir is not None:
            for version, failed in read_failed(self.run_dir).get(name, {}).items():
                if version not in entries or model.versions[version].state != AVAILABLE:
                    entries[version] = {
                        "version": str(version),
                        "state": END,
                        "status": {"error_code": "UNKNOWN", "error_message": failed.reason},
                    }
        if not entries and model.unservable:
            raise NotFound(f"Servable not found for request: Latest({name}): {model.unservable}")
        return [entries[v] for v in sorted(entries, reverse=True)]

    def load_all(
        self, intra_op_threads: int, inter_op_threads: int,
        loading: Callable[[str, int], None] = lambda model, version: None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        """Load, warm and start every selected version; failures are recorded, never raised.

        `loading(model, version)` is called before each load (the worker reports its progress);
        `stopping()` true ends the loading early (the worker was told to exit meanwhile).
        """
        plan = self.plan()
        if not any(candidates for _, candidates, _ in plan):
            self.loaded = True
            return
        from server.models import (
            runtime,  # NOTE: the first TensorFlow import of this worker
        )

        runtime.configure_threads(intra_op_threads, inter_op_threads)
        for model, candidates, keep in plan:
            loaded = 0
            for source in candidates:
                if loaded >= keep or stopping():
                    break
                entry = ModelVersion(source, model.config)
                model.versions[source.version] = entry
                loading(model.name, source.version)
                if self._load_version(entry, runtime, stopping):
                    loaded += 1
            if not candidates:
                log.warning("model %s: no version directory found under %s", model.name,
                            model_dir(self.models_dir, self.config, model.name))
        self.loaded = True

    def _load_version(self, entry: ModelVersion, runtime: Any, stopping: Callable[[], bool] = lambda: False) -> bool:
        """Load and warm one version; on any failure mark it END with the reason (its handler's SystemExit too)."""
        entry.state = LOADING
        labels = (entry.name, str(entry.version))
        metrics.record(lambda: metrics.MODEL_WORKERS_LOADING.labels(*labels).inc())
        # The series exist (at 0) even when this version never loads.
        metrics.record(lambda: metrics.MODEL_WORKERS_READY.labels(*labels).set(0))
        metrics.record(lambda: metrics.MODEL_LOAD_FAILURES.labels(*labels))
        metrics.record(lambda: metrics.MODEL_RETRACES.labels(entry.name))
        started = time.monotonic()
        handler = None
        try:
            servable = runtime.load_servable(entry.source)
            handler = load_version_handler(entry)
            calls = servable.warm_up(entry.config.batch_buckets)
            records = warmup_records.replay(entry.source, entry.config, servable) if Settings.current().warmup_records else None
            if handler is not None:
                check_signature(handler, servable.signatures)
                check_example(handler, servable.signatures, entry.config, servable.run)
        except Exception as exc:  # a bad model must never take the worker down
            if isinstance(exc.__cause__, SystemExit) and stopping():
                raise exc.__cause__  # NOTE: gunicorn's SIGQUIT handler raised it in this thread: the worker's own exit
            if handler is not None:  # loaded, then warm-up or its example failed: nothing of it stays
                discard(handler)
            entry.state, entry.error = END, f"failed to load: {type(exc).__name__}: {exc}".strip()[:2000]
            entry.load_seconds = time.monotonic() - started
            metrics.record(lambda: metrics.MODEL_WORKERS_LOADING.labels(*labels).dec())
            metrics.record(lambda: metrics.MODEL_LOAD_FAILURES.labels(*labels).inc())
            log.error("model %s version %s failed to load after %.2fs: %s", entry.name, entry.version, entry.load_seconds, entry.error)
            return False
        entry.servable, entry.handler = servable, handler
        entry.executor = ModelExecutor(
            f"{entry.name}/{entry.version}",
            servable.run,
            entry.config.max_batch_size,
            entry.config.max_batch_delay_ms / 1000.0,
            entry.config.max_queue_rows,
            traces=servable.traces,
            model=entry.name,
            buckets=entry.config.padded_batch_sizes,
            version=str(entry.version),
        )
        entry.executor.start()
        entry.state = AVAILABLE
        entry.load_seconds = time.monotonic() - started
        metrics.record(lambda: metrics.MODEL_WORKERS_LOADING.labels(*labels).dec())
        metrics.record(lambda: metrics.MODEL_WORKERS_READY.labels(*labels).set(1))
        metrics.record(lambda: metrics.MODEL_LOAD_SECONDS.labels(entry.name).observe(entry.load_seconds))
        replayed = "" if records is None else f", {records} warm-up records replayed"
        log.info(
            "model %s version %s (%s) loaded and warmed (%d calls%s) in %.2fs",
            entry.name, entry.version, entry.source.format, calls, replayed, entry.load_seconds,
        )
        for signature, why in getattr(servable, "unwarmed", {}).items():
            log.info("model %s version %s: signature %s not warmed (%s); its first requests trace it",
                     entry.name, entry.version, signature, why)
        return True

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when loading is over and some model serves (or the repository holds none); strict: every model serves.

        Each model's entry names its failed versions and, while conf/models.toml is broken, the
        configuration problem that affects it (the worker keeps serving with the last good one).
        Models the master left out (every version failed, no version directory) are listed with
        their reason; they make the worker unready only under strict readiness.
        """
        target = read_target(self.run_dir) if self.run_dir is not None else None
        failed_here = read_failed(self.run_dir) if self.run_dir is not None else {}
        problem = self._config_problem(target)
        unservable = target.unservable if target is not None else {}
        report: dict[str, Any] = {}
        for name in sorted(set(self.models) | set(unservable)):
            model = self.models.get(name) or self._unservable_model(name, target)
            if model is None:
                continue
            serving = [v.version for v in model.available()]
            states = {str(v.version): v.state for v in model.versions.values()}
            failed = {str(v.version): v.error for v in model.versions.values() if v.error}
            failed.update({str(v): f.reason for v, f in failed_here.get(name, {}).items() if v not in serving})
            report[name] = {"serving": serving, "states": states, **({"failed": failed} if failed else {}),
                            **({"reason": model.unservable} if model.unservable else {}),
                            **describe_problem(problem, name)}
        served = [name for name, entry in report.items() if entry["serving"]]
        if self.strict_readiness:
            enough = len(served) == len(report)
        else:
            enough = bool(served) or not report
        return self.loaded and not self.problem and not self.listener_problem and enough, report

    def _config_problem(self, target: Target | None) -> ConfigProblem | None:
        """What the master says is wrong with conf/models.toml now (None when it is fine)."""
        if self.problem:
            return ConfigProblem(self.problem)
        return target.config_problem if target is not None else None


def load_version_handler(entry: ModelVersion) -> Handler | None:
    """The version's handler (imported, set up), None without one; HandlerError when it cannot be used.

    NOTE: a handler is code; it runs only where conf/models.toml says `handler = true`. A
    version that ships one without that fails: serving it without its handler would answer
    its clients in another shape.
    """
    if not has_handler(entry.source.path):
        return None
    if not entry.config.handler:
        raise HandlerError(
            f"version {entry.version} has a handler.py, but handlers are off for model {entry.name} "
            f"(set handler = true under [models.{entry.name}] in {Settings.current().conf_path}); "
            "it is not served without it"
        )
    label = f"model {entry.name} version {entry.version}"
    handler = load_handler(entry.source.path, handler_module_name(entry.name, entry.version), label)
    if handler.example is None:
        log.warning("%s: its handler has no example, so nothing checked preprocess and postprocess before it "
                    "serves; set Handler.example to a request body (docs/handlers.md)", label)
    metrics.record(lambda: metrics.REJECTED_REQUESTS.labels(entry.name, "handler_stuck"))  # the series exists at 0
    return handler
