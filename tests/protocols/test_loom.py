"""``loom`` codec (Loom streaming output): mapping, Koder agent stream §7 T1 round trips, bad input, egress from other formats."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.core import envelope
from runwire.core.envelope import Extension, RunLifecycle, TextDelta, ToolEnd, ToolStart, Usage
from runwire.core.errors import MalformedFrame, ProtocolError, UnknownEventType
from runwire.protocols import ingest
from runwire.protocols.loom import LOOM_TYPES, LoomIngest
from runwire.protocols.loom_export import wrap
from tests.protocols.roundtrip import (
    egress_all,
    fixture_lines,
    fixture_names,
    ingest_all,
    koder_sample_as,
    rejected,
    round_trip,
    through_koder,
)


@pytest.mark.parametrize("name", fixture_names("loom"))
def test_t1_every_loom_fixture_round_trips_exactly(name: str) -> None:
    """T1 — "Round-trip: marshal → unmarshal → equal": loom → koder → loom keeps every
    field of every frame, envelope fields (session_id, node_id, event_id) and absences included."""
    round_trip("loom", fixture_lines("loom", name))


def test_spec_example_maps_onto_core_types() -> None:
    """Loom streaming output §4.3's example: run_start → running, chunks → text.delta, usage → x.usage,
    node spans → x.loom.*; event_id becomes seq; run_start's run_id names the run."""
    events = ingest_all("loom", fixture_lines("loom", "spec_with_envelope.ndjson"))
    assert [e.type for e in events] == [
        "run.lifecycle",
        "x.loom.node_enter",
        "text.delta",
        "text.delta",
        "x.usage",
        "x.loom.node_exit",
        "x.loom.reply",
    ]
    assert [e.seq for e in events] == [0, 1, 2, 3, 4, 5, 8]
    assert {e.run_id for e in events} == {"run-1"}
    start, chunk, usage = events[0], events[2], events[4]
    assert isinstance(start, RunLifecycle) and start.payload.state == "running"
    assert isinstance(chunk, TextDelta) and chunk.payload.text == "I"
    assert chunk.ext == {
        "loom": {"set": {"session_id": "sess-001", "node_id": "run-think-1", "id": "think"}}
    }
    assert isinstance(usage, Usage)
    assert (
        usage.payload.input_tokens,
        usage.payload.output_tokens,
        usage.payload.total_tokens,
    ) == (100, 62, 162)
    reply = events[-1]
    assert isinstance(reply, Extension) and reply.payload == {
        "reply": "I don't have access to your device's clock ..."
    }


