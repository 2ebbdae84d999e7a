"""Request ids, made once per request on every transport."""

from __future__ import annotations

import pytest

from server.dataplane.requests import request_id_for


@pytest.mark.parametrize("given", ["client-7", "a.b:c_d-1", "x" * 128])
def test_a_sane_request_id_is_kept(given: str) -> None:
    assert request_id_for(given) == given


@pytest.mark.parametrize("given", ["", "client-7\n", "client 7", "x" * 129, "id\r\nSet-Cookie: a=b"])
def test_any_other_request_id_is_replaced(given: str) -> None:
    """A final newline passed re.match with `$`: it must not reach a response header or a log line."""
    replaced = request_id_for(given)
    assert replaced != given and len(replaced) == 32
