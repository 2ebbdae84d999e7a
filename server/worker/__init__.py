"""A worker process, after fork: its gunicorn hooks (the composition root of models, Flask app and gRPC listener) and its gthread class.

gunicorn.conf.py imports server.worker.hooks in the master to name the hooks, so no module here
imports tensorflow, keras, Flask or grpc at import time; the hooks import the transports and the
models inside a worker (server.models.runtime is the only module that imports TensorFlow).
"""
