"""Keep-alive connections spread evenly over the workers: a board of each worker's open connections.

Every worker accepts from the one listening socket, and a keep-alive connection stays with the
worker that accepted it for as long as the client keeps it: a burst of new connections could
leave one worker holding 61 of 64 (seen with `ss`), with half the machine's CPUs. The master
creates the board before the first fork (an anonymous shared mapping the workers inherit) and
gives each new worker a slot (pre_fork); a worker publishes its count while it accepts, stops
accepting above its fair share, and answers with `Connection: close` on connections it holds beyond
it, so those clients reconnect to another worker. No TensorFlow: the master imports this module.
"""

from __future__ import annotations

import mmap

SLOTS = 32  # workers at once, the rollout's extra one included; a worker without a slot is not balanced
FREE = -1
SLACK = 0.15  # a worker may hold this much above an even share before it sheds connections


class ConnectionBoard:
    """Open-connection counts per worker slot, in memory shared by the master and every worker."""

    def __init__(self, slots: int = SLOTS) -> None:
        self._memory = mmap.mmap(-1, slots * 8)  # anonymous and MAP_SHARED: forked workers see one board
        self._counts = memoryview(self._memory).cast("q")
        for slot in range(slots):
            self._counts[slot] = FREE

    def free_slot(self, taken: set[int]) -> int | None:
        """Master: the lowest slot no live worker holds, cleared; None when every slot is taken."""
        slot = next((s for s in range(len(self._counts)) if s not in taken), None)
        if slot is not None:
            self._counts[slot] = FREE  # its last holder may have died without releasing it
        return slot

    def publish(self, slot: int, connections: int) -> None:
        """Worker: how many connections it holds now (it accepts: it counts in the share)."""
        self._counts[slot] = connections

    def release(self, slot: int) -> None:
        """Worker leaving, or the master after reaping it: out of the share."""
        self._counts[slot] = FREE

    def counts(self) -> list[int]:
        """Open connections of every accepting worker."""
        return [count for count in self._counts if count >= 0]

    def bound(self, floor: int) -> int:
        """Connections one worker may hold: an even share plus SLACK, never fewer than `floor`."""
        live = self.counts()
        if len(live) < 2:
            return 1 << 30
        share = -(-sum(live) // len(live))
        return max(floor, share + max(1, int(share * SLACK + 0.999)))


BOARD: ConnectionBoard | None = None


def create() -> ConnectionBoard:
    """Master, before the first fork: the board every worker will inherit."""
    global BOARD
    if BOARD is None:
        BOARD = ConnectionBoard()
    return BOARD
