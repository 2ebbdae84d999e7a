"""How a worker process comes to be: gunicorn's boot after fork (boot), and the zygote that forks workers (zygote).

The master imports this package, so nothing here imports TensorFlow at module level; the zygote
imports it by name, in its own process.
"""
