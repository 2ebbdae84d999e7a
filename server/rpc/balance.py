"""gRPC connections spread over the workers: which connections carry calls, and when a worker sheds some.

Runs in a worker only. HTTP/2 channels are long-lived and the kernel hashes each new connection
to one SO_REUSEPORT listener, so 4 channels often sit 3 on one worker and 1 on the other (75 %).
grpcio has no per-connection API in Python, and a server's stop() cancels calls that were just
arriving. So each worker runs a few servers ("shards", server.rpc.listener), each with its own
listening socket on the port; a worker holding more active connections than its share
(server.connection_board.GRPC_BOARD) stops listening on one of them (server.rpc.sockets.pause),
and starts listening again below its share. Connections move only at max_connection_age, by
grpc-core's graceful GOAWAY; fewer listening sockets here send more of them to other workers.
"""

from __future__ import annotations

import time

WINDOW = 2.0  # a connection counts as active while it carried a call this recently (seconds)


class ActivePeers:
    """The peers (one per connection: client address and port) that carried inference calls lately."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}

    def note(self, peer: str) -> None:
        """Loop thread: a call arrived from `peer` (health checks and reflection are not noted: they carry no load)."""
        self._seen[peer] = time.monotonic()

    def active(self, window: float = WINDOW) -> int:
        """Connections that carried a call within `window` seconds; older ones are forgotten."""
        horizon = time.monotonic() - window
        for peer, at in list(self._seen.items()):
            if at < horizon:
                self._seen.pop(peer, None)
        return len(self._seen)


def bound(counts: list[int]) -> int | None:
    """Active connections one worker may hold: an even share rounded up, plus 1/8 of it; None alone.

    NOTE: tighter than REST's board (15 %): with 4 channels 3-1 is 75 % of the load, and with 8,
    5-3 is 62 %; 16 channels may sit 9-7 (56 %).
    """
    if len(counts) < 2:
        return None
    share = sum(counts) / len(counts)
    return -(-sum(counts) // len(counts)) + int(share / 8)
