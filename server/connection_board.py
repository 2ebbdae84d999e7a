"""Keep-alive connections spread evenly over the workers: a board of each worker's open connections.

Every worker accepts from the one listening socket, and a keep-alive connection stays with the
worker that accepted it for as long as the client keeps it: a burst of new connections could
leave one worker holding 61 of 64 (seen with `ss`), with half the machine's CPUs. The master
creates the board before the first fork (an anonymous shared mapping the workers inherit) and
gives each new worker a slot (pre_fork); a worker publishes its count while it accepts, accepts
only while it holds fewer than bound(), and while it holds more answers every request with
`Connection: close` (not only as many as the excess: requests answered at once all see the same
count), so those clients reconnect, mostly to other workers (server/worker/gthread.py). No
TensorFlow: the master imports this module.
"""

from __future__ import annotations

import mmap
import time

SLOTS = 32  # at least this many workers at once (the master sizes it for its worker count and rollouts)
FREE = -1
SLACK = 0.15  # a worker may hold this much above an even share before it sheds connections
STALE_MS = 3000  # a worker that has not published for this long is stalled: it does not count in the share


class ConnectionBoard:
    """Open-connection counts per worker slot, in memory shared by the master and every worker."""

    def __init__(self, slots: int = SLOTS) -> None:
        self._memory = mmap.mmap(-1, slots * 16)  # anonymous and MAP_SHARED: forked workers see one board
        self._counts = memoryview(self._memory)[: slots * 8].cast("q")
        self._published = memoryview(self._memory)[slots * 8 :].cast("q")  # CLOCK_MONOTONIC ms, one clock for all processes
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
        self._published[slot] = int(time.monotonic() * 1000)
        self._counts[slot] = connections

    def release(self, slot: int) -> None:
        """Worker leaving, or the master after reaping it: out of the share."""
        self._counts[slot] = FREE

    def counts(self) -> list[int]:
        """Open connections of every accepting worker that published lately.

        NOTE: gthread's loop publishes at least once a second. A worker stopped, hung or in a
        long pause must not cap the others at its own count while new clients wait in the backlog.
        """
        fresh = int(time.monotonic() * 1000) - STALE_MS
        return [count for count, at in zip(self._counts, self._published) if count >= 0 and at >= fresh]

    def bound(self) -> int:
        """Connections one worker may hold: an even share plus SLACK (at least one more than the share).

        NOTE: no floor at the thread count: with 16 connections and 16 threads one worker could
        hold them all while the other idled (measured: bench/results/code-notes.md#connection-bound).
        """
        live = self.counts()
        if len(live) < 2:
            return 1 << 30
        share = -(-sum(live) // len(live))
        return share + max(1, int(share * SLACK + 0.999))


BOARD: ConnectionBoard | None = None
GRPC_BOARD: ConnectionBoard | None = None  # the same slots, counting each worker's active gRPC connections (server.rpc.balance)


def create(slots: int = SLOTS) -> ConnectionBoard:
    """Master, before the first fork: the boards every worker will inherit (REST's, returned, and gRPC's)."""
    global BOARD, GRPC_BOARD
    if BOARD is None:
        BOARD = ConnectionBoard(slots)
        GRPC_BOARD = ConnectionBoard(slots)
    return BOARD
