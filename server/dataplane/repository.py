"""Triton's model repository extension, the same on every transport: the index, load and unload; TF Serving's config reload.

Runs in workers. A load or unload is the master's work (server.master.rollout.control): the call
writes its request into the run directory (server.control) and its flow waits for the answer, which
comes once every worker serves the model (or no longer does), through the readiness-gated rollout.
The wait is a flow's Wait (server.models.flow): a request thread blocks on it, the gRPC loop awaits
it without a thread. Each call is logged, with the client's address and its answer.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

from server import control
from server.dataplane.requests import model_address
from server.config import ConfigError
from server.errors import ApiError, FailedPrecondition, InvalidArgument, ResourceExhausted, Unknown
from server.models.flow import Steps, Wait
from server.models.registry import ModelRegistry
from server.models.reply import Reply, ReplyTimeout
from server.protocols.tfserving import config_files
from server.protocols.v2.repository import override_table
from server.settings import Settings

log = logging.getLogger("forkserve.repository")

ANSWER_POLL = 0.1  # seconds between a worker's looks for its calls' answers
RETIRE_WAIT = 10.0  # seconds a retiring worker's call waits for it to stop accepting before it answers anyway
STOP_KEEPALIVE_LINGER = 2.0  # gunicorn 27 gthread's: a stopping worker closes its idle keep-alive connections by then
STOPPED_GRACE = 1.0  # seconds a stopping worker's call still waits for the master's answer before it answers 503
STOPPED_ACCEPTING = control.STOPPED_ACCEPTING  # set once this worker stopped accepting for good


class Forbidden(ApiError):
    """PERMISSION_DENIED: the repository calls are turned off (403)."""

    status = 403


class PendingCall:
    """A load or unload waiting for the master's answer: a flow's job, with the reply the answer completes."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.future = Reply()


class AnswerWatch:
    """One thread per worker that hands each waiting call the master's answer, started at the first call."""

    def __init__(self) -> None:
        self._waiting: dict[str, PendingCall] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._run_dir: Path | None = None

    def watch(self, run_dir: Path, request_id: str) -> PendingCall:
        """The call to wait on; its answer arrives within ANSWER_POLL of the master writing it."""
        call = PendingCall(request_id)
        with self._lock:
            self._run_dir = run_dir
            self._waiting[request_id] = call
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="forkserve-repository", daemon=True)
                self._thread.start()
        return call

    def abandon(self, call: PendingCall) -> None:
        """The client left or its time ran out: stop waiting (the master still does what it took up)."""
        with self._lock:
            self._waiting.pop(call.request_id, None)
        if self._run_dir is not None:
            control.withdraw(self._run_dir, call.request_id)
        call.future.cancel()

    def _run(self) -> None:
        """Watch thread: look for answers while calls wait; ends when none does.

        NOTE: a worker that stops (a rollout retiring it) before the master answered its call answers
        503 within STOPPED_GRACE instead of holding its retirement up to graceful_timeout; the master
        still does what it took up. A call the master answers as it retires the worker (its caller)
        has its answer written before the stop, and finds it first.
        """
        stop = threading.Event()
        stopped_at: float | None = None
        while True:
            with self._lock:
                waiting, run_dir = list(self._waiting.values()), self._run_dir
                if not waiting:
                    self._thread = None
                    return
            for call in waiting:
                found = control.take_answer(run_dir, call.request_id) if run_dir is not None else None
                if found is not None:
                    with self._lock:
                        self._waiting.pop(call.request_id, None)
                    call.future.set_result(found)
            if STOPPED_ACCEPTING.is_set():
                stopped_at = stopped_at or time.monotonic()
                if time.monotonic() - stopped_at > STOPPED_GRACE:
                    self._give_up_stopping()
            stop.wait(ANSWER_POLL)

    def _give_up_stopping(self) -> None:
        """Watch thread, the worker stopping: the calls still without an answer end with 503."""
        with self._lock:
            waiting, self._waiting = list(self._waiting.values()), {}
        for call in waiting:
            call.future.set_exception(ApiError(
                "this worker stopped (a rolling restart) before the master answered: the call goes on; see the "
                "repository index or the models' status, or call again", status=503))


ANSWERS = AnswerWatch()


def check_enabled(settings: Settings) -> None:
    """Forbidden unless the repository calls are on."""
    if not settings.repository_api:
        raise Forbidden("the model repository API is turned off on this server (FORKSERVE_REPOSITORY_API=0)")


def repository_index(registry: ModelRegistry, settings: Settings, ready_only: bool, peer: str) -> list[dict[str, str]]:
    """RepositoryIndex: every model of the repository with its state and reason (a served one per version)."""
    check_enabled(settings)
    log.info("repository: index asked by %s", peer or "?")
    entries = []
    for name, entry in sorted(control.read_index(settings.run_dir).items()):
        state, reason = str(entry.get("state", "")), str(entry.get("reason", ""))
        model = registry.models.get(name)
        serving = [str(v.version) for v in model.available()] if model is not None else []
        if state == control.READY and serving:
            entries += [{"name": name, "version": version, "state": control.READY, "reason": ""} for version in serving]
        elif not ready_only:
            entries.append({"name": name, "version": "", "state": state, "reason": reason})
    return entries


