"""A decoded batch's timestamp check, compiled (``runwire.core._native.ts_all_match``), against its
twin, the RFC 3339 pattern every reading of ``ts`` shares (``events._TS_RE``): the same verdict on
timestamps, near-timestamps and any text, and a batch refused for one bad ``ts`` wherever it is."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.core import events as events_module
from runwire.core import native
from runwire.core.envelope import decode_many
from runwire.core.events import _TS_RE
from tests.events import event
from tests.workers.test_core import compiled


def _digits(count: int) -> st.SearchStrategy[str]:
    return st.text("0123456789", min_size=count, max_size=count)


TIMESTAMPS = st.builds(
    lambda date, sep, time, fraction, zone: f"{date}{sep}{time}{fraction}{zone}",
    st.builds("{}-{}-{}".format, _digits(4), _digits(2), _digits(2)), st.sampled_from("Tt "),
    st.builds("{}:{}:{}".format, _digits(2), _digits(2), _digits(2)),
    st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=9).map(".".__add__)),
    st.one_of(st.sampled_from("Zz"), st.builds("{}{}:{}".format, st.sampled_from("+-"), _digits(2), _digits(2))),
)
"""What the pattern accepts."""
NEAR = st.one_of(
    TIMESTAMPS.map(lambda ts: ts + "\n"),  # \Z: no trailing newline
    TIMESTAMPS.map(lambda ts: ts[:-1]),
    TIMESTAMPS.map(lambda ts: "٣" + ts[1:]),  # a digit, but not ASCII
    st.builds(lambda ts, at, char: ts[:at] + char + ts[at + 1:], TIMESTAMPS, st.integers(0, 40),
              st.sampled_from("0123456789-:.TtZz +x\x00é")),
    st.builds(lambda ts, digits: ts[:19] + "." + "1" * digits + ts[19:].lstrip(".0123456789"), TIMESTAMPS,
              st.integers(0, 12)),  # fractions of 0 to 12 digits
)


@settings(max_examples=3000, deadline=None)
@given(st.one_of(TIMESTAMPS, NEAR, st.text(max_size=45)))
def test_the_compiled_check_gives_the_patterns_verdict_on_any_text(value: str) -> None:
    assert compiled().ts_matches(value) is (_TS_RE.match(value) is not None)


def test_the_check_refuses_what_rfc_3339_refuses() -> None:
    native = compiled()
    for good in ("2026-11-29T22:10:49Z", "2026-11-29t22:10:49.123456789z", "2026-11-29 22:10:49+05:30"):
        assert native.ts_matches(good), good
    for bad in ("2026-11-29T22:10:49", "2026-11-29T22:10:49.Z", "2026-11-29T22:10:49.1234567890Z",
                "2026-11-29T22:10:49+0530", "2026-11-29T22:10:49Z\n", "2026-11-29T22:10:4٩Z", 20261129):
        assert not native.ts_matches(bad), bad


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(TIMESTAMPS, NEAR), min_size=1, max_size=12))
def test_a_batch_passes_only_when_every_ts_does(stamps: list[str]) -> None:
    frames = [msgspec.json.encode(event("r", i + 1, text="x", ts="2026-01-01T00:00:00Z")
                                  ).replace(b'"2026-01-01T00:00:00Z"', msgspec.json.encode(ts))
              for i, ts in enumerate(stamps)]
    decoded = msgspec.json.Decoder(events_module._TypedEvent)
    batch = []
    for frame in frames:
        try:
            batch.append(decoded.decode(frame))
        except msgspec.ValidationError:  # (a ts over 40 characters, or under 10)
            return
    expected = all(_TS_RE.match(ts) for ts in stamps)
    assert compiled().ts_all_match(batch) is expected
    assert events_module._all_ts_match(batch) is expected
    if not expected:  # what a worker reads: the batch decoded frame by frame, the bad ones refused
        results = decode_many(frames)
        assert [isinstance(result, Exception) for result in results] == [not _TS_RE.match(ts) for ts in stamps]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(range(6)), max_size=30), st.sets(st.sampled_from(range(6))))
def test_what_is_left_to_read_of_a_batchs_ts_is_each_new_one_once_in_order(picks: list[int],
                                                                           read: set[int]) -> None:
    stamps = [f"2026-01-01T00:00:0{i}Z" for i in range(6)]
    batch = [event("r", n + 1, text="x", ts="".join(stamps[pick])) for n, pick in enumerate(picks)]  # (each its own str)
    cache = {stamps[i]: i for i in read}
    expected = [stamps[pick] for pick in dict.fromkeys(picks) if pick not in read]
    assert compiled().ts_new(batch, cache) == expected
    assert events_module._new_timestamps(batch, cache) == expected


def test_the_compiled_check_is_what_runs_where_built() -> None:
    expected = events_module._all_ts_match if native.pure_requested() else compiled().ts_all_match
    assert events_module.all_ts_match is expected
