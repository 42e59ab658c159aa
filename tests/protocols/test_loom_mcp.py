"""``loom-mcp`` codec (the loom-mcp stream package's Pulse envelopes): mapping, Koder agent stream §7 T1, bad input, foreign egress."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.core.envelope import (
    ChildSpawn,
    ReasoningDelta,
    RunLifecycle,
    TextDelta,
    ToolEnd,
    ToolStart,
    Usage,
)
from runwire.core.errors import MalformedFrame, ProtocolError, UnknownEventType
from runwire.protocols.loom_mcp import MCP_TYPES
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


@pytest.mark.parametrize("name", fixture_names("loom-mcp"))
def test_t1_every_loom_mcp_fixture_round_trips_exactly(name: str) -> None:
    """T1: loom-mcp → koder → loom-mcp keeps every field: event_key, session_id,
    timestamp (to the nanosecond), server_data, and payload fields without a canonical home."""
    round_trip("loom-mcp", fixture_lines("loom-mcp", name))


def test_fixture_covers_every_loom_mcp_event_type() -> None:
    lines = fixture_lines("loom-mcp", "spec_types.ndjson")
    assert {msgspec.json.decode(line)["type"] for line in lines} == set(MCP_TYPES)


def test_mapping_onto_core_types() -> None:
    events = {
        e.type: e for e in ingest_all("loom-mcp", fixture_lines("loom-mcp", "spec_types.ndjson"))
    }
    assert {
        "x.mcp.await_questions",
        "x.mcp.tool_update",
        "x.mcp.run_stream_end",
        "x.mcp.session_stream_started",
        "x.mcp.tool_call_args_delta",
        "x.mcp.planner_thought",
    } <= set(events)
    assert isinstance(events["text.delta"], TextDelta)
    assert isinstance(events["reasoning.delta"], ReasoningDelta)
    start, end = events["tool.start"], events["tool.end"]
    assert isinstance(start, ToolStart) and start.payload.input == {"city": "Paris"}
    assert isinstance(end, ToolEnd) and not end.payload.ok
    assert end.payload.error == {"message": "upstream timeout", "retryable": True}
    assert end.payload.duration_ms == 5
    spawn = events["child.spawn"]
    assert isinstance(spawn, ChildSpawn) and spawn.payload.child_id == "run-1-child-1"
    usage = events["x.usage"]
    assert isinstance(usage, Usage)
    assert (
        usage.payload.input_tokens,
        usage.payload.output_tokens,
        usage.payload.total_tokens,
    ) == (512, 64, 576)
    done = events["run.lifecycle"]
    assert isinstance(done, RunLifecycle) and done.payload.state == "done"


def test_planner_thought_uses_text_then_legacy_note() -> None:
    events = ingest_all("loom-mcp", fixture_lines("loom-mcp", "spec_types.ndjson"))
    thoughts = [e for e in events if isinstance(e, ReasoningDelta)]
    assert [t.payload.text for t in thoughts] == ["thinking", "The user wants a forecast."]


def test_envelope_fields_become_run_id_ts_and_seq() -> None:
    events = ingest_all("loom-mcp", fixture_lines("loom-mcp", "sample_run.ndjson"))
    assert {e.run_id for e in events} == {"run-7"}
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].ts == "2026-05-14T19:42:13.124Z"
    tool_end = events[2]
    assert isinstance(tool_end, ToolEnd) and tool_end.payload.duration_ms == 1842


def test_failed_workflow_is_an_error_with_the_user_safe_reason() -> None:
    events = ingest_all("loom-mcp", fixture_lines("loom-mcp", "failed_run.ndjson"))
    failed = events[1]
    assert isinstance(failed, RunLifecycle)
    assert (
        failed.payload.state == "error"
        and failed.payload.reason == "The model provider is unavailable."
    )


@pytest.mark.parametrize(
    ("frame", "error", "field"),
    [
        (b"{oops", MalformedFrame, None),
        (b'"assistant_reply"', MalformedFrame, "$"),
        (b'{"run_id":"r","payload":{}}', MalformedFrame, "$.type"),
        (b'{"type":"teleport","run_id":"r"}', UnknownEventType, "$.type"),
        (b'{"type":"assistant_reply","run_id":"r","payload":"hi"}', MalformedFrame, "$.payload"),
        (b'{"type":"assistant_reply","run_id":"r","payload":{}}', MalformedFrame, "$.payload.text"),
        (
            b'{"type":"tool_start","run_id":"r","payload":{"tool_call_id":"t"}}',
            MalformedFrame,
            "$.payload.tool_name",
        ),
        (
            b'{"type":"workflow","run_id":"r","payload":{"phase":3}}',
            MalformedFrame,
            "$.payload.phase",
        ),
        (
            b'{"type":"assistant_reply","run_id":5,"payload":{"text":"x"}}',
            MalformedFrame,
            "$.run_id",
        ),
        (
            b'{"type":"assistant_reply","timestamp":1.5,"payload":{"text":"x"}}',
            MalformedFrame,
            "$.timestamp",
        ),
    ],
)
def test_bad_frames_are_rejected_with_code_and_field(
    frame: bytes, error: type[ProtocolError], field: str | None
) -> None:
    caught, codec = rejected("loom-mcp", frame, error)
    assert caught.field == field
    (event,) = codec.feed(b'{"type":"assistant_reply","run_id":"r","payload":{"text":"next"}}')
    assert event.payload_dict() == {"text": "next"}


def test_foreign_stream_egresses_pulse_envelopes_ending_with_run_stream_end() -> None:
    """A koder run → loom-mcp: valid envelopes (re-ingestable), tool_end names its tool,
    child events are on the child's run, and the explicit end marker follows the terminal event."""
    frames = koder_sample_as("loom-mcp")
    assert [f["type"] for f in frames[-2:]] == ["workflow", "run_stream_end"]
    assert frames[-2]["payload"]["phase"] == "completed"
    ends = [f for f in frames if f["type"] == "tool_end"]
    assert ends[0]["payload"]["tool_name"] == "web.search"
    assert ends[1]["run_id"] == "run_cmp_child"
    assert all(f["event_key"] for f in frames)


