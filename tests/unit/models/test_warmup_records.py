"""Replaying TF Serving's warm-up records on real servables, with files written by TF Serving's own protos.

Real TensorFlow: TF Serving's half_plus_two (TF1 SavedModel with predict, classify and regress
signatures), a Keras 2 SavedModel (an image CNN) and a Keras 3 export; the files are written with
tf.io.TFRecordWriter from tensorflow_serving.apis messages, as TF Serving's docs show.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    inference_pb2,
    predict_pb2,
    prediction_log_pb2,
    regression_pb2,
)

from server.config import ModelConfig  # noqa: E402
from server.models import runtime  # noqa: E402
from server.models.registry import AVAILABLE, END, ModelRegistry, ModelVersion  # noqa: E402
from server.models.warmup_records import (  # noqa: E402
    MAX_RECORDS,
    WARMUP_FILE,
    WarmupRecordFailed,
    replay,
)
from server.repository import VersionSource  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "data"
HALF_PLUS_TWO = DATA / "tfserving" / "saved_model_half_plus_two_cpu" / "00000123"


class Version:
    """A loaded SavedModel copy whose warm-up file each test rewrites."""

    def __init__(self, path: Path, name: str) -> None:
        self.source = VersionSource(name, 1, path, "savedmodel")
        self.servable = runtime.load_servable(self.source)

    def write(self, logs: Iterable[Any]) -> Path:
        """A warm-up file of these PredictionLogs (or raw records given as bytes)."""
        path = self.source.path / WARMUP_FILE
        path.parent.mkdir(exist_ok=True)
        with tf.io.TFRecordWriter(str(path)) as writer:
            for entry in logs:
                writer.write(entry if isinstance(entry, bytes) else entry.SerializeToString())
        return path

    def replay(self, config: ModelConfig | None = None) -> int | None:
        return replay(self.source, config or ModelConfig(), self.servable)


@pytest.fixture(scope="module")
def half_plus_two(tmp_path_factory: pytest.TempPathFactory) -> Version:
    return Version(shutil.copytree(HALF_PLUS_TWO, tmp_path_factory.mktemp("hp2") / "1"), "half_plus_two")


@pytest.fixture(scope="module")
def keras2_cnn(tmp_path_factory: pytest.TempPathFactory) -> Version:
    return Version(shutil.copytree(DATA / "keras2" / "cnn_savedmodel", tmp_path_factory.mktemp("cnn") / "1"), "cnn")


@pytest.fixture(scope="module")
def keras3_export(tmp_path_factory: pytest.TempPathFactory) -> Version:
    """A Keras 3 model exported as a SavedModel (model.export), features float32 [-1, 4]."""
    import keras

    keras.utils.set_random_seed(7)
    inputs = keras.Input(shape=(4,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(2, name="logits")(inputs))
    path = tmp_path_factory.mktemp("k3") / "1"
    model.export(str(path), verbose=False)
    return Version(path, "k3")


def predict(inputs: dict[str, Any], signature: str = "", output_filter: tuple[str, ...] = ()) -> Any:
    """A PredictionLog holding a PredictRequest; values are (array, tf dtype) pairs or TensorProtos."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "any name: warm-up ignores it, as TF Serving"
    request.model_spec.signature_name = signature
    request.output_filter.extend(output_filter)
    for name, (value, dtype) in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value, dtype=dtype))
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))


def examples(target: Any, xs: list[float], context: float | None = None) -> None:
    """Fill an Input with tf.Examples of feature x (with a context feature when given)."""
    if context is None:
        for x in xs:
            target.example_list.examples.add().features.feature["x"].float_list.value.append(x)
        return
    target.example_list_with_context.context.features.feature["x"].float_list.value.append(context)
    for x in xs:
        target.example_list_with_context.examples.add().features.feature["y"].float_list.value.append(x)


def classify(signature: str, xs: list[float]) -> Any:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.signature_name = signature
    examples(request.input, xs)
    return prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(request=request))


def regress(signature: str, xs: list[float], context: float | None = None) -> Any:
    request = regression_pb2.RegressionRequest()
    request.model_spec.signature_name = signature
    examples(request.input, xs, context)
    return prediction_log_pb2.PredictionLog(regress_log=prediction_log_pb2.RegressLog(request=request))


def multi_inference(tasks: list[tuple[str, str]], xs: list[float], model: str = "half_plus_two") -> Any:
    request = inference_pb2.MultiInferenceRequest()
    for signature, method in tasks:
        task = request.tasks.add()
        task.model_spec.name = model  # TF Serving refuses a task without one, in warm-up too
        task.model_spec.signature_name = signature
        task.method_name = method
    examples(request.input, xs)
    return prediction_log_pb2.PredictionLog(multi_inference_log=prediction_log_pb2.MultiInferenceLog(request=request))


X = (np.array([[1.0], [2.0], [5.0]], dtype=np.float32), tf.float32)


