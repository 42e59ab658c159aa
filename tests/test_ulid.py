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


def test_ids_across_milliseconds_and_seconds_increase_and_carry_each_millisecond() -> None:
    """An agent emitting an event every few milliseconds: each id carries its own millisecond
    (the last two time characters change every millisecond, the first eight about every second)."""
    gen = MonotonicULID("evt_")
    moments = [1_700_000_000_000 + step * 7 for step in range(3000)]  # 21 s, crossing many seconds
    ids = [gen.new(ms) for ms in moments for _ in range(2)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [ulid_timestamp_ms(i) for i in ids[::2]] == moments


def test_the_publishers_timestamps_are_the_emit_time_to_the_millisecond() -> None:
    import time
    from datetime import UTC, datetime

    from runwire.sdk.publisher import _Clock

    clock = _Clock()
    before = time.time()
    event_id, ts = clock.stamp()
    after = time.time()
    stamped = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    assert int(before * 1000) / 1000 <= stamped <= after
    assert ulid_timestamp_ms(event_id) == round(stamped * 1000)
