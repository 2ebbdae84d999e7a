"""The connection board: slots, the fair-share bound, and memory a forked worker shares with the master."""

from __future__ import annotations

import os

from server.connection_board import ConnectionBoard


def test_slots_are_handed_out_lowest_first_and_reused_after_release() -> None:
    board = ConnectionBoard(slots=3)
    assert board.free_slot(set()) == 0 and board.free_slot({0}) == 1 and board.free_slot({0, 1, 2}) is None
    board.publish(1, 5)
    assert board.counts() == [5]
    board.release(1)
    assert board.counts() == []


def test_a_worker_may_hold_an_even_share_plus_fifteen_percent_and_at_least_one_more() -> None:
    board = ConnectionBoard(slots=4)
    board.publish(0, 64)
    assert board.bound() > 64  # alone: no limit
    board.publish(1, 0)
    assert board.bound() == 32 + 5  # 64 over two workers: 32, plus 15 % rounded up
    board.publish(0, 12)
    board.publish(1, 4)
    assert board.bound() == 8 + 2  # 16 connections: 10 at most, even with 16 request threads
    board.publish(0, 1)
    board.publish(1, 0)
    assert board.bound() == 2  # few connections: one more than the share
    board.publish(2, 0)  # a third worker starts accepting (a rollout's new one): the share drops
    board.publish(0, 60)
    assert board.bound() == 20 + 3


def test_a_forked_worker_publishes_into_the_masters_board() -> None:
    board = ConnectionBoard(slots=2)
    child = os.fork()
    if child == 0:
        board.publish(1, 17)
        os._exit(0)
    os.waitpid(child, 0)
    assert board.counts() == [17]


def test_a_worker_that_stopped_publishing_leaves_the_share(monkeypatch) -> None:
    import server.connection_board as connection_board

    board = ConnectionBoard(slots=2)
    board.publish(0, 10)
    board.publish(1, 2)
    assert board.bound() == 6 + 1
    now = connection_board.time.monotonic()
    monkeypatch.setattr(connection_board.time, "monotonic", lambda: now + connection_board.STALE_MS / 1000 + 0.5)
    board.publish(0, 10)  # the other worker (slot 1) is stalled: slot 0 is alone, unlimited
    assert board.counts() == [10] and board.bound() > 10