def test_every_kind_of_record_tf_serving_replays_is_replayed(half_plus_two: Version) -> None:
    half_plus_two.write([
        predict({"x": X}),
        predict({"x": X}, signature="serving_default", output_filter=("y",)),
        predict({"inputs": X}, signature="regress_x2_to_y3"),
        predict({"x": (np.array([3.0, 4.0], np.float32), tf.float32)}),  # [2] for [-1, 1]: as TF Serving's REST example
        classify("classify_x_to_y", [1.0, 2.0]),
        regress("regress_x_to_y", [1.0, 2.0, 3.0]),
        regress("regress_x_to_y2", [4.0], context=1.0),  # context features merged into each example
        multi_inference([("classify_x_to_y", "tensorflow/serving/classify"),
                         ("regress_x_to_y", "tensorflow/serving/regress")], [1.0]),
    ])
    assert half_plus_two.replay() == 8


def test_tf2_classify_and_regress_signatures_of_the_predict_method_are_replayed(tmp_path: Path) -> None:
    """TF2's half_plus_two labels classify_x_to_y and regress_x_to_y predict; TF Serving serves them by their keys."""
    version = Version(shutil.copytree(DATA / "tfserving" / "saved_model_half_plus_two_tf2_cpu" / "00000123", tmp_path / "1"),
                      "half_plus_two_tf2")
    version.write([classify("classify_x_to_y", [1.0, 2.0]), regress("regress_x_to_y", [1.0]),
                   multi_inference([("classify_x_to_y", "tensorflow/serving/classify"),
                                    ("regress_x_to_y2", "tensorflow/serving/regress")], [1.0, 3.0])])
    assert version.replay() == 3
    version.write([classify("classify_x2_to_y3", [1.0])])  # its one input `inputs` is DT_FLOAT, not tf.Examples
    with pytest.raises(WarmupRecordFailed, match="takes DT_FLOAT in 'inputs', not serialized tf.Examples"):
        version.replay()


def test_a_version_without_the_file_or_not_a_saved_model_replays_nothing(tmp_path: Path, half_plus_two: Version) -> None:
    assert replay(VersionSource("m", 1, tmp_path, "savedmodel"), ModelConfig(), half_plus_two.servable) is None
    (tmp_path / "assets.extra").mkdir()
    (tmp_path / WARMUP_FILE).write_bytes(b"not even read")
    assert replay(VersionSource("m", 1, tmp_path, "keras"), ModelConfig(), half_plus_two.servable) is None
    half_plus_two.write([])
    assert half_plus_two.replay() == 0  # an empty file is no error (TF Serving reads 0 records)


@pytest.mark.parametrize(("record", "reason"), [
    (predict({"z": X}), "missing input(s) ['x']; signature 'serving_default' takes ['x']"),
    (predict({"x": X, "z": X}), "unknown input(s) ['z']; signature 'serving_default' takes ['x']"),
    (predict({"x": (np.array([[1], [2]], dtype=np.int32), tf.int32)}), "input 'x' is DT_INT32; signature 'serving_default' takes DT_FLOAT"),
    (predict({"x": X}, signature="nope"), 'Serving signature key "nope" not found.'),
    (predict({"x": X}, output_filter=("z",)), "output_filter names 'z'; signature 'serving_default' gives ['y']"),
    (predict({"x": (np.array([[np.nan]], dtype=np.float32), tf.float32)}), "input 'x' holds NaN or Infinity"),
    (classify("regress_x_to_y", [1.0]), 'Expected classification signature outputs to contain at least one of "classes"'),
    (regress("serving_default", [1.0]), 'No regression inputs found in SignatureDef: inputs {\n  key: "x"'),
    (regress("regress_x_to_y", []), "Input is empty."),
    (multi_inference([("classify_x_to_y", "tensorflow/serving/predict")], [1.0]),
     "Unsupported signature method_name: tensorflow/serving/predict"),
    (multi_inference([("classify_x_to_y", "tensorflow/serving/classify")], [1.0], model=""),
     "Found ModelSpec with an empty model name."),
    (multi_inference([("regress_x_to_y", "tensorflow/serving/regress")] * 2, [1.0]),
     "Duplicate evaluation of signature: regress_x_to_y"),
    (prediction_log_pb2.PredictionLog(), "log type unset cannot be replayed"),
])
def test_a_record_the_model_refuses_fails_with_its_number_and_the_client_s_error(
    half_plus_two: Version, record: Any, reason: str,
) -> None:
    half_plus_two.write([predict({"x": X}), record, predict({"x": X})])
    with pytest.raises(WarmupRecordFailed) as failed:
        half_plus_two.replay()
    kind = record.WhichOneof("log_type")
    assert str(failed.value).startswith(f"{WARMUP_FILE}: record 2 ({kind}) was refused: {reason}")


def test_the_model_s_settings_apply_as_to_a_request(half_plus_two: Version) -> None:
    half_plus_two.write([predict({"x": (np.ones((5, 1), np.float32), tf.float32)})])
    assert half_plus_two.replay() == 1
    with pytest.raises(WarmupRecordFailed, match=r"record 1 \(predict_log\) was refused: request has 5 rows; the limit is 4"):
        half_plus_two.replay(ModelConfig(max_request_rows=4))


