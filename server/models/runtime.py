"""Load, trace, warm and call one model version: the only module that imports TensorFlow.

Runs in a worker only, after fork. Importing it from the master breaks the workers (TF's
thread pools do not survive fork), so nothing imported by gunicorn.conf.py may import it.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from server import compat
from server.errors import ApiError, InvalidArgument
from server.repository import VersionSource
from server.signature import SignatureInfo, TensorInfo

log = logging.getLogger("forkserve.runtime")
# TF1 SavedModels log a warning per variable on load ("Unable to create a python object ...").
tf.get_logger().setLevel(logging.ERROR)

_threads_configured = False


def configure_threads(intra_op: int, inter_op: int) -> None:
    """Size TensorFlow's thread pools; must run before the first op executes in this process."""
    global _threads_configured
    if _threads_configured:
        return
    tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    _threads_configured = True


def _dtype_name(dtype: Any) -> str:
    """numpy-style dtype name of a TF dtype, "string" for tf.string."""
    return tf.dtypes.as_dtype(dtype).name


def _shape(shape: tf.TensorShape) -> tuple[int | None, ...] | None:
    """A TensorShape as a tuple, None for unknown rank."""
    if shape.rank is None:
        return None
    return tuple(shape.as_list())


def _tf_error(exc: tf.errors.OpError) -> ApiError:
    """TF's status to the HTTP status TF Serving would answer."""
    message = exc.message.strip().splitlines()[0] if exc.message else type(exc).__name__
    if isinstance(exc, (tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError, tf.errors.OutOfRangeError)):
        return InvalidArgument(message)
    return ApiError(f"model error: {message}", status=500)


class Servable:
    """One loaded model version: its signatures and a way to call them with numpy inputs."""

    signatures: dict[str, SignatureInfo]  # the ones requests can call
    signature_defs: dict[str, SignatureInfo]  # every SignatureDef, as TF Serving's metadata lists them
    platform: str

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one signature on numpy inputs (on the executor thread only)."""
        try:
            outputs = self._call(signature, {k: tf.constant(v) for k, v in inputs.items()})
        except tf.errors.OpError as exc:
            raise _tf_error(exc) from None
        return {name: value.numpy() for name, value in outputs.items()}

    def _call(self, signature: str, tensors: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        raise NotImplementedError

    def traces(self) -> int:
        """How many times TensorFlow traced this servable's functions since load."""
        return 0

    def warm_up(self, batch_sizes: list[int]) -> int:
        """Call every signature at each batch size it will see; returns calls made.

        Numeric inputs get zeros, string inputs empty strings. A signature that refuses empty
        strings (a tf.Example parser with required features) or has inputs of unknown rank is
        not warmed: `unwarmed` says why, and its first requests trace instead.
        """
        calls = 0
        self.unwarmed: dict[str, str] = {}
        for signature in self.signatures.values():
            if any(t.shape is None for t in signature.inputs.values()):
                self.unwarmed[signature.name] = "an input of unknown rank"
                continue
            strings = any(t.dtype == "string" for t in signature.inputs.values())
            for size in batch_sizes if signature.batchable else [None]:
                try:
                    self.run(signature.name, _dummy_inputs(signature, size))
                except ApiError as exc:
                    if not strings:
                        raise  # zeros must go through a numeric model: it is broken
                    self.unwarmed[signature.name] = f"empty strings refused ({exc.message})"
                    break
                calls += 1
        return calls


def _dummy_inputs(signature: SignatureInfo, size: int | None) -> dict[str, np.ndarray]:
    """Zeros (numbers) or empty strings of each input's shape, `size` rows (None: the shape as it is)."""
    dummy = {}
    for name, info in signature.inputs.items():
        shape = tuple((size if size is not None else 1) if d is None else d for d in info.shape or ())
        dummy[name] = np.full(shape, b"", dtype=object) if info.dtype == "string" else np.zeros(shape, dtype=info.dtype)
    return dummy


