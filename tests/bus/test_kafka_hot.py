"""The Kafka bus's hot delivery streams and event records: a worker's append (every event new,
in seq order) takes a path with no step per event; what it leaves is what the per-event path
leaves (invariants 2 and 3: no loss, no duplicate, contiguous seq; Koder agent stream §7 T3:
resume after a seq reads the same events).
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.bus import base
from runwire.bus.base import StreamKey, ascending_past
from runwire.bus.kafka.hot import HotStreams
from runwire.bus.kafka.io import RECORD_EVENTS, event_records
from runwire.core.envelope import Event, encode
from runwire.core.lines import encode_lines
from tests.events import deltas, event
from tests.workers.test_core import compiled

KEY: StreamKey = ("run-h", "raw")


def _streams(maxlen: int = 8, max_events: int = 1000) -> HotStreams:
    return HotStreams(maxlen=maxlen, max_events=max_events, ttl_s=3600, grace_s=10)


def _one_by_one(streams: HotStreams, key: StreamKey, events: list[Event], at: float | None = None) -> int:
    """The per-event path: each event added alone (a tuple is not taken as a whole append)."""
    return sum(streams.add(key, (e,), at) for e in events)


@pytest.mark.parametrize("batches", [[3, 4], [8], [5, 9], [2, 2, 2, 2, 2]])
def test_an_append_at_once_holds_what_one_by_one_holds(batches: list[int]) -> None:
    whole, single = _streams(), _streams()
    seq = 0
    for size in batches:
        events = deltas("run-h", seq + 1, seq + size)
        seq += size
        assert whole.add(KEY, events) == size == _one_by_one(single, KEY, events)
    assert whole.read(KEY, 0, 100) == single.read(KEY, 0, 100)
    assert whole.bounds(KEY) == single.bounds(KEY) == (max(1, seq - 7), seq)
    assert whole.held_events == single.held_events == min(seq, 8)
    assert whole.last_seq(KEY) == seq


def test_an_append_past_the_bound_on_held_events_evicts_the_least_recent_stream() -> None:
    streams = _streams(maxlen=100, max_events=10)
    other: StreamKey = ("run-o", "raw")
    streams.add(other, deltas("run-o", 1, 6))
    streams.add(KEY, deltas("run-h", 1, 6))
    assert streams.held_events == 6  # the older stream's events went
    assert streams.read(other, 0, 100) == []
    assert [e.seq for e in streams.read(KEY, 0, 100)] == list(range(1, 7))


def test_events_already_held_are_not_added_again() -> None:
    streams = _streams()
    streams.add(KEY, deltas("run-h", 1, 4))
    assert streams.add(KEY, deltas("run-h", 3, 6)) == 2  # 3 and 4 are there
    assert [e.seq for e in streams.read(KEY, 0, 100)] == list(range(1, 7))
    assert streams.held_events == 6


@pytest.mark.parametrize("whole", [True, False])
def test_the_runs_own_end_in_an_append_ends_its_stream_a_childs_does_not(whole: bool) -> None:
    past = time.time() - 60  # appended longer ago than the grace: an ended stream's events go
    child_end = [*deltas("run-h", 1, 2), event("run-h", 3, "run.lifecycle", {"state": "done"}, child_id="run-c")]
    own_end = [*deltas("run-h", 1, 2), event("run-h", 3, "run.lifecycle", {"state": "done"})]
    for events, ends in ((child_end, False), (own_end, True)):
        streams = _streams()
        if whole:
            streams.add(KEY, events, past)
        else:
            _one_by_one(streams, KEY, events, past)
        assert (streams.read(KEY, 0, 100) == []) is ends


def test_ascending_past_is_every_event_new_and_in_order() -> None:
    events = deltas("run-h", 5, 8)
    assert ascending_past(events, 4)
    assert not ascending_past(events, 5)
    assert not ascending_past([events[1], events[0]], 0)
    assert not ascending_past([events[0], events[0]], 0)
    assert not ascending_past([], 0)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.integers(1, 2**63 - 1) | st.integers(1, 6), max_size=8),
       st.integers(-(2**63), 2**63 - 1) | st.integers(0, 6))
def test_the_compiled_order_check_gives_the_twins_verdict(seqs: list[int], last: int) -> None:
    events = [event("run-h", seq, text="x") for seq in seqs]
    expected = base._ascending_past(events, last)
    assert compiled().ascending_past(events, last) is expected
    assert ascending_past(events, last) is expected  # (what runs: compiled where built)
    assert expected is (bool(seqs) and all(b > a for a, b in zip([last, *seqs], seqs, strict=False)))


@pytest.mark.parametrize("count", [1, 40, RECORD_EVENTS, RECORD_EVENTS + 1, 1300])
def test_a_streams_lines_become_the_records_its_events_bytes_become(count: int) -> None:
    events = deltas("run-h", 1, count)
    one_by_one = event_records(0, b"run-h", ("v", b"raw"), events, [encode(e) for e in events])
    at_once = event_records(0, b"run-h", ("v", b"raw"), events, encode_lines(events))
    assert at_once == one_by_one
    assert len(at_once) == -(-count // RECORD_EVENTS)
