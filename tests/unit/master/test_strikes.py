"""Deaths while loading a version: counted until the limit, cleared by a worker that serves it."""

from server.master.strikes import Strikes


def test_the_limit_is_reached_after_that_many_deaths_and_named_in_the_verdict() -> None:
    strikes = Strikes(limit=3)
    assert not strikes.add(("m", 2), "worker 1 killed")
    assert not strikes.add(("m", 2), "worker 2 killed")
    assert strikes.add(("m", 2), "worker 3 timeout")
    assert strikes.verdict(("m", 2)) == "workers died loading it 3 times in a row (last: worker 3 timeout)"


def test_a_worker_that_serves_the_version_clears_its_count() -> None:
    strikes = Strikes(limit=2)
    strikes.add(("m", 2), "worker 1 killed")
    strikes.clear(("m", 2))
    assert strikes.count(("m", 2)) == 0
    assert not strikes.add(("m", 2), "worker 2 killed")
    assert strikes.count(("m", 1)) == 0
