"""Signature metadata of loaded servables against the SavedModel's own SignatureDefs (real TensorFlow, real Keras 3 export)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

tf = pytest.importorskip("tensorflow")
from tensorflow.core.framework import types_pb2  # noqa: E402
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2  # noqa: E402

from server.models import runtime  # noqa: E402
from server.protocols.tfserving import proto_codec  # noqa: E402
from server.repository import VersionSource  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "data"
TFSERVING = DATA / "tfserving"


def signature_defs(path: Path) -> dict[str, Any]:
    """The SignatureDefs of a SavedModel's serve MetaGraph, read from saved_model.pb."""
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((path / "saved_model.pb").read_bytes())
    (meta,) = [m for m in proto.meta_graphs if "serve" in m.meta_info_def.tags]
    return dict(meta.signature_def)


def as_proto(signature: Any, rebuilt: bool = False) -> Any:
    """forkserve's SignatureInfo as the tensorflow.SignatureDef gRPC metadata sends (built from its fields, not copied)."""
    proto = meta_graph_pb2.SignatureDef()
    proto_codec.signature_def(replace(signature, definition=None) if rebuilt else signature, proto)
    return proto


@pytest.mark.parametrize("model", ["saved_model_half_plus_two_cpu", "saved_model_half_plus_two_tf2_cpu"])
def test_savedmodel_metadata_is_its_signature_defs(model: str) -> None:
    path = TFSERVING / model / "00000123"
    servable = runtime.load_servable(VersionSource("m", 123, path, "savedmodel"))
    expected = signature_defs(path)
    assert set(servable.signature_defs) == set(expected)  # __saved_model_init_op too, as TF Serving lists it
    for name, definition in expected.items():
        assert as_proto(servable.signature_defs[name]) == definition, name
        rebuilt = as_proto(servable.signature_defs[name], rebuilt=True)  # all but the defaults, from the plain data
        definition.ClearField("defaults")
        assert rebuilt == definition, name
        signature = servable.signature_defs[name]
        tensors = {**signature.inputs, **signature.outputs}
        for key, info in [*definition.inputs.items(), *definition.outputs.items()]:
            assert (tensors[key].tensor_name, tensors[key].tf_dtype) == (info.name, types_pb2.DataType.Name(info.dtype))
    assert "__saved_model_init_op" not in servable.signatures


def keras_models() -> dict[str, Any]:
    """Keras 3 models of the shapes the Keras export names differently: one output, several, a dict of outputs."""
    import keras

    keras.utils.set_random_seed(3)
    features = keras.Input(shape=(4,), name="features")
    single = keras.Model(features, keras.layers.Dense(2, name="logits")(features))
    tag, signal = keras.Input(shape=(3,), name="tag", dtype="int64"), keras.Input(shape=(2,), name="signal")
    joined = keras.layers.Concatenate()([keras.layers.Dense(2)(tag), signal])
    # outputs listed out of name order: the export numbers them in list order
    several = keras.Model([tag, signal], [keras.layers.Dense(1, name="zeta")(joined), keras.layers.Dense(2, name="alpha")(joined)])
    keyed = keras.Model([tag, signal], {"zeta": keras.layers.Dense(1)(joined), "alpha": keras.layers.Dense(3)(joined)})
    text = keras.Input(shape=(1,), dtype="string", name="text")
    words = keras.Model(text, keras.layers.StringLookup(vocabulary=["a", "b"], output_mode="one_hot")(text))
    return {"single": single, "several": several, "keyed": keyed, "words": words}


@pytest.mark.parametrize("name", ["single", "several", "keyed", "words"])
def test_keras_metadata_names_are_those_of_its_savedmodel_export(tmp_path: Path, name: str) -> None:
    model = keras_models()[name]
    model.save(tmp_path / "model.keras")
    model.export(str(tmp_path / "export"), format="tf_saved_model", verbose=False)
    exported = signature_defs(tmp_path / "export")["serving_default"]
    servable = runtime.load_servable(VersionSource("m", 1, tmp_path, "keras", file=tmp_path / "model.keras"))
    signature = servable.signatures["serving_default"]
    assert servable.signature_defs == servable.signatures
    assert {k: v.tensor_name for k, v in signature.inputs.items()} == {k: v.name for k, v in exported.inputs.items()}
    # the export keys a list of outputs output_0, output_1, ... (a dict keeps its keys); forkserve keeps the model's names
    names = list(signature.outputs)
    expected = ({key: exported.outputs[key] for key in names} if name == "keyed" else
                {key: exported.outputs[f"output_{i}"] for i, key in enumerate(model.output_names)})
    assert set(expected) == set(names)
    for key, info in as_proto(signature).outputs.items():
        assert info == expected[key], key
    assert as_proto(signature).method_name == exported.method_name
    for key, info in as_proto(signature).inputs.items():
        assert info == exported.inputs[key], key