def test_finish_ends_a_foreign_stream_once_and_adds_nothing_to_a_loom_mcp_stream() -> None:
    events = ingest_all("koder", fixture_lines("koder", "sample_run.ndjson"))[:5]
    frames = egress_all("loom-mcp", events, finish=True)
    assert frames[-1]["type"] == "run_stream_end"
    own = through_koder(ingest_all("loom-mcp", fixture_lines("loom-mcp", "spec_types.ndjson")[:3]))
    assert len(egress_all("loom-mcp", own, finish=True)) == 3


def test_foreign_types_keep_their_canonical_name_and_come_back() -> None:
    events = ingest_all("koder", fixture_lines("koder", "spec_examples.ndjson"))
    frames = egress_all("loom-mcp", events)
    back = through_koder(ingest_all("loom-mcp", [msgspec.json.encode(f) for f in frames]))
    assert [e.type for e in back] == [e.type for e in events]
    step = next(f for f in frames if f["type"] == "step.boundary")
    assert step["payload"]["step_kind"] == "tool-roundtrip"


# ------------------------------------------------------------ T1 over generated frames

_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "str": st.text(max_size=10),
    "int": st.integers(0, 10**12),
    "bool": st.booleans(),
    "arr": st.lists(st.integers() | st.text(max_size=4), max_size=3),
    "obj": st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    "any": st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
    | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
}
_STAMPS = st.sampled_from(
    ["2026-03-23T10:00:00Z", "2026-03-23T10:00:00.123456789Z", "2026-03-23T12:00:00+02:00"]
)


@st.composite
def mcp_frames(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(MCP_TYPES)))
    kinds, required = MCP_TYPES[kind]
    payload: dict[str, Any] = {}
    for name, value_kind in kinds.items():
        if name in required or draw(st.booleans()):
            payload[name] = draw(_VALUES[value_kind])
    if kind == "workflow" and draw(st.booleans()):
        payload["phase"] = draw(
            st.sampled_from(["completed", "failed", "canceled", "running", "paused"])
        )
    extras = draw(
        st.dictionaries(
            st.sampled_from(["x_extra", "payload", "result", "error"]), _VALUES["any"], max_size=2
        )
    )
    payload.update({k: v for k, v in extras.items() if k not in kinds})
    frame: dict[str, Any] = {"type": kind, "run_id": draw(st.sampled_from(["", "run-1", "run-2"]))}
    if draw(st.booleans()):
        frame["event_key"] = draw(_VALUES["str"])
    if draw(st.booleans()):
        frame["session_id"] = draw(_VALUES["str"])
    if draw(st.booleans()):
        frame["timestamp"] = draw(_STAMPS)
    if draw(st.booleans()) or payload:
        frame["payload"] = payload
    if kind == "tool_end" and draw(st.booleans()):
        frame["server_data"] = draw(_VALUES["any"])
    return frame


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(st.lists(mcp_frames(), min_size=1, max_size=10))
def test_t1_generated_loom_mcp_streams_round_trip_exactly(frames: list[dict[str, Any]]) -> None:
    """T1 over generated streams: every loom-mcp stream package type with optional envelope fields, empty
    run ids, nanosecond timestamps, extra and odd payload fields survives loom-mcp → koder → loom-mcp."""
    round_trip("loom-mcp", [msgspec.json.encode(frame) for frame in frames])
