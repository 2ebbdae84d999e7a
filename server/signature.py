"""Model signatures as plain data, so codecs and validation need no TensorFlow."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SIGNATURE = "serving_default"  # the signature a request that names none is run on (TF Serving's key)

# numpy dtype name -> TF DataType enum name (TF Serving's metadata uses the enum names).
TF_DTYPE_NAMES = {
    "float16": "DT_HALF",
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "int8": "DT_INT8",
    "int16": "DT_INT16",
    "int32": "DT_INT32",
    "int64": "DT_INT64",
    "uint8": "DT_UINT8",
    "uint16": "DT_UINT16",
    "uint32": "DT_UINT32",
    "uint64": "DT_UINT64",
    "bool": "DT_BOOL",
    "string": "DT_STRING",
    "bfloat16": "DT_BFLOAT16",
    "complex64": "DT_COMPLEX64",
    "complex128": "DT_COMPLEX128",
    "resource": "DT_RESOURCE",
    "variant": "DT_VARIANT",
}

METHOD_NAMES = {
    "predict": "tensorflow/serving/predict",
    "classify": "tensorflow/serving/classify",
    "regress": "tensorflow/serving/regress",
}

Shape = tuple[int | None, ...] | None  # None: unknown rank; a None dimension: any size


@dataclass(frozen=True)
class TensorInfo:
    """Key, numpy dtype name ("string" for bytes, "invalid" for DT_INVALID) and shape of one signature tensor."""

    name: str
    dtype: str
    shape: Shape
    tensor: str | None = None  # the graph tensor the SignatureDef names ("x:0"), which metadata reports; None: the key

    @property
    def is_image(self) -> bool:
        """A rank-4 float tensor (batch, height, width, channels) with known spatial size."""
        return (
            self.shape is not None
            and len(self.shape) == 4
            and self.dtype.startswith("float")
            and all(d is not None for d in self.shape[1:])
        )

    def describe_shape(self) -> str:
        """Shape as TF prints it, -1 for any size."""
        if self.shape is None:
            return "<unknown rank>"
        return "[" + ", ".join("-1" if d is None else str(d) for d in self.shape) + "]"

    @property
    def tf_dtype(self) -> str:
        """The DataType enum name (DT_FLOAT), DT_INVALID when TF has none for it."""
        return TF_DTYPE_NAMES.get(self.dtype, "DT_INVALID")

    @property
    def tensor_name(self) -> str:
        """The name TF Serving's metadata gives the tensor: the SignatureDef's, else the key."""
        return self.name if self.tensor is None else self.tensor


@dataclass(frozen=True)
class SignatureInfo:
    """One callable signature of a model version."""

    name: str
    method: str  # "predict", "classify" or "regress"
    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]
    # TF1 graphs (TF Serving's half_plus_two) check no shapes when fed, like TF Serving itself;
    # traced TF2 functions reject a shape that differs from their signature.
    strict_shapes: bool = True
    method_name: str | None = None  # the SignatureDef's own method_name, as metadata reports it; None: from `method`
    definition: bytes | None = None  # the SavedModel's serialized SignatureDef: metadata answers it as is (defaults too)

    @property
    def batchable(self) -> bool:
        """Rows of different requests can share one call: every input has a free batch dimension."""
        return all(t.shape is not None and len(t.shape) >= 1 and t.shape[0] is None for t in self.inputs.values())

    @property
    def tfserving_method_name(self) -> str:
        """method_name as the SignatureDef holds it (TF2 SavedModels label classify signatures predict)."""
        return METHOD_NAMES[self.method] if self.method_name is None else self.method_name
