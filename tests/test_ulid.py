"""Event ids: Koder agent stream §2 "id — ULID, monotonic per stream"."""

from __future__ import annotations

from runwire.core.ulid import MonotonicULID, ulid_timestamp_ms


def test_ids_strictly_increase_within_one_millisecond_across_carries() -> None:
    gen = MonotonicULID("evt_")
    ids = [gen.new(1_700_000_000_000) for _ in range(5000)]  # one ms: 5000 increments, many carries
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 30 and i.startswith("evt_") for i in ids)


def test_ids_carry_their_millisecond_and_never_go_back_with_the_clock() -> None:
    gen = MonotonicULID()
    first = gen.new(2_000)
    earlier_clock = gen.new(1_000)  # the wall clock stepped back
    assert earlier_clock > first
    assert ulid_timestamp_ms(first) == 2_000
    assert ulid_timestamp_ms(gen.new(3_000)) == 3_000


def test_random_ulids_of_one_millisecond_are_not_neighbours() -> None:
    """Run ids handed to chat clients: knowing one tells nothing about the next (a monotonic
    generator's ids of one millisecond differ by one)."""
    from runwire.core.ulid import new_random_ulid

    ids = [new_random_ulid("run_") for _ in range(200)]
    tails = sorted(int.from_bytes(i[14:].encode(), "big") for i in ids)
    assert len(set(ids)) == 200 and all(i.startswith("run_") and len(i) == 30 for i in ids)
    assert min(b - a for a, b in zip(tails, tails[1:], strict=False)) > 1
