"""The master's rollout: watch the repository and the configuration, roll the workers over (no TensorFlow).

controller (thread, lock, the main thread's API) -> driver (the rolling restart over
server.master.fleet) -> desired (the target: configuration + repository - failed versions)
-> ledger (failed.json, gauges, strikes); each of them asks policy (pure rules) what to do.
"""

from server.master.rollout.controller import RolloutController
from server.master.rollout.driver import RolloutSettings

__all__ = ["RolloutController", "RolloutSettings"]
