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

import threading
import time
from typing import Any, Callable

import grpc

WINDOW = 2.0  # a connection counts as active while it carried a call this recently (seconds)
UNCOUNTED = ("/grpc.health.v1.", "/grpc.reflection.")  # probes and tools: their connections carry no load


class ActivePeers(grpc.ServerInterceptor):
    """Notes the peer (one per connection: client address and port) of every inference call."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._wrapped: dict[str, Any] = {}  # method -> its handler, noting peers (built once per method)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        # NOTE: runs for every call on the shard's one serving thread: a dict lookup after the first call of a method
        known = self._wrapped.get(details.method)
        if known is not None:
            return known
        handler = continuation(details)
        if handler is None or handler.unary_unary is None or details.method.startswith(UNCOUNTED):
            return handler
        behavior = handler.unary_unary
        seen = self._seen

        def noted(request: Any, context: grpc.ServicerContext) -> Any:
            seen[context.peer()] = time.monotonic()  # NOTE: one dict store under the GIL, no lock on the call path
            return behavior(request, context)

        wrapped = self._wrapped[details.method] = handler._replace(unary_unary=noted)
        return wrapped

    def active(self, window: float = WINDOW) -> int:
        """Connections that carried a call within `window` seconds; older ones are forgotten."""
        horizon = time.monotonic() - window
        with self._lock:
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
