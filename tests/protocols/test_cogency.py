"""The ``cogency`` codec: the Cogency streaming protocol's event stream in and out, losslessly (Koder agent stream §7 T1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.core import envelope
from runwire.core.errors import MalformedFrame
from runwire.protocols import egress, ingest
from runwire.protocols.cogency import PERSISTED_TYPES, cogency_type, is_persisted
from runwire.protocols.framediff import same

FIXTURES = Path(__file__).parent.parent / "fixtures" / "cogency"
FIXTURE_FILES = sorted(FIXTURES.glob("*.ndjson"))


def lines(path: Path) -> list[bytes]:
    return [line.encode() for line in path.read_text().splitlines() if line.strip()]


def to_canonical(frames: list[bytes], run_id: str = "run-c") -> list[envelope.Event]:
    codec = ingest("cogency", run_id=run_id)
    out: list[envelope.Event] = []
    for frame in frames:
        out.extend(codec.feed(frame))
    return out


def round_trip(frames: list[bytes]) -> list[Any]:
    """cogency → canonical (through its JSON encoding) → cogency."""
    events = [envelope.decode(envelope.encode(e)) for e in to_canonical(frames)]
    out = egress("cogency")
    return [frame for event in events for frame in out.convert(event)]


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_spec_examples_round_trip_field_for_field(path: Path) -> None:
    """T1: "cogency → canonical → cogency" keeps every field of every frame (the spec's own examples)."""
    frames = lines(path)
    back = round_trip(frames)
    assert back == [json.loads(f) for f in frames]
    # and the JSON types survive too (1700000002 stays an int, 1234567890.0 a float)
    assert same(back, [msgspec.json.decode(f) for f in frames])


def test_event_schema_maps_onto_core_types() -> None:
    """think → reasoning.delta, respond → text.delta, call → tool.start, result → tool.end,
    metric → x.usage, end → run.lifecycle done, interrupt → run.lifecycle aborted."""
    events = to_canonical(lines(FIXTURES / "event_schema.ndjson"))
    assert [e.type for e in events] == [
        "x.cogency.user", "reasoning.delta", "tool.start", "x.cogency.execute", "tool.end",
        "text.delta", "run.lifecycle", "x.usage", "x.cogency.error", "run.lifecycle",
    ]
    think, call, result, usage = events[1], events[2], events[4], events[7]
    assert isinstance(think, envelope.ReasoningDelta) and think.payload.text == "reasoning text"
    assert isinstance(call, envelope.ToolStart)
    assert (call.payload.tool, call.payload.input) == ("read", {"file": "main.py"})
    assert isinstance(result, envelope.ToolEnd)
    assert result.payload.call_id == call.payload.call_id and result.payload.ok
    assert result.payload.output == "..."
    assert isinstance(usage, envelope.Usage)
    assert (usage.payload.input_tokens, usage.payload.output_tokens) == (50, 30)
    assert usage.ext == {"cogency": {"sub": {"step": {"set": {"duration": 0.8}}}, "set": {
        "total": {"input": 100, "output": 50, "duration": 1.5}}}}
    assert [e.payload.state for e in events if isinstance(e, envelope.RunLifecycle)] == ["done", "aborted"]
    assert events[0].ts == "2009-02-13T23:31:30.000Z"
    assert [e.seq for e in events] == list(range(1, 11))


def test_calls_and_results_pair_in_order_and_failures_are_not_ok() -> None:
    """Results answer calls in order (Cogency streaming protocol: "All results returned"); error: true → ok false."""
    events = to_canonical(lines(FIXTURES / "tools_failing.ndjson"))
    starts = [e for e in events if isinstance(e, envelope.ToolStart)]
    ends = [e for e in events if isinstance(e, envelope.ToolEnd)]
    assert [s.payload.tool for s in starts] == ["list", "read"]
    assert [e.payload.call_id for e in ends] == [s.payload.call_id for s in starts]
    assert [e.payload.ok for e in ends] == [True, False]
    assert ends[1].payload.error == "File not found: config.json"
    # a call whose content is not JSON is kept verbatim as an extension, not rejected
    odd = [e for e in events if e.type == "x.cogency.call"]
    assert len(odd) == 1 and odd[0].payload_dict() == {"content": "not json at all"}


def test_call_ids_are_deterministic() -> None:
    frames = lines(FIXTURES / "tools_failing.ndjson")
    first = [e.payload_dict() for e in to_canonical(frames)]
    second = [e.payload_dict() for e in to_canonical(frames)]
    assert first == second


def test_persisted_types_follow_the_spec() -> None:
    """Cogency streaming protocol: "Only conversation events are persisted to storage: user, think, call, result, respond"."""
    assert PERSISTED_TYPES == {"user", "think", "call", "result", "respond"}
    events = to_canonical(lines(FIXTURES / "event_schema.ndjson"))
    kept = [cogency_type(e) for e in events if is_persisted(e)]
    assert kept == ["user", "think", "call", "result", "respond"]


def test_foreign_events_render_as_cogency() -> None:
    """Canonical events from another source become the cogency frames a cogency client reads."""
    def ev(kind: str, payload: dict[str, Any], seq: int) -> envelope.Event:
        return envelope.make(kind, payload, id=f"e{seq}", ts="2026-01-01T00:00:01.500Z", run_id="r", seq=seq)

    out = egress("cogency")
    frames = [
        f for e in [
            ev("reasoning.delta", {"text": "hm"}, 1),
            ev("tool.start", {"call_id": "c1", "tool": "web.search", "input": {"q": "x"}}, 2),
            ev("tool.end", {"call_id": "c1", "ok": False, "error": "KAI-TOOL-0001"}, 3),
            ev("step.boundary", {"step_index": 1, "step_kind": "tool-roundtrip"}, 4),
            ev("x.usage", {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}, 5),
            ev("run.lifecycle", {"state": "error", "reason": "boom"}, 6),
        ] for f in out.convert(e)
    ]
    assert frames == [
        {"type": "think", "content": "hm", "timestamp": 1767225601.5},
        {"type": "call", "content": '{"name": "web.search", "args": {"q": "x"}}', "timestamp": 1767225601.5},
        {"type": "result", "payload": {"outcome": "KAI-TOOL-0001", "content": "KAI-TOOL-0001", "error": True},
         "timestamp": 1767225601.5},
        {"type": "metric", "step": {"input": 3, "output": 4}, "timestamp": 1767225601.5},
        {"type": "error", "payload": {"error": "boom"}, "timestamp": 1767225601.5},
    ]


@pytest.mark.parametrize("frame", [b"not json", b'{"type": "shout"}', b"[1,2]", b'{"content": "x"}'])
def test_malformed_frames_are_rejected_with_proto_0001(frame: bytes) -> None:
    codec = ingest("cogency", run_id="r")
    with pytest.raises(MalformedFrame) as info:
        codec.feed(frame)
    assert info.value.code == "KAI-STREAM-PROTO-0001"
    # the codec stays usable
    assert codec.feed(b'{"type": "respond", "content": "ok"}')[0].type == "text.delta"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
frame_types = st.sampled_from(sorted(PERSISTED_TYPES | {"execute", "end", "metric", "error", "interrupt"}))


@st.composite
def cogency_frames(draw: st.DrawFn) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": draw(frame_types)}
    if draw(st.booleans()):
        frame["timestamp"] = draw(st.floats(0, 4e9) | st.integers(0, 4_000_000_000))
    kind = frame["type"]
    if kind in ("user", "think", "respond"):
        frame["content"] = draw(st.text())
    elif kind == "call":
        frame["content"] = draw(st.text() | st.builds(
            lambda n, a: json.dumps({"name": n, "args": a}), st.text(max_size=6), json_values))
    elif kind in ("result", "error"):
        frame["payload"] = draw(st.dictionaries(st.sampled_from(["outcome", "content", "error", "tool"]), json_values))
    elif kind == "metric":
        frame["step"] = draw(st.dictionaries(st.sampled_from(["input", "output", "duration"]), json_values))
    frame.update(draw(st.dictionaries(st.sampled_from(["extra", "note"]), json_values, max_size=1)))
    return frame


@settings(max_examples=60, deadline=None)
@given(st.lists(cogency_frames(), min_size=1, max_size=12))
def test_any_cogency_stream_round_trips(frames: list[dict[str, Any]]) -> None:
    """T1 over generated frames: whatever the fields, cogency → koder → cogency is exact."""
    raw = [msgspec.json.encode(f) for f in frames]
    assert same(round_trip(raw), frames)
