"""A joined batch's line check, compiled (``runwire.core._native.deep_lines``), against its twin
(``runwire.core.joined._deep_lines``: split, then count each wanted line's brackets), and what a
worker's decode makes of it: a batch that is not one line an event is decoded frame by frame, and
a tool event nested past the limit is refused alone wherever it is in the batch."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.core import envelope as envelope_module
from runwire.core import joined, native
from runwire.core.envelope import MAX_DEPTH, decode_joined
from runwire.core.errors import MalformedFrame
from tests.events import event
from tests.workers.test_core import compiled

LINES = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")) | st.text("{[]}x\"", max_size=40)
                 .map(str.encode), max_size=12)


@settings(max_examples=3000, deadline=None)
@given(LINES, st.integers(-1, 1), st.data(), st.integers(0, 8))
def test_the_compiled_check_gives_the_twins_verdict(lines: list[bytes], off: int, data: st.DataObject,
                                                    limit: int) -> None:
    buffer = b"\n".join(lines)
    count = max(0, max(1, len(lines)) + off)
    indexes = sorted(data.draw(st.sets(st.integers(0, max(0, count - 1)))) if count else set())
    expected = joined._deep_lines(buffer, count, indexes, limit) if all(
        i < len(buffer.split(b"\n")) for i in indexes) else None
    assert compiled().deep_lines(buffer, count, indexes, limit) == expected
    if expected is not None:
        assert expected == [i for i in indexes if buffer.split(b"\n")[i].count(b"{")
                            + buffer.split(b"\n")[i].count(b"[") > limit]


KINDS = st.sampled_from([
    lambda n, ext: event("r", n, text="x", ext=ext),
    lambda n, ext: event("r", n, "tool.start", {"call_id": "c", "tool": "t", "input": {"a": 1}}, ext=ext),
    lambda n, ext: event("r", n, "tool.end", {"call_id": "c", "ok": True, "output": [1]}, ext=ext),
    lambda n, ext: event("r", n, "step.boundary", {"step_index": 1, "step_kind": "plan"}, ext=ext),
    lambda n, ext: event("r", n, "x.acme.thing", {"deep": {"er": 1}}),
])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(KINDS, st.sampled_from([None, None, None, {"k": [1]}])), max_size=10))
def test_the_compiled_candidates_are_the_twins(kinds: list[tuple[object, object]]) -> None:
    events = [make(n + 1, ext) for n, (make, ext) in enumerate(kinds)]  # type: ignore[operator]
    free_form = envelope_module._FREE_FORM_TYPES
    expected = joined._deep_candidates(events, free_form)
    assert compiled().deep_candidates(events, free_form) == expected
    assert expected == [n for n, e in enumerate(events) if type(e) in free_form or getattr(e, "ext", None)]


def test_indexes_out_of_order_or_range_are_an_error_not_a_verdict() -> None:
    with pytest.raises(ValueError):
        compiled().deep_lines(b"a\nb", 2, [1, 0], 0)
    with pytest.raises(ValueError):
        compiled().deep_lines(b"a\nb", 2, [2], 0)


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("where", [0, 3, 6])
def test_a_too_deep_tool_event_is_refused_alone_wherever_it_is(where: int) -> None:
    events = [event("r", n + 1, text="x") for n in range(7)]
    events[where] = event("r", where + 1, "tool.start",
                          {"call_id": "t", "tool": "n", "input": {"a": _nested(MAX_DEPTH)}})
    results = decode_joined(b"\n".join(map(msgspec.json.encode, events)), len(events))
    assert results is not None
    assert [isinstance(r, MalformedFrame) for r in results] == [n == where for n in range(7)]
    assert "nested deeper" in str(results[where])


def test_a_batch_that_is_not_one_line_an_event_is_decoded_frame_by_frame() -> None:
    frames = [msgspec.json.encode(event("r", n + 1, text="x")) for n in range(3)]
    assert decode_joined(b"\n".join(frames), 3) is not None
    assert decode_joined(b"\n\n".join(frames), 3) is None  # (a blank line between: msgspec skips it)
    assert decode_joined(b"\n".join(frames) + b"\n", 3) is None


def test_the_compiled_checks_are_what_runs_where_built() -> None:
    pure = native.pure_requested()
    assert joined.deep_lines is (joined._deep_lines if pure else compiled().deep_lines)
    assert joined.deep_candidates is (joined._deep_candidates if pure else compiled().deep_candidates)
