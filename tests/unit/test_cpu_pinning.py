"""server.cpu_pinning: CPU slots per worker and the choice for a new worker."""

from __future__ import annotations

from server.cpu_pinning import choose_slot, cpu_slots


def test_slots_split_the_allowed_cpus_evenly() -> None:
    assert cpu_slots([0, 1], 2) == [frozenset({0}), frozenset({1})]
    assert cpu_slots([2, 3, 4, 5, 6], 2) == [frozenset({2, 3}), frozenset({4, 5})]  # CPU 6 left over
    assert cpu_slots([0, 1], 3) == []  # more workers than CPUs: no pinning
    assert cpu_slots([0, 1], 0) == []


def test_new_workers_fill_the_least_used_slot() -> None:
    slots = cpu_slots([0, 1], 2)
    assert choose_slot(slots, []) == {0}
    assert choose_slot(slots, [frozenset({0})]) == {1}
    # a rollout's extra worker shares a slot; once the old worker on slot 0 is gone, its replacement gets 0
    assert choose_slot(slots, [frozenset({0}), frozenset({1})]) == {0}
    assert choose_slot(slots, [frozenset({1}), frozenset({0}), frozenset({1})]) == {0}
    assert choose_slot(slots, [None, frozenset({1})]) == {0}  # a worker forked before pinning counts for no slot


def test_no_slots_means_no_pinning() -> None:
    assert choose_slot([], [frozenset({0})]) is None
