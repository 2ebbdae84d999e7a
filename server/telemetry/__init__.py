"""Metrics and logs, in the master and in workers: definitions, buffered writes, multiprocess files, access log.

prometheus_client must be imported after PROMETHEUS_MULTIPROC_DIR is in the environment
(gunicorn.conf.py exports it before the hooks import anything from here). Never imports
tensorflow or keras.
"""
