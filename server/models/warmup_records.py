"""TensorFlow Serving's warm-up records: replay a SavedModel's `assets.extra/tf_serving_warmup_requests` at load.

The file is a TFRecord file of serialized `tensorflow.serving.PredictionLog`s, the format TF Serving
replays when it loads a version. Each record's request goes through the decoding and validation a
gRPC request of its kind gets (server.rpc.tfserving, server.tensors.arrays) and then the
servable's run function (the version's executor does not exist yet). As in TF Serving, a file of
more than 1000 records, a record that cannot be read and a record the model refuses fail the load;
the reason names the record. Runs where TensorFlow is loaded (a worker after fork, the validate
child): TensorFlow, TF Serving's protos and their codec are imported only for a version with the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from server.config import ModelConfig
from server.errors import ApiError, InvalidArgument
from server.repository import VersionSource

if TYPE_CHECKING:
    from server.models.registry import ModelVersion

WARMUP_FILE = "assets.extra/tf_serving_warmup_requests"
MAX_RECORDS = 1000  # TF Serving's WarmupConsts::kMaxNumRecords


class WarmupRecordFailed(Exception):
    """The warm-up file cannot be replayed; the message names the record and why."""


def warmup_file(source: VersionSource) -> Path | None:
    """The version's warm-up file, None without one (only a SavedModel has one, as in TF Serving)."""
    if source.format != "savedmodel":
        return None
    path = source.path / WARMUP_FILE
    return path if path.exists() or path.is_symlink() else None


def read_records(path: Path) -> Iterator[bytes]:
    """The file's records, CRCs checked (TensorFlow's TFRecord reader); WarmupRecordFailed for a broken file."""
    import tensorflow as tf

    count = 0
    try:
        for record in tf.compat.v1.io.tf_record_iterator(str(path)):
            count += 1
            if count > MAX_RECORDS:
                raise WarmupRecordFailed(f"{WARMUP_FILE} holds more than {MAX_RECORDS} records, "
                                         "the most TensorFlow Serving replays; keep the first 1000 at most")
            yield record
    except tf.errors.OpError as exc:
        message = (exc.message or type(exc).__name__).strip().splitlines()[0]
        raise WarmupRecordFailed(f"{WARMUP_FILE}: record {count + 1} cannot be read ({message}); "
                                 "the file must be a TFRecord file of tensorflow.serving.PredictionLog") from None


def replay(source: VersionSource, config: ModelConfig, servable: Any) -> int | None:
    """Replay the version's warm-up records on `servable`: how many, None without a file; WarmupRecordFailed."""
    path = warmup_file(source)
    if path is None:
        return None
    from server.models.registry import ModelVersion
    from server.protocols.tfserving import messages

    log_class = messages.apis().prediction_log_pb2.PredictionLog
    version = ModelVersion(source, config, servable=servable)
    replayed = 0
    for number, record in enumerate(read_records(path), 1):
        entry = log_class()
        try:
            entry.ParseFromString(record)
        except Exception:  # NOTE: protobuf's DecodeError; its class differs between implementations
            raise WarmupRecordFailed(f"{WARMUP_FILE}: record {number} is not a tensorflow.serving.PredictionLog") from None
        kind = entry.WhichOneof("log_type")
        try:
            replay_log(entry, kind, version)
        except ApiError as exc:
            raise WarmupRecordFailed(f"{WARMUP_FILE}: record {number} ({kind}) was refused: {exc.message}") from None
        except Exception as exc:  # what a client would get as INTERNAL
            raise WarmupRecordFailed(f"{WARMUP_FILE}: record {number} ({kind}) failed: "
                                     f"{type(exc).__name__}: {exc}") from None
        replayed += 1
    return replayed


def replay_log(entry: Any, kind: str | None, version: ModelVersion) -> None:
    """Run one PredictionLog's request as its gRPC call would, without the executor; ApiError as a client gets it."""
    if kind == "predict_log":
        _predict(entry.predict_log.request, version)
    elif kind in ("classify_log", "regress_log"):
        request = getattr(entry, kind).request
        _examples(request.input, request.model_spec.signature_name, kind.removesuffix("_log"), version)
    elif kind == "multi_inference_log":
        _multi_inference(entry.multi_inference_log.request, version)
    else:
        raise InvalidArgument(f"log type {kind or 'unset'!s} cannot be replayed; TensorFlow Serving replays "
                              "predict_log, classify_log, regress_log and multi_inference_log")


def _predict(request: Any, version: ModelVersion) -> None:
    """A PredictRequest: decode the TensorProtos, validate against the signature, run it, check output_filter."""
    from server.protocols.tfserving import proto_codec
    from server.tensors.validate import validate_inputs

    from server.models.signature_choice import predict_signature

    signature = predict_signature(version, request.model_spec.signature_name)
    proto_codec.output_names(request.output_filter, signature)
    inputs = proto_codec.decode_inputs(request.inputs, signature, version.config)
    fed, _ = validate_inputs(inputs, signature, version.config)
    version.servable.run(signature.name, fed)


def _examples(given: Any, signature_name: str, method: str, version: ModelVersion) -> None:
    """A Classify or Regress request's tf.Examples through a signature that takes them, its outputs checked."""
    from server.models.signature_choice import examples_signature
    from server.protocols.tfserving import proto_codec

    signature = examples_signature(version, signature_name, method)
    serialized = proto_codec.serialized_examples(given, version.config.max_request_rows)
    _check_outputs(version.servable.run(signature.name, {"inputs": serialized}), method, len(serialized))


def _multi_inference(request: Any, version: ModelVersion) -> None:
    """A MultiInferenceRequest as the RPC runs it (TF Serving's task checks), each task's signature on the shared input."""
    from server.models.signature_choice import multi_inference_checked
    from server.protocols.tfserving import proto_codec

    tasks = multi_inference_checked(version, request.tasks)
    serialized = proto_codec.serialized_examples(request.input, version.config.max_request_rows)
    for signature, method in tasks:
        _check_outputs(version.servable.run(signature.name, {"inputs": serialized}), method, len(serialized))


def _check_outputs(outputs: dict[str, Any], method: str, rows: int) -> None:
    """The outputs as TF Serving's post-processing checks them."""
    from server.protocols.tfserving import examples

    if method == "regress":
        examples.regressions(outputs, rows)
    else:
        examples.classifications(outputs, rows)
