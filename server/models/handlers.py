"""A model version's own Python: `handler.py` beside the model, loaded in the worker after fork.

A team's pre- and post-processing (decoding, feature scaling, label maps, the response shape
its clients parse) lives in `<name>/<version>/handler.py` as `class Handler`, every method
optional:

    setup(self, version_dir: pathlib.Path) -> None        worker, after fork, before warm-up
    preprocess(self, body: dict) -> dict[str, ndarray]     request thread: the JSON body -> model inputs
    postprocess(self, outputs: dict[str, ndarray], body: dict) -> Any   request thread: rows -> response
    redact(self, body: dict) -> Any, redact_tensors(self, inputs: dict[str, ndarray]) -> dict
                                                           payload-log writer thread: what a record may show

and, optionally, class attributes `example` (a request body warm-up and publish run through
both methods), `signature_name` (the signature preprocess feeds; default serving_default),
`request_schema` and `response_schema` (JSON Schema for /openapi.json and the metadata).

The model's TensorFlow call stays in its executor thread: a handler never calls the model, so
requests through a handler are batched like any other. preprocess and postprocess run on the
version's own threads (server.models.handler_pool), bounded by the request's deadline; what they
raise is sorted into the client's fault or the handler's in server.dataplane.handler_flow. Whatever a
handler raises (SystemExit and KeyboardInterrupt included) fails its request or its version,
never the worker. Runs in workers and in `publish`'s validation child; imports no TensorFlow itself.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from server.models.handler_pool import (
    HandlerPool,
    HandlerRaised,
    HandlerStuck,
    HandlerTimeout,
)
from server.settings import Settings
from server.signature import DEFAULT_SIGNATURE

HANDLER_FILE = "handler.py"


class HandlerError(Exception):
    """The handler cannot be used: it does not import, has no Handler, or its setup or example fails."""


def has_handler(version_dir: Path) -> bool:
    """Whether a version directory holds a handler.py."""
    return (version_dir / HANDLER_FILE).is_file()


@dataclass(frozen=True)
class Handler:
    """A loaded handler: the instance and what it declares."""

    instance: Any
    preprocess: Callable[[dict], dict] | None
    postprocess: Callable[[dict, dict], Any] | None
    signature_name: str
    example: dict | None
    request_schema: dict | None
    response_schema: dict | None
    module_name: str
    pool: HandlerPool  # the threads preprocess and postprocess run on
    redact: Callable[[Any], Any] | None = None  # the payload log's writer applies it to a logged handler body (docs/handlers.md)
    redact_tensors: Callable[[dict], Any] | None = None  # ... and this to the decoded inputs of a request that bypasses the handler

    def describe(self) -> dict[str, Any]:
        """What metadata and /openapi.json say about this handler."""
        return {
            "preprocess": self.preprocess is not None,
            "postprocess": self.postprocess is not None,
            "signature_name": self.signature_name,
            "request_schema": self.request_schema if self.request_schema is not None else "free-form",
            "response_schema": self.response_schema if self.response_schema is not None else "free-form",
            "v2_infer": "the model's own input and output tensors; the handler is not called",
        }


def load_handler(version_dir: Path, module_name: str, label: str = "") -> Handler:
    """Import handler.py from `version_dir` under `module_name`, build the Handler and run its setup.

    `label` ("model NAME version N"; handler.py without one) names its threads and log lines.
    """
    path = version_dir / HANDLER_FILE
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise HandlerError(f"{path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # NOTE: a name of its own per model version: versions never share code
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # SyntaxError, ImportError, SystemExit: anything at module level
        sys.modules.pop(module_name, None)
        raise HandlerError(f"handler.py failed to import: {describe_failure(exc)}") from exc
    try:
        return _build(module, version_dir, module_name, label or HANDLER_FILE)
    except HandlerError:
        sys.modules.pop(module_name, None)  # a version that is not served leaves no module behind
        raise


def discard(handler: Handler) -> None:
    """Forget a handler whose version will not be served: its module and idle threads go.

    NOTE: there is no teardown hook (docs/handlers.md): the instance, and with it what `setup`
    opened, is released when the last reference to it goes.
    """
    sys.modules.pop(handler.module_name, None)
    handler.pool.close()


def handler_module_name(model: str, version: int) -> str:
    """A module name of its own for each model version: `a-b`, `a.b` and `a_b` never share one."""
    escaped = re.sub(r"[^A-Za-z0-9]", lambda match: f"_{ord(match[0]):x}_", model)
    return f"forkserve_handler_{escaped}_v{version}"


def _build(module: Any, version_dir: Path, module_name: str, label: str) -> Handler:
    """The Handler of an imported handler.py, set up; HandlerError when it cannot be used."""
    cls = getattr(module, "Handler", None)
    if not isinstance(cls, type):
        raise HandlerError("handler.py defines no class Handler")
    try:
        instance = cls()
        setup = getattr(instance, "setup", None)
        if setup is not None:
            setup(version_dir)
    except BaseException as exc:  # NOTE: SystemExit(3) here once halted the whole server (gunicorn's boot code)
        # __cause__ keeps the original: the registry tells a worker's own quit (SIGQUIT) from the handler's.
        raise HandlerError(f"Handler setup failed: {describe_failure(exc)}") from exc
    example = getattr(instance, "example", None)
    if example is not None and not isinstance(example, dict):
        raise HandlerError(f"Handler.example must be a dict (a request body), got {type(example).__name__}")
    return Handler(
        instance=instance,
        preprocess=getattr(instance, "preprocess", None),
        postprocess=getattr(instance, "postprocess", None),
        signature_name=str(getattr(instance, "signature_name", DEFAULT_SIGNATURE)),
        example=example,
        request_schema=_schema(instance, "request_schema"),
        response_schema=_schema(instance, "response_schema"),
        module_name=module_name,
        pool=HandlerPool(label, Settings.current().threads),
        redact=getattr(instance, "redact", None),
        redact_tensors=getattr(instance, "redact_tensors", None),
    )


def check_signature(handler: Handler, signatures: dict[str, Any]) -> None:
    """HandlerError unless the model has the signature preprocess feeds (checked with or without an example)."""
    if handler.preprocess is not None:
        _signature(signatures, handler.signature_name)


def check_example(handler: Handler, signatures: dict[str, Any], config: Any, run: Callable) -> None:
    """Run the handler's example through preprocess, the model (`run`) and postprocess; HandlerError if any fails.

    Warm-up in a worker and validation in `publish` both do this, so a handler that cannot answer
    its own example is never served. Each step runs on the handler's pool, as a live request's
    does, bounded by the model's request_timeout_s: a handler that hangs fails its version.
    """
    if handler.example is None:
        return
    from server.tensors import jsonio
    from server.tensors.validate import validate_inputs

    body = copy.deepcopy(handler.example)  # NOTE: one object for both steps, as a live request has
    timeout = config.request_timeout_s
    try:
        if handler.preprocess is not None:
            signature = _signature(signatures, handler.signature_name)
            inputs = model_inputs(handler.pool.call("Handler.preprocess", handler.preprocess, (body,), timeout))
        else:  # a plain TF Serving body, for a handler with only postprocess
            from server.protocols.tfserving.json_codec import decode_predict

            decoded = decode_predict(body, lambda name: _signature(signatures, name), config)
            signature, inputs = signatures[decoded.signature_name], decoded.inputs
        fed, _ = validate_inputs(inputs, signature, config)
        outputs = run(signature.name, fed)
        if handler.postprocess is not None:
            jsonio.dumps(handler.pool.call("Handler.postprocess", handler.postprocess, (outputs, body), timeout))
    except HandlerError:
        raise
    except HandlerRaised as raised:
        raise HandlerError(f"Handler.example failed: {describe_failure(raised.error)}") from raised.error
    except (HandlerTimeout, HandlerStuck) as exc:
        raise HandlerError(f"Handler.example failed: {exc}") from None
    except Exception as exc:  # the model refused preprocess's arrays, or the response cannot be JSON
        message = getattr(exc, "message", None) or describe_failure(exc)
        raise HandlerError(f"Handler.example failed: {message}") from None


def _signature(signatures: dict[str, Any], name: str) -> Any:
    if name not in signatures:
        raise HandlerError(f"the model has no signature {name!r} (it has {sorted(signatures)})")
    return signatures[name]


def model_inputs(value: Any) -> dict[str, np.ndarray]:
    """What preprocess returned, as named numpy arrays; a TypeError names what is wrong."""
    if not isinstance(value, dict) or not all(isinstance(name, str) for name in value):
        raise TypeError(f"Handler.preprocess must return a dict of input name to array, got {type(value).__name__}")
    return {name: np.asarray(array) for name, array in value.items()}


def _schema(instance: Any, name: str) -> dict | None:
    schema = getattr(instance, name, None)
    if schema is not None and not isinstance(schema, dict):
        raise HandlerError(f"Handler.{name} must be a JSON Schema object (a dict), got {type(schema).__name__}")
    return schema


def describe_failure(exc: BaseException) -> str:
    """The exception and the handler.py line it came from (once: a SyntaxError's own text names it too)."""
    message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    line = exc.lineno if isinstance(exc, SyntaxError) else None
    if line is None:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(HANDLER_FILE)]
        line = frames[-1].lineno if frames else None
    where = f" (handler.py line {line})" if line else ""
    return f"{type(exc).__name__}{': ' + message if message else ''}{where}"
