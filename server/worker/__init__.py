"""A worker process, after fork: its hooks, the model registry, the executor threads, the TensorFlow runtime.

gunicorn.conf.py imports server.worker.hooks in the master to name the hooks, so no module here
imports tensorflow or keras at import time; server.worker.runtime is the only one that does, and
the registry imports it inside a worker when it loads the models (post_worker_init).
"""
