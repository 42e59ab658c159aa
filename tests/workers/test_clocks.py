"""Clocks that disagree: a publisher whose clock is minutes off the worker's.

What runwire trusts an event's ``ts`` for (``docs/workers.md`` § Clocks): the shaping windows
of one run (event time: Koder agent stream §4 R1) and display. Order is the publisher's seq,
and the silence clock, a quiet stream's tick and retention are the worker's and the log's own
clocks. So a publisher five minutes ahead or behind gets its deltas shaped the same, its quiet
last words out within the quiet time, its events in publish order.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from runwire.core.envelope import format_ts
from runwire.processing.processor import Processor
from runwire.processing.shaping import shape
from tests.events import event
from tests.workers.test_logic import Streams, texts


@pytest.mark.parametrize("skew_s", [300.0, -300.0], ids=["ahead", "behind"])
def test_a_publisher_minutes_off_gets_its_quiet_last_words_out_within_the_quiet_time(skew_s: float) -> None:
    now = [time.time()]
    streams = Streams(Processor(clock=lambda: now[0], quiet_s=0.25))
    publisher = datetime.fromtimestamp(now[0], UTC) + timedelta(seconds=skew_s)
    said = [event("run_skew", seq, text=f"w{seq} ", ts=format_ts(publisher + timedelta(milliseconds=30 * seq)))
            for seq in range(1, 9)]
    streams.feed(said[:4])
    now[0] += 0.12
    streams.feed(said[4:])
    assert [e.seq for e in streams.raw["run_skew"]] == list(range(1, 9))  # publish order, not ts
    now[0] += 0.3  # quiet for the quiet time: the tick speaks for the stream
    streams.tick(now[0])
    shaped = streams.shaped["run_skew"]
    assert texts(shaped) == "".join(f"w{seq} " for seq in range(1, 9))
    # the windows are the event-time ones shape() cuts from the same events
    assert [(e.seq, e.span) for e in shaped] == [(e.seq, e.span) for e in shape(said)]