def test_ids_are_monotonic_ulids_and_seq_counts_from_one_without_event_id() -> None:
    events = ingest_all("loom", fixture_lines("loom", "spec_without_envelope.ndjson"))
    ids = [e.id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(i.startswith("evt_") and len(i) == 30 for i in ids)
    assert [e.seq for e in events] == [1, 2, 3, 4]


def test_missing_event_id_is_recorded_so_egress_does_not_invent_it() -> None:
    """Ingest assigns seq, but a source frame without event_id comes back without one."""
    (event,) = ingest_all("loom", [b'{"type":"node_enter","id":"think"}'])
    assert event.ext == {"loom": {"del": ["event_id"]}}
    assert egress_all("loom", [event]) == [{"type": "node_enter", "id": "think"}]


def test_frame_the_rendering_reproduces_carries_an_empty_diff() -> None:
    """Nothing to restore, but still marked as loom's own (egress treats unmarked events as foreign)."""
    line = b'{"type":"tool_call","call_id":"c1","name":"grep","arguments":{"q":"x"},"event_id":3}'
    (event,) = ingest_all("loom", [line])
    assert isinstance(event, ToolStart) and event.ext == {"loom": {}}
    assert event.payload.input == {"q": "x"}


def test_t1_a_run_start_the_rendering_reproduces_comes_back_as_run_start() -> None:
    """Koder agent stream §7 T1: a later ``run_start`` whose rendering is exact is loom's own,
    not a foreign lifecycle event to carry as ``custom``."""
    frames = [{"type": "run_start"}] * 3 + [{"type": "run_start", "run_id": "0", "event_id": 0}]
    round_trip("loom", [msgspec.json.encode(frame) for frame in frames])


def test_run_id_comes_from_run_start_else_option_else_stable_default() -> None:
    chunk = b'{"type":"message_chunk","content":"hi","id":"n"}'
    assert ingest_all("loom", [chunk])[0].run_id == "loom-run"
    assert ingest_all("loom", [chunk], run_id="run-opt")[0].run_id == "run-opt"
    start = b'{"type":"run_start","run_id":"run-9"}'
    assert [e.run_id for e in ingest_all("loom", [chunk, start, chunk], run_id="run-opt")] == [
        "run-opt",
        "run-9",
        "run-9",
    ]


def test_tool_family_gives_one_tool_start_per_call_and_correlates_without_call_ids() -> None:
    """tool_call → tool.start; the tool_start that follows for the same call is x.loom.tool_start;
    tool_end without call_id answers the open call of that name; is_error → ok=false."""
    events = ingest_all("loom", fixture_lines("loom", "tot_got.ndjson"))
    tools = [e for e in events if e.type in ("tool.start", "tool.end", "x.loom.tool_start")]
    assert [e.type for e in tools] == ["tool.start", "x.loom.tool_start", "tool.end"]
    start, end = tools[0], tools[2]
    assert isinstance(start, ToolStart) and isinstance(end, ToolEnd)
    assert end.payload.call_id == start.payload.call_id
    assert end.payload.ok is False and end.payload.error == "timeout after 30s"


def test_tool_start_without_tool_call_is_the_tool_start() -> None:
    events = ingest_all(
        "loom",
        [
            b'{"type":"tool_start","call_id":"c1","name":"shell"}',
            b'{"type":"tool_end","call_id":"c1","name":"shell","result":"ok","is_error":false}',
        ],
    )
    assert [e.type for e in events] == ["tool.start", "tool.end"]
    end = events[1]
    assert isinstance(end, ToolEnd) and end.payload.ok and end.payload.output == "ok"


def test_families_without_a_core_type_become_namespaced_extensions() -> None:
    events = ingest_all("loom", fixture_lines("loom", "tot_got.ndjson"))
    kinds = {e.type for e in events}
    for name in (
        "tot_expand",
        "tot_evaluate",
        "tot_backtrack",
        "got_plan",
        "got_node_start",
        "got_node_complete",
        "got_node_failed",
        "got_expand",
        "custom",
    ):
        assert f"x.loom.{name}" in kinds
    evaluate = next(e for e in events if e.type == "x.loom.tot_evaluate")
    assert evaluate.payload_dict() == {"chosen": 1, "scores": [0.6, 0.8, 0.4]}


@pytest.mark.parametrize(
    ("frame", "error", "field"),
    [
        (b"not json", MalformedFrame, None),
        (b"[1, 2]", MalformedFrame, "$"),
        (b'{"id":"think"}', MalformedFrame, "$.type"),
        (b'{"type":7}', MalformedFrame, "$.type"),
        (b'{"type":"teleport"}', UnknownEventType, "$.type"),
        (b'{"type":"message_chunk","id":"think"}', MalformedFrame, "$.content"),
        (b'{"type":"message_chunk","content":5}', MalformedFrame, "$.content"),
        (b'{"type":"node_enter","id":"a","event_id":"7"}', MalformedFrame, "$.event_id"),
        (b'{"type":"node_enter","id":"a","session_id":1}', MalformedFrame, "$.session_id"),
        (b'{"reply":42}', MalformedFrame, "$.reply"),
        (b'{"type":"tool_end","name":"x","is_error":"no"}', MalformedFrame, "$.is_error"),
    ],
)
def test_bad_frames_are_rejected_with_code_and_field(
    frame: bytes, error: type[ProtocolError], field: str | None
) -> None:
    """PROTO-0001 for malformed frames, PROTO-0002 for unknown types; the error names the field."""
    caught, _ = rejected("loom", frame, error)
    assert caught.field == field
    assert str(caught).startswith(caught.code)
    assert caught.code == (
        "KAI-STREAM-PROTO-0002" if error is UnknownEventType else "KAI-STREAM-PROTO-0001"
    )


def test_codec_stays_usable_after_a_bad_frame() -> None:
    codec = ingest("loom")
    codec.feed(b'{"type":"run_start","run_id":"r1"}')
    with pytest.raises(ProtocolError):
        codec.feed(b'{"type":"bogus"}')
    (event,) = codec.feed(b'{"type":"message_chunk","content":"still here","id":"n"}')
    assert (
        event.run_id == "r1" and event.seq == 2 and event.payload_dict() == {"text": "still here"}
    )


def test_frame_over_the_size_limit_is_rejected() -> None:
    codec = LoomIngest(max_bytes=64)
    big = msgspec.json.encode({"type": "message_chunk", "content": "x" * 100})
    with pytest.raises(MalformedFrame, match="over the 64-byte limit"):
        codec.feed(big)
    assert codec.feed(b'{"type":"message_chunk","content":"ok"}')


def test_foreign_stream_egresses_as_valid_loom_frames_ending_with_a_reply() -> None:
    """A koder run → loom: every frame is accepted by the loom ingest; tool_end names its
    tool; events loom has no type for ride in custom; the run's text ends in a reply frame."""
    frames = koder_sample_as("loom")
    tool_end = next(f for f in frames if f.get("type") == "tool_end")
    assert tool_end["name"] == "web.search"
    assert frames[-1] == {"reply": "The cheapest is model B at 899 EUR."}
    assert sum(1 for f in frames if f.get("type") == "run_start") == 1


def test_foreign_events_survive_koder_loom_koder() -> None:
    """Types loom lacks (reasoning, steps, plans, child events) ride in custom frames and come
    back exactly; the natively mapped ones keep their type."""
    events = ingest_all("koder", fixture_lines("koder", "sample_run.ndjson"))
    frames = egress_all("loom", events)
    back = through_koder(ingest_all("loom", [msgspec.json.encode(f) for f in frames]))
    assert back[-1].type == "x.loom.reply"
    back = back[:-1]
    assert [e.type for e in back] == [e.type for e in events]
    assert [e.child_id for e in back] == [e.child_id for e in events]
    carried = [
        (original, returned)
        for original, returned, frame in zip(events, back, frames, strict=False)
        if frame.get("type") == "custom"
    ]
    assert {o.type for o, _ in carried} >= {"reasoning.delta", "step.boundary", "plan.proposal"}
    for original, returned in carried:
        assert returned.payload_dict() == original.payload_dict()


def test_finish_adds_nothing_to_a_loom_stream() -> None:
    """A loom stream has no terminal event; re-encoding it must not invent a reply."""
    events = ingest_all("loom", fixture_lines("loom", "spec_without_envelope.ndjson"))
    frames = egress_all("loom", through_koder(events), finish=True)
    assert not any("reply" in f for f in frames)


def test_encoded_events_are_canonical_envelopes() -> None:
    for name in fixture_names("loom"):
        for event in ingest_all("loom", fixture_lines("loom", name)):
            assert envelope.decode(envelope.encode(event)) == event


# ------------------------------------------------------------ T1 over generated frames

_KIND_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "str": st.text(max_size=10),
    "num": st.integers(-5, 10**6) | st.floats(allow_nan=False, allow_infinity=False),
    "int": st.integers(0, 10**6),
    "bool": st.booleans(),
    "arr": st.lists(st.integers() | st.text(max_size=4), max_size=3),
    "obj": st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    "any": st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=6)
    | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
}


