"""The worker's gRPC transport: TF Serving's PredictionService / ModelService and the V2 inference service on grpc.aio.

Imported in workers, which start it once the models are warm (server.worker.hooks), and in the
zygote (server.spawn), which imports it only: a process that created a gRPC server or channel
before fork cannot use gRPC in the child. The
servicers parse protobuf messages (server.protocols), call the dataplane and map its errors to
gRPC status codes. The master and the CLI never import this package.
"""
