"""The gunicorn master (arbiter) side: its hooks, the repository watcher and rolling restart, CPU slots.

Imported by gunicorn.conf.py in the master and run there, partly in a thread of its own (the
rollout controller). Never imports tensorflow or keras: TF state in the master hangs every worker
forked from it.
"""
