"""Model hosting in a worker: the registry, loading and warm-up, one executor per version, handlers, the TF runtime."""
