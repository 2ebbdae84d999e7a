"""forkserve: TensorFlow/Keras models served from a gunicorn pre-fork server.

The packages follow the processes and threads that run their code:

| package | runs in | must never import |
|---|---|---|
| server (settings, config, repository, signature, errors, state, target, compat, connection_board) | every process: the shared core | tensorflow, keras |
| server.master | the gunicorn master (arbiter): its hooks, the repository watcher and rollout thread, CPU slots | tensorflow, keras |
| server.worker | a worker after fork: its hooks, the model registry, one executor thread per model version, the TensorFlow runtime | tensorflow or keras at import (only server.models.runtime imports them, when a worker loads its models) |
| server.http | a worker's request threads: the Flask app, the API views and the codecs | tensorflow, keras (the tf.Example codec imports protobuf classes inside a worker) |
| server.telemetry | master and workers: metric definitions, buffered writes, multiprocess files, the access log | tensorflow, keras |
| server.cli | the caller's process (publish, validate, reload) | tensorflow, keras (validation runs in a child process) |

tests/unit/test_import_rules.py imports each package in a fresh interpreter and fails when one
of them pulls in TensorFlow or Keras.
"""