@st.composite
def loom_frames(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from([*LOOM_TYPES, "reply"]))
    frame: dict[str, Any] = {}
    if kind == "reply":
        frame["reply"] = draw(st.text(max_size=20))
    else:
        frame["type"] = kind
        kinds, required = LOOM_TYPES[kind]
        for name, value_kind in kinds.items():
            if name in required or draw(st.booleans()):
                frame[name] = draw(_KIND_VALUES[value_kind])
        for name in required:
            frame.setdefault(name, draw(_KIND_VALUES["any"]))
        if kind == "custom" and draw(st.booleans()):
            frame["value"] = {"runwire": {"type": "x.a.b", "payload": {"k": 1}}}
    extra = draw(
        st.dictionaries(st.sampled_from(["extra", "meta", "k"]), _KIND_VALUES["any"], max_size=2)
    )
    frame.update(extra)
    if draw(st.booleans()):
        frame["session_id"] = draw(_KIND_VALUES["str"])
    if draw(st.booleans()):
        frame["node_id"] = draw(_KIND_VALUES["str"])
    if draw(st.booleans()):
        frame["event_id"] = draw(_KIND_VALUES["num"])
    return frame


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(st.lists(loom_frames(), min_size=1, max_size=10))
def test_t1_generated_loom_streams_round_trip_exactly(frames: list[dict[str, Any]]) -> None:
    """T1 over generated streams: any valid loom frame — every type, optional envelope fields,
    odd event_ids (negative, fractional), extra payload fields — survives loom → koder → loom,
    and so does its loom-export form."""
    lines = [msgspec.json.encode(frame) for frame in frames]
    round_trip("loom", lines)
    exported = [msgspec.json.encode(wrap(frame)) for frame in frames]
    round_trip("loom-export", exported)