def change(settings: Settings, action: str, name: str, config_json: str | bytes | None, peer: str) -> Steps[str]:
    """RepositoryModelLoad / RepositoryModelUnload: ask the master, wait for every worker; the answer's message."""
    check_enabled(settings)
    name = model_address(name, None)[0]
    if settings.model_control != "explicit":
        log.warning("repository: %s of %r by %s refused: model control is poll", action, name, peer or "?")
        raise InvalidArgument(f"failed to {action} '{name}': explicit model load / unload is not allowed: "
                              "FORKSERVE_MODEL_CONTROL=poll serves every model of the repository "
                              "(publish or remove a version directory instead)")
    override = override_table(name, config_json) if action == "load" and config_json else {}
    ok, message = yield from _ask_master(settings, action, name, override, peer, f"{action} of '{name}'")
    if not ok:
        raise InvalidArgument(message)
    return message


def reload_config(settings: Settings, model_config: str, peer: str) -> Steps[str]:
    """TF Serving's HandleReloadConfigRequest: the ModelServerConfig (text form) replaces the served set, through a rollout.

    Answers once every worker serves each model it names; a model that cannot load fails the call
    and the set before it keeps serving. Refused like the repository calls (FORKSERVE_REPOSITORY_API=0).
    """
    check_enabled(settings)
    if not settings.tfserving:
        raise ApiError("HandleReloadConfigRequest needs a server started with TF Serving's model configuration "
                       "(python -m server tfserving --model_config_file=... or --model_base_path=...); this one serves "
                       "its repository: publish a version or edit conf/models.toml instead", status=501)
    try:
        parsed = config_files.model_server_config(model_config, "config")
        if parsed.WhichOneof("config") != "model_config_list":
            raise InvalidArgument("ServerModelConfig type not supported by HandleReloadConfigRequest. "
                                  "Only ModelConfigList is currently supported")
        config_files.model_tables(parsed, "config")
    except ConfigError as exc:
        raise InvalidArgument(str(exc)) from None
    if len(json.dumps(model_config)) > control.MAX_REQUEST_CONFIG_BYTES:  # NOTE: as the master will read it back
        raise ResourceExhausted(f"the configuration is larger than {control.MAX_REQUEST_CONFIG_BYTES // 1024} KiB "
                                "as forkserve stores it; serve that many models from several servers")
    ok, message = yield from _ask_master(settings, control.RELOAD_CONFIG, "", {"model_config": model_config}, peer,
                                         "reload of the model configuration")
    if not ok:
        if message.startswith("Request to assign label"):
            raise FailedPrecondition(message)
        if message.startswith("failed to load model"):
            raise Unknown(message)
        raise InvalidArgument(message)
    return message


def _ask_master(settings: Settings, action: str, name: str, override: dict[str, Any], peer: str, what: str
                ) -> Steps[tuple[bool, str]]:
    """Write the call for the master and wait for its answer; a caller being retired answers after it stopped accepting."""
    try:
        request_id = control.ask(settings.run_dir, action, name, override)
    except OSError as exc:
        raise ApiError(f"the {what} failed: the run directory refused the request: {exc}", status=503) from None
    log.info("repository: %s asked by %s (request %s%s)", what, peer or "?", request_id,
             f", config {override}" if override else "")
    call = ANSWERS.watch(settings.run_dir, request_id)
    try:
        ok, message, retiring = yield Wait(ANSWERS, call, settings.repository_timeout)
    except ReplyTimeout:
        ANSWERS.abandon(call)
        raise ApiError(f"the {what} did not finish within {settings.repository_timeout:.0f}s "
                       "(FORKSERVE_REPOSITORY_TIMEOUT); it may still complete: see the repository index",
                       status=504) from None
    except CancelledError:
        ANSWERS.abandon(call)
        raise
    log.info("repository: %s (request %s): %s", what, request_id, message)
    if ok and retiring:
        yield from _leave_last(settings)
    return ok, message


def _leave_last(settings: Settings) -> Steps[None]:
    """This worker is being replaced: answer once a client's next request can only reach the new workers.

    NOTE: the master answers as it retires this worker, the last one on the old set. Once it stopped
    accepting, what could still reach it is a connection it holds: an idle keep-alive one (gunicorn
    closes those within STOP_KEEPALIVE_LINGER of the stop) and a gRPC channel (grpc-core's GOAWAY
    moves it at the connection's age, FORKSERVE_GRPC_MAX_CONNECTION_AGE). The answer waits for both,
    whichever transport the call came on: a client may load over REST and infer over gRPC.
    """
    pending = PendingCall("retiring")
    grpc_age = settings.grpc_max_connection_age * 1.1 if settings.grpc_bind else 0.0
    linger = max(STOP_KEEPALIVE_LINGER, grpc_age) + 0.25

    def wait_then_answer() -> None:
        STOPPED_ACCEPTING.wait(RETIRE_WAIT)
        time.sleep(linger)
        pending.future.set_result(None)

    threading.Thread(target=wait_then_answer, name="forkserve-repository-retire", daemon=True).start()
    yield Wait(ANSWERS, pending, RETIRE_WAIT + linger + 1.0)


def load_config_parameter(parameters: Any) -> str | bytes | None:
    """The `config` parameter of a load (REST's JSON object, or gRPC's parameter map, as plain values)."""
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise InvalidArgument("parameters must be an object")
    unknown = sorted(key for key in parameters if key != "config")
    if unknown:
        raise InvalidArgument(f"unsupported load parameter(s) {unknown}: forkserve takes config (a JSON ModelConfig); "
                              "model files come from the repository, never from the call")
    value = parameters.get("config")
    if value is not None and not isinstance(value, (str, bytes)):
        raise InvalidArgument("the config parameter must be a string holding a JSON ModelConfig")
    return value