def test_a_model_error_at_run_time_fails_the_record(half_plus_two: Version) -> None:
    # A tf.Example whose x is a string: the parser in the graph refuses it (INVALID_ARGUMENT from TF).
    request = regression_pb2.RegressionRequest()
    request.model_spec.signature_name = "regress_x_to_y"
    request.input.example_list.examples.add().features.feature["x"].bytes_list.value.append(b"one")
    half_plus_two.write([prediction_log_pb2.PredictionLog(regress_log=prediction_log_pb2.RegressLog(request=request))])
    with pytest.raises(WarmupRecordFailed, match=r"record 1 \(regress_log\) was refused: .*x"):
        half_plus_two.replay()


def test_a_corrupt_or_truncated_file_fails_naming_the_record(half_plus_two: Version) -> None:
    path = half_plus_two.write([predict({"x": X})] * 3)
    good = path.read_bytes()
    size = len(good) // 3
    path.write_bytes(good[: 2 * size + size // 2])  # the third record cut in half
    with pytest.raises(WarmupRecordFailed, match=r"record 3 cannot be read \(truncated record at .*TFRecord file of "
                                                 r"tensorflow.serving.PredictionLog"):
        half_plus_two.replay()
    flipped = bytearray(good)
    flipped[size + 20] ^= 0x01  # a byte of record 2's data: its CRC no longer matches
    path.write_bytes(bytes(flipped))
    with pytest.raises(WarmupRecordFailed, match=r"record 2 cannot be read \(corrupted record at \d+\)"):
        half_plus_two.replay()
    path.write_bytes(b'{"instances": [1.0]}\n')  # a JSON body, not a TFRecord file
    with pytest.raises(WarmupRecordFailed, match=r"record 1 cannot be read \(corrupted record at 0"):
        half_plus_two.replay()


def test_a_record_that_is_not_a_prediction_log_fails(half_plus_two: Version) -> None:
    half_plus_two.write([predict({"x": X}), b"\xff\xff\xff\xff"])
    with pytest.raises(WarmupRecordFailed, match=r"record 2 is not a tensorflow.serving.PredictionLog"):
        half_plus_two.replay()


def test_at_most_1000_records_as_tf_serving_and_the_rest_is_never_run(half_plus_two: Version) -> None:
    half_plus_two.write([predict({"x": X})] * MAX_RECORDS)
    assert half_plus_two.replay() == MAX_RECORDS
    # Record 1001 is refused by the model too: the file is refused for its length before it runs.
    half_plus_two.write([predict({"x": X})] * MAX_RECORDS + [predict({"z": X})])
    with pytest.raises(WarmupRecordFailed, match=r"holds more than 1000 records, the most TensorFlow Serving replays"):
        half_plus_two.replay()


def test_keras_saved_models_keras_2_and_keras_3_export(keras2_cnn: Version, keras3_export: Version) -> None:
    image = (np.zeros((2, 8, 8, 1), np.float32), tf.float32)
    keras2_cnn.write([predict({"image": image}), predict({"image": image}, signature="serving_default")])
    assert keras2_cnn.replay() == 2
    keras2_cnn.write([predict({"image": (np.zeros((1, 8, 8, 3), np.float32), tf.float32)})])
    with pytest.raises(WarmupRecordFailed, match=r"record 1 \(predict_log\) was refused: input 'image' has shape "
                                                 r"\[1, 8, 8, 3\], the model takes \[-1, 8, 8, 1\]"):
        keras2_cnn.replay()
    features = (np.ones((3, 4), np.float32), tf.float32)
    keras3_export.write([predict({"features": features}), predict({"features": features}, signature="serve")])
    assert keras3_export.replay() == 2
    keras3_export.write([predict({"features": (np.ones((3, 4), np.float64), tf.float64)})])
    with pytest.raises(WarmupRecordFailed, match=r"input 'features' is DT_DOUBLE; signature 'serving_default' takes DT_FLOAT"):
        keras3_export.replay()


def test_the_registry_fails_the_version_with_the_reason_and_logs_the_records_replayed(
    half_plus_two: Version, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    registry = ModelRegistry(tmp_path)
    half_plus_two.write([predict({"x": X}), classify("classify_x_to_y", [1.0])])
    good = ModelVersion(half_plus_two.source, ModelConfig())
    with caplog.at_level(logging.INFO, logger="forkserve.models"):
        assert registry._load_version(good, runtime) is True
    assert good.state == AVAILABLE
    assert "model half_plus_two version 1 (savedmodel) loaded and warmed (" in caplog.text
    assert " calls, 2 warm-up records replayed) in " in caplog.text
    half_plus_two.write([predict({"x": X}), predict({"x": (np.array([[1]], np.int32), tf.int32)})])
    bad = ModelVersion(half_plus_two.source, ModelConfig())
    assert registry._load_version(bad, runtime) is False
    assert bad.state == END and bad.servable is None and bad.executor is None
    assert bad.error == (f"failed to load: WarmupRecordFailed: {WARMUP_FILE}: record 2 (predict_log) was refused: "
                         "input 'x' is DT_INT32; signature 'serving_default' takes DT_FLOAT")
