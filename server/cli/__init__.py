"""forkserve's command line (`python -m server publish|reload`), in the caller's process.

Never imports tensorflow or keras: `publish` validates a model by running server.cli.validate in
a child process, so a training job can call it without TensorFlow in its own process.
"""
