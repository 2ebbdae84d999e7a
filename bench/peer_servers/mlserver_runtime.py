"""Seldon MLServer custom runtime for bench.peers: V2 in, V2 out, a warm concrete function (never model.predict).

An image input arrives as BYTES (base64 JPEG strings); numbers as FP32. MLServer's adaptive
batching (max_batch_size / max_batch_time in model-settings.json) merges requests before predict.
"""

from __future__ import annotations

import numpy as np
from keras_common import WarmModel
from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


class KerasRuntime(MLModel):
    async def load(self) -> bool:
        self._model = WarmModel(self.settings.parameters.uri)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        request_input = payload.inputs[0]
        if request_input.datatype == "BYTES":
            batch = self._model.decode_images(list(request_input.data))
        else:
            batch = np.asarray(list(request_input.data), dtype=np.float32).reshape(request_input.shape)
        output = self._model(batch)
        return InferenceResponse(model_name=self.name, outputs=[ResponseOutput(
            name="output", shape=list(output.shape), datatype="FP32", data=output.ravel().tolist())])
