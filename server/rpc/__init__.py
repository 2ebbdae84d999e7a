"""The worker's gRPC server: TF Serving's PredictionService / ModelService and the V2 inference service.

Imported in workers only, after fork and after the models are warm (server.worker.hooks): a
process that created a gRPC server or channel before fork cannot use gRPC in the child, and its
messages import TensorFlow (TensorProto). The master and the CLI never import this package.
"""
