"""The gRPC balancer's bound: how many active connections one worker may hold."""

from __future__ import annotations

import pytest

from server.rpc.balance import bound


def test_alone_there_is_no_bound() -> None:
    assert bound([]) is None
    assert bound([7]) is None


@pytest.mark.parametrize(("counts", "limit"), [
    ([3, 1], 2),  # 4 channels: 3-1 is 75 %, so the third is over
    ([5, 3], 4),  # 8: 5-3 is 62 %
    ([9, 7], 9),  # 16: 9-7 (56 %) stays, 10-6 (62 %) does not
    ([1, 0], 1),  # 1 channel: nothing to move
    ([2, 1], 2),  # 3: 2-1 is as even as it gets
])
def test_the_bound_keeps_a_worker_at_or_below_60_percent_from_4_channels(counts: list[int], limit: int) -> None:
    assert bound(counts) == limit
    total = sum(counts)
    if total >= 4:
        assert limit / total <= 0.6