class KerasServable(Servable):
    """A Keras 3 `.keras` or legacy Keras 2 HDF5 model behind one traced function."""

    platform = "keras"

    def __init__(self, path: Path) -> None:
        import keras

        # safe_mode=True refuses Lambda layers holding code; compile=False skips optimizer state.
        self.model = keras.saving.load_model(str(path), compile=False, safe_mode=True)
        input_names = [t.name for t in self.model.inputs]
        if len(set(input_names)) != len(input_names):
            raise ValueError(f"model inputs have duplicate names {input_names}")
        self.input_names = input_names
        specs = [
            tf.TensorSpec((None,) + tuple(t.shape[1:]), dtype=t.dtype, name=name)
            for t, name in zip(self.model.inputs, input_names)
        ]
        self.output_names = _keras_output_names(self.model)
        self.input_structure = _keras_input_structure(self.model)
        self.function = tf.function(self._forward, input_signature=specs, autograph=False)
        self.concrete = self.function.get_concrete_function()
        self.flat: compat.FlatCall | None = None  # set by warm_up once checked
        outputs = self.concrete.structured_outputs
        tensors = _keras_export_names(input_names, list(outputs), _dict_output(self.model))
        self.signatures = {
            "serving_default": SignatureInfo(
                name="serving_default",
                method="predict",
                inputs={n: TensorInfo(n, _dtype_name(s.dtype), _shape(s.shape), tensors[0][n])
                        for n, s in zip(input_names, specs)},
                outputs={n: TensorInfo(n, _dtype_name(t.dtype), _shape(t.shape), tensors[1][n])
                         for n, t in outputs.items()},
            )
        }
        self.signature_defs = self.signatures

    def _forward(self, *inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        """The traced body: one forward pass in inference mode, outputs keyed by name."""
        import keras

        by_name = dict(zip(self.input_names, inputs))
        feed = keras.tree.map_structure(lambda t: by_name[t.name], self.input_structure)
        result = self.model(feed, training=False)
        if isinstance(result, dict):
            return dict(result)
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        return dict(zip(self.output_names, results))

    def _call(self, signature: str, tensors: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        call = self.flat or self.concrete
        return call(*[tensors[name] for name in self.input_names])

    def warm_up(self, batch_sizes: list[int]) -> int:
        """Check the flat call against the public one, then warm every bucket through it."""
        inputs = [self.signatures["serving_default"].inputs[name] for name in self.input_names]
        self.flat = compat.flat_call_or_none(self.concrete, [t.shape for t in inputs], [t.dtype for t in inputs])
        return super().warm_up(batch_sizes)

    def traces(self) -> int:
        return self.function.experimental_get_tracing_count()


class SavedModelServable(Servable):
    """A TensorFlow SavedModel (TF1 graph or TF2) called through its signatures."""

    platform = "tensorflow_savedmodel"

    def __init__(self, path: Path) -> None:
        from tensorflow.core.protobuf import saved_model_pb2

        proto = saved_model_pb2.SavedModel()
        proto.ParseFromString((path / "saved_model.pb").read_bytes())
        meta = next((m for m in proto.meta_graphs if "serve" in m.meta_info_def.tags), None)
        if meta is None:
            raise ValueError("SavedModel has no MetaGraph tagged 'serve'")
        self.loaded = tf.saved_model.load(str(path), tags=["serve"])
        # A TF1 graph has no object graph; its signature functions check no shapes (as TF Serving).
        strict = len(meta.object_graph_def.nodes) > 0
        self.functions: dict[str, Callable[..., Any]] = dict(self.loaded.signatures)
        # Every SignatureDef, as TF Serving's metadata lists them (__saved_model_init_op too); the callable ones.
        self.signature_defs = {
            name: SignatureInfo(
                name=name,
                method=_method(definition.method_name),
                inputs={k: _tensor_info(k, v) for k, v in definition.inputs.items()},
                outputs={k: _tensor_info(k, v) for k, v in definition.outputs.items()},
                strict_shapes=strict,
                method_name=definition.method_name,
                definition=definition.SerializeToString(deterministic=True),
            )
            for name, definition in meta.signature_def.items()
        }
        self.signatures = {name: signature for name, signature in self.signature_defs.items()
                           if not name.startswith("__") and name in self.functions}
        if not self.signatures:
            raise ValueError("SavedModel has no serving signatures")

    def _call(self, signature: str, tensors: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return self.functions[signature](**tensors)


def _keras_input_structure(model: Any) -> Any:
    """The structure the model was built with (tensor, list or dict), to call it the same way."""
    try:
        return model.input  # functional models; a dict-built model must be called with a dict
    except (AttributeError, ValueError):  # Sequential loaded from a Keras 2 file has only .inputs
        return model.inputs[0] if len(model.inputs) == 1 else list(model.inputs)


def _dict_output(model: Any) -> bool:
    """Whether the model gives a dict of outputs (a Sequential loaded from a file has no .output until called)."""
    try:
        return isinstance(model.output, dict)
    except (AttributeError, ValueError):
        return False


def _keras_output_names(model: Any) -> list[str]:
    """Output names: the model's own, else the names of the layers that make the outputs."""
    names = list(getattr(model, "output_names", None) or [])
    if len(names) == len(model.outputs) and len(set(names)) == len(names):
        return names
    names = [getattr(getattr(t, "_keras_history", None), "operation", None) for t in model.outputs]
    names = [getattr(op, "name", "") for op in names]
    if all(names) and len(set(names)) == len(names):
        return names
    return [f"output_{i}" for i in range(len(model.outputs))]


def _method(method_name: str) -> str:
    """'tensorflow/serving/classify' -> 'classify'."""
    for method in ("classify", "regress"):
        if method_name.endswith("/" + method):
            return method
    return "predict"


def _tensor_info(key: str, proto: Any) -> TensorInfo:
    """TensorInfo from a SignatureDef's TensorInfo proto."""
    shape = None
    if not proto.tensor_shape.unknown_rank:
        shape = tuple(None if d.size < 0 else int(d.size) for d in proto.tensor_shape.dim)
    return TensorInfo(key, _dtype_name(proto.dtype) if proto.dtype else "invalid", shape, proto.name)


def _keras_export_names(inputs: list[str], outputs: list[str], dict_output: bool) -> tuple[dict[str, str], dict[str, str]]:
    """Tensor names of Keras 3's model.export(format="tf_saved_model") serving_default: serving_default_<input>:0, StatefulPartitionedCall_1:<flat output index>."""
    # NOTE: export traces "serve" first (its call is StatefulPartitionedCall) and flattens a dict of outputs by sorted key.
    order = sorted(outputs) if dict_output else outputs
    return ({name: f"serving_default_{name}:0" for name in inputs},
            {name: f"StatefulPartitionedCall_1:{order.index(name)}" for name in outputs})


def check_keras_file(path: Path) -> None:
    """Refuse a file Keras would misreport ("File not found" for a truncated .keras) with the real reason."""
    if not path.is_file():
        raise ValueError(f"{path.name}: no such file")
    if path.suffix.lower() == ".keras" and not zipfile.is_zipfile(path):
        raise ValueError(f"{path.name} is not a valid .keras file (not a complete zip archive: truncated or corrupt)")
    if path.suffix.lower() != ".keras":
        import h5py

        if not h5py.is_hdf5(path):
            raise ValueError(f"{path.name} is not a valid HDF5 file (truncated or corrupt)")


def load_servable(source: VersionSource) -> Servable:
    """Load one version directory by its format."""
    if source.format == "savedmodel":
        return SavedModelServable(source.path)
    if source.format in ("keras", "h5"):
        check_keras_file(source.model_path)
        return KerasServable(source.model_path)
    raise ValueError(source.problem or f"unknown model format {source.format!r}")
