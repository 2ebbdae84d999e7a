"""The bounded session against a real hostile receiver: answers cut at a few KB, redirects not followed, total time bounded."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Iterator

import pytest
import requests

from server.telemetry.bounded_http import MAX_BYTES, BoundedSession, total_seconds
from tests.support.hostile_receiver import HostileReceiver

BIG = 256 << 20


@pytest.fixture
def receiver() -> Iterator[HostileReceiver]:
    with HostileReceiver(size=BIG, interval=0.2) as instance:
        yield instance


def posted_within(session: requests.Session, url: str, timeout: object = (1.0, 2.0)) -> tuple[requests.Response, int, float]:
    """POST once: (answer, peak bytes Python allocated meanwhile, seconds)."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        response = session.post(url, data=b'{"inputs": null}', timeout=timeout)
        return response, tracemalloc.get_traced_memory()[1], time.monotonic() - started
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("mode", ["huge", "endless", "gzip"])
def test_a_huge_answer_costs_a_few_kb(receiver: HostileReceiver, mode: str) -> None:
    receiver.mode = mode
    with BoundedSession() as session:
        response, peak, seconds = posted_within(session, receiver.url)
    assert response.status_code == 200 and len(response.content) == MAX_BYTES
    assert peak < 1 << 20 and seconds < 3, (peak, seconds)
    if mode == "gzip":
        assert response.content[:2] == b"\x1f\x8b"  # the raw bytes: never inflated
    assert receiver.sent < 64 << 20  # the connection was closed: the receiver stopped long before the end


def test_a_short_answer_is_kept_whole_and_its_connection_reused(receiver: HostileReceiver) -> None:
    receiver.mode, receiver.size = "huge", 1000
    with BoundedSession() as session:
        first = session.post(receiver.url, data=b"x", timeout=(1.0, 2.0))
        second = session.post(receiver.url, data=b"x", timeout=(1.0, 2.0))
    assert first.content == second.content == b"\0" * 1000
    assert receiver.posts == 2 and receiver.connections == 1


def test_a_long_answers_connection_is_closed_not_drained(receiver: HostileReceiver) -> None:
    receiver.mode = "huge"
    with BoundedSession() as session:
        assert len(session.post(receiver.url, data=b"x", timeout=(1.0, 2.0)).content) == MAX_BYTES
        receiver.mode = "ok"
        assert session.post(receiver.url, data=b"x", timeout=(1.0, 2.0)).content == b""
    assert receiver.connections == 2


def test_a_redirect_is_the_answer_never_followed(receiver: HostileReceiver) -> None:
    with HostileReceiver() as elsewhere:
        receiver.mode, receiver.location = "redirect", elsewhere.url
        with BoundedSession() as session:
            response = session.post(receiver.url, data=b"secret", timeout=(1.0, 2.0))
            also = session.post(receiver.url, data=b"secret", timeout=(1.0, 2.0), allow_redirects=True)
        assert response.status_code == also.status_code == 307
        assert elsewhere.posts == 0 and receiver.posts == 2


@pytest.mark.parametrize("mode", ["trickle", "trickle_headers"])
def test_a_trickling_receiver_costs_the_timeouts_total(receiver: HostileReceiver, mode: str) -> None:
    receiver.mode = mode  # a byte every 0.2 s: no single read ever times out
    with BoundedSession() as session:
        started = time.monotonic()
        with pytest.raises(requests.Timeout, match="longer than 1.5 s in total"):
            session.post(receiver.url, data=b"x", timeout=(0.5, 1.0))
        assert 1.4 < time.monotonic() - started < 2.5
        receiver.mode = "ok"
        assert session.post(receiver.url, data=b"x", timeout=(0.5, 1.0)).status_code == 200  # the session goes on


def test_abort_ends_the_request_in_flight(receiver: HostileReceiver) -> None:
    receiver.mode, receiver.delay = "slow", 5.0
    with BoundedSession() as session:
        threading.Timer(0.3, session.abort).start()
        started = time.monotonic()
        with pytest.raises(requests.Timeout):
            session.post(receiver.url, data=b"x", timeout=(1.0, 10.0))
        assert time.monotonic() - started < 1.5


def test_the_total_is_the_timeouts_sum() -> None:
    assert total_seconds((1.0, 2.0)) == 3.0 and total_seconds(4) == 4.0 and total_seconds((1.0, None)) == 1.0
    assert total_seconds(None) > 0
