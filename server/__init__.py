"""forkserve: TensorFlow/Keras models served from a gunicorn pre-fork server.

The packages are layers, lowest first; each imports only the ones before it (docs/design.md, "The
code, by the process that runs it"; tests/unit/test_layers.py checks every import, those inside
functions too):

| package | runs in |
|---|---|
| server (settings, config, repository, signature, errors, state, target, write_errors, compat, ...) | every process: the shared core |
| server.telemetry | master and workers: metrics, buffered writes, access log, tracing, payload logging, per-request measurement |
| server.tensors | workers: JSON values and images to numpy, declared sizes, validation against a signature |
| server.protocols | workers: TF Serving's and V2's wire forms, JSON and protobuf messages (no grpc) |
| server.models | a worker after fork: the registry, loading, executors, handlers, the TensorFlow runtime |
| server.dataplane | a worker's request threads and gRPC loop: the request flow every API and transport shares |
| server.http, server.rpc | a worker: the REST (Flask) and gRPC (grpc.aio) transports, which only adapt |
| server.worker, server.master | the gunicorn worker's hooks and class; the master's hooks, rollout and fleet |
| server.cli | the caller's process (publish, validate, reload) |

Only server.models.runtime imports TensorFlow, inside a worker; tests/unit/test_import_rules.py
imports each package in a fresh interpreter and fails when one pulls in TensorFlow or Keras.
"""
