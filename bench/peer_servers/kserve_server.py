"""KServe's Python model server for bench.peers: TF Serving's v1 body on /v1/models/NAME:predict, V2 over gRPC.

    python kserve_server.py --port P --grpc-port G --workers 2 NAME=path/model.keras ...

With workers > 1 KServe spawns its workers and pickles the model objects into them, so each
model loads in the worker, at its first request (the benchmark warms every server first).
Its gRPC server (inference.GRPCInferenceService) runs in the main process only, whatever
--workers says (kserve 0.21 ModelServer.start): a gRPC call arrives as an InferRequest there.
"""

from __future__ import annotations

import argparse
from typing import Any

import kserve
import numpy as np
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse


class KerasModel(kserve.Model):
    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        self.path = path
        self.loaded = None
        self.ready = True

    def __getstate__(self) -> dict:
        return {**self.__dict__, "loaded": None}

    def predict(self, payload: Any, headers: Any = None) -> dict | InferResponse:
        if self.loaded is None:
            from keras_common import WarmModel

            self.loaded = WarmModel(self.path)
        if isinstance(payload, InferRequest):  # V2 over gRPC: a float32 tensor, raw or typed
            output = self.loaded(payload.inputs[0].as_numpy().astype(np.float32, copy=False))
            tensor = InferOutput("output", list(output.shape), "FP32")
            tensor.set_data_from_numpy(output, binary_data=payload.use_binary_outputs)
            return InferResponse(response_id=payload.id, model_name=self.name, infer_outputs=[tensor],
                                 use_binary_outputs=payload.use_binary_outputs)
        instances = payload["instances"]
        if instances and isinstance(instances[0], dict):
            batch = self.loaded.decode_images(instances)
        else:
            batch = np.asarray(instances, dtype=np.float32)
        return {"predictions": self.loaded(batch).tolist()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("models", nargs="+", help="NAME=path/model.keras")
    args = parser.parse_args()
    models = [KerasModel(*spec.split("=", 1)) for spec in args.models]
    kserve.ModelServer(http_port=args.port, grpc_port=args.grpc_port, workers=args.workers).start(models)


if __name__ == "__main__":
    main()
