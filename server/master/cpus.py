"""Which CPUs each worker runs on: the master picks a slot before fork (pre_fork), the worker pins itself after (post_fork).

A worker's threads hand work to each other several times per request (gthread's poller, the
request thread, the executor, TensorFlow's pool). On a VM, a wakeup on another CPU costs an
inter-processor interrupt; a worker kept on its own CPUs pays that less often and keeps its
caches (docs/performance.md, "CPU partitioning", has the measurement).
"""

from __future__ import annotations

import os


def cpu_slots(allowed: list[int], workers: int) -> list[frozenset[int]]:
    """`allowed` split into `workers` disjoint equal slots (leftover CPUs go unused by pinning)."""
    if workers < 1 or len(allowed) < workers:
        return []
    size = len(allowed) // workers
    return [frozenset(allowed[i * size : (i + 1) * size]) for i in range(workers)]


def choose_slot(slots: list[frozenset[int]], taken: list[frozenset[int] | None]) -> frozenset[int] | None:
    """The slot the fewest live workers use (the first of those): a replacement fills the gap it left."""
    if not slots:
        return None
    return min(slots, key=lambda slot: (sum(1 for used in taken if used == slot), slots.index(slot)))


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))
