"""The canonical envelope (Koder agent stream §2–3): decode/encode, errors, size limit, T1."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.core import envelope
from runwire.core.envelope import (
    CORE_TYPES,
    EVENT_CLASSES,
    ChildSpawn,
    Event,
    Extension,
    PlanProposal,
    RunLifecycle,
    ToolEnd,
    ToolStart,
)
from runwire.core.errors import MalformedFrame, ProtocolError, UnknownEventType
from runwire.core.lines import encode_lines as lines_of
from runwire.core.lines import join_lines

SPEC_EXAMPLES = Path(__file__).parent / "fixtures" / "koder" / "spec_examples.ndjson"
GOOD = {
    "id": "evt_01HZ7K4P",
    "ts": "2026-05-14T19:42:13.124Z",
    "type": "text.delta",
    "run_id": "run_01HZ7K3M",
    "seq": 127,
    "payload": {"text": "I'll compare the three..."},
}


def _frame(**changes: Any) -> bytes:
    data = {**GOOD, **changes}
    return msgspec.json.encode({k: v for k, v in data.items() if v is not ...})


# ------------------------------------------------------------ Koder agent stream §3 examples


def test_every_core_type_has_a_spec_example_fixture() -> None:
    kinds = [msgspec.json.decode(line)["type"] for line in SPEC_EXAMPLES.read_bytes().splitlines()]
    assert sorted(kinds) == sorted(cls.type_name for cls in CORE_TYPES)


@pytest.mark.parametrize(
    "line", SPEC_EXAMPLES.read_bytes().splitlines(), ids=lambda b: msgspec.json.decode(b)["type"]
)
def test_spec_examples_decode_to_their_typed_class_and_round_trip(line: bytes) -> None:
    """T1 — "marshal → unmarshal → equal" on each §3 example (``child_id: null`` accepted)."""
    event = envelope.decode(line)
    source = msgspec.json.decode(line)
    assert type(event) is EVENT_CLASSES[source["type"]]
    assert event.type == source["type"] and event.seq == source["seq"] and event.child_id is None
    assert envelope.decode(envelope.encode(event)) == event


def test_typed_payload_fields_are_reachable() -> None:
    events = {e.type: e for e in map(envelope.decode, SPEC_EXAMPLES.read_bytes().splitlines())}
    start, end = events["tool.start"], events["tool.end"]
    assert isinstance(start, ToolStart) and start.payload.skill_id == "compare-products@0.2.0"
    assert isinstance(end, ToolEnd) and end.payload.duration_ms == 1842 and end.payload.ok
    plan = events["plan.proposal"]
    assert isinstance(plan, PlanProposal) and [s.intent for s in plan.payload.plan.steps] == [
        "research",
        "write",
    ]
    spawn = events["child.spawn"]
    assert isinstance(spawn, ChildSpawn) and spawn.payload.tools_allowed == [
        "browser",
        "web.extract",
    ]
    running = events["run.lifecycle"]
    assert isinstance(running, RunLifecycle) and running.payload.state == "running"


def test_extension_types_keep_their_payload_verbatim() -> None:
    payload = {"candidates": ["a", "b"], "nested": {"n": 1.5, "flag": True, "none": None}}
    event = envelope.decode(_frame(type="x.loom.tot_expand", payload=payload))
    assert isinstance(event, Extension) and event.payload == payload
    assert msgspec.json.decode(envelope.encode(event))["payload"] == payload


def test_runwire_extension_types_are_typed() -> None:
    usage = envelope.decode(_frame(type="x.usage", payload={"input_tokens": 3, "output_tokens": 4}))
    assert usage.type == "x.usage" and usage.payload_dict() == {
        "input_tokens": 3,
        "output_tokens": 4,
    }
    with pytest.raises(MalformedFrame) as caught:
        envelope.decode(_frame(type="x.gap", payload={"run_id": "r", "first": "one", "last": 2}))
    assert caught.value.field == "$.payload.first"


# ------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("frame", "field", "says"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[]", "$", "Expected `object`"),
        (_frame(type=...), "$.type", "`type`"),
        (_frame(type=7), "$.type", "`type`"),
        (_frame(id=...), "$.id", "missing required field `id`"),
        (_frame(seq="127"), "$.seq", "Expected `int`"),
        (_frame(seq=-1), "$.seq", ">= 0"),
        (_frame(ts="yesterday noon"), "$.ts", "RFC 3339"),
        (_frame(ts="2026-05-14"), "$.ts", "RFC 3339"),
        (_frame(ts="14 May"), "$.ts", "length"),
        (_frame(run_id=""), "$.run_id", "length"),
        (_frame(payload={}), "$.payload.text", "missing required field `text`"),
        (_frame(payload={"text": 1}), "$.payload.text", "Expected `str`"),
        (_frame(payload={"text": "x", "extra": 1}), "$.payload.extra", "unknown field `extra`"),
        (_frame(surprise=1), "$.surprise", "unknown field `surprise`"),
        (
            _frame(type="run.lifecycle", payload={"state": "sleeping"}),
            "$.payload.state",
            "Invalid enum value",
        ),
        (
            _frame(type="step.boundary", payload={"step_index": 1, "step_kind": "nap"}),
            "$.payload.step_kind",
            "enum",
        ),
        (_frame(type="x.loom.node_enter", payload=[1]), "$.payload", "Expected `object`"),
    ],
)
def test_malformed_frames_are_proto_0001_naming_the_field(
    frame: bytes, field: str | None, says: str
) -> None:
    with pytest.raises(MalformedFrame) as caught:
        envelope.decode(frame)
    assert caught.value.code == "KAI-STREAM-PROTO-0001"
    assert caught.value.field == field
    assert says in caught.value.message


@pytest.mark.parametrize(
    "kind", ["reasoning", "text.deltas", "tool_start", "X.loom.a", "x.", "loom.node_enter"]
)
def test_unknown_types_are_proto_0002(kind: str) -> None:
    with pytest.raises(UnknownEventType) as caught:
        envelope.decode(_frame(type=kind))
    assert caught.value.code == "KAI-STREAM-PROTO-0002"
    assert caught.value.field == "$.type"
    assert repr(kind) in caught.value.message


def test_frames_over_the_size_limit_are_rejected_before_parsing() -> None:
    frame = _frame(payload={"text": "x" * 2000})
    with pytest.raises(MalformedFrame, match="over the 1000-byte limit"):
        envelope.decode(frame, max_bytes=1000)
    assert envelope.decode(frame, max_bytes=len(frame)).payload_dict()["text"] == "x" * 2000
    big = _frame(payload={"text": "x" * envelope.MAX_FRAME_BYTES})
    with pytest.raises(MalformedFrame, match="limit"):
        envelope.decode(big)


def test_make_validates_the_payload() -> None:
    with pytest.raises(MalformedFrame) as caught:
        envelope.make("tool.start", {"tool": "x"}, id="e", ts=GOOD["ts"], run_id="r", seq=1)
    assert caught.value.field == "$.payload.call_id"
    with pytest.raises(UnknownEventType):
        envelope.make("nope", {}, id="e", ts=GOOD["ts"], run_id="r", seq=1)


def test_decode_lines_matches_decoding_line_by_line() -> None:
    lines = SPEC_EXAMPLES.read_bytes().splitlines()
    assert envelope.decode_lines(b"\n".join(lines) + b"\n") == [
        envelope.decode(line) for line in lines
    ]


def test_decode_lines_reports_each_bad_line_in_place() -> None:
    ext = _frame(type="x.mcp.tool_update", payload={"tool_call_id": "t"})
    batch = b"\n".join([_frame(), b"{bad", ext, b"", _frame(type="nope")])
    results = envelope.decode_lines(batch)
    assert [type(r).__name__ for r in results] == [
        "TextDelta",
        "MalformedFrame",
        "Extension",
        "UnknownEventType",
    ]
    assert all(isinstance(r, ProtocolError) == (i in (1, 3)) for i, r in enumerate(results))


def test_decode_lines_checks_every_timestamp_of_a_batch() -> None:
    batch = b"\n".join(
        [_frame(), _frame(ts="2026-05-14 19:42:13.124+99"), _frame(ts="2026-05-14T19:42:13+02:00")]
    )
    results = envelope.decode_lines(batch)
    assert isinstance(results[1], MalformedFrame) and results[1].field == "$.ts"
    assert [r.ts for r in results if not isinstance(r, ProtocolError)] == [
        GOOD["ts"],
        "2026-05-14T19:42:13+02:00",
    ]


def test_decode_many_gives_one_result_per_frame_in_place() -> None:
    """A worker's batch of ingest entries: a bad entry (even one holding a newline,
    or nothing at all) affects only its own result, and nothing is skipped."""
    good = _frame()
    ext = _frame(type="x.mcp.tool_update", payload={"tool_call_id": "t"})
    split = good[:20] + b"\n" + good[20:]  # valid JSON across two lines
    frames = [good, b"", split, b"  ", ext, good + b"\n" + good, _frame(ts="2026-13-99")]
    results = envelope.decode_many(frames)
    assert len(results) == len(frames)
    assert [type(r).__name__ for r in results] == [
        "TextDelta", "MalformedFrame", "TextDelta", "MalformedFrame", "Extension",
        "MalformedFrame", "MalformedFrame",
    ]
    assert results[0] == results[2] == envelope.decode(good)


def test_decode_many_of_canonical_frames_equals_decoding_each() -> None:
    lines = SPEC_EXAMPLES.read_bytes().splitlines()
    assert envelope.decode_many(lines) == [envelope.decode(line) for line in lines]
    assert envelope.decode_many([]) == []
    too_big = envelope.decode_many([_frame()], max_bytes=10)
    assert isinstance(too_big[0], MalformedFrame)


# ------------------------------------------------------------ T1 with hypothesis

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
names = st.text(min_size=1, max_size=24)
maybe = lambda strategy: st.just(msgspec.UNSET) | st.none() | strategy  # noqa: E731
"""An optional field: absent, an explicit null, or a value (each must round-trip as itself)."""

timestamps = st.builds(
    lambda moment, offset, digits: _ts(moment, offset, digits),
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1)),
    st.sampled_from([None, 0, 330, -480]),
    st.sampled_from([0, 3, 6, 9]),
)


def _ts(moment: datetime, offset: int | None, digits: int) -> str:
    zone = UTC if offset is None else timezone(timedelta(minutes=offset))
    text = moment.replace(tzinfo=UTC).astimezone(zone).strftime("%Y-%m-%dT%H:%M:%S")
    if digits:
        text += "." + f"{moment.microsecond:06d}{moment.microsecond % 1000:03d}"[:digits]
    if offset is None:
        return text + "Z"
    sign = "+" if offset >= 0 else "-"
    return text + f"{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"


payloads: dict[str, st.SearchStrategy[Any]] = {
    "reasoning.delta": st.builds(envelope.TextPayload, text=st.text()),
    "text.delta": st.builds(envelope.TextPayload, text=st.text()),
    "tool.start": st.builds(
        envelope.ToolStartPayload,
        call_id=names,
        tool=names,
        input=st.just(msgspec.UNSET) | json_values,
        skill_id=maybe(names),
    ),
    "tool.end": st.builds(
        envelope.ToolEndPayload,
        call_id=names,
        ok=st.booleans(),
        output=st.just(msgspec.UNSET) | json_values,
        error=st.just(msgspec.UNSET) | json_values,
        duration_ms=maybe(st.integers(min_value=0, max_value=10**9)),
        blob_ref=maybe(names),
    ),
    "step.boundary": st.builds(
        envelope.StepBoundaryPayload,
        step_index=st.integers(min_value=0, max_value=10**6),
        step_kind=st.sampled_from(get_args(envelope.StepKind)),
        checkpoint_id=maybe(names),
    ),
    "child.spawn": st.builds(
        envelope.ChildSpawnPayload,
        child_id=names,
        prompt=maybe(st.text()),
        tools_allowed=maybe(st.lists(names, max_size=3)),
    ),
    "plan.proposal": st.builds(
        envelope.PlanProposalPayload,
        plan=st.builds(
            envelope.Plan,
            id=names,
            steps=st.lists(
                st.builds(
                    envelope.PlanStep,
                    id=names,
                    title=st.text(),
                    intent=st.sampled_from(
                        ["research", "write", "edit", "execute", "verify", "report", "other"]
                    ),
                    est_tools=maybe(st.lists(names, max_size=2)),
                    est_cost_usd=maybe(st.floats(min_value=0, max_value=1e6)),
                ),
                max_size=3,
            ),
            run_id=maybe(names),
            est_total_cost_usd=maybe(st.floats(min_value=0, max_value=1e6)),
        ),
    ),
    "run.lifecycle": st.builds(
        envelope.RunLifecyclePayload,
        state=st.sampled_from(get_args(envelope.LifecycleState)),
        reason=maybe(st.text()),
        dropped_count=maybe(st.integers(min_value=0, max_value=10**6)),
    ),
    "x.usage": st.builds(
        envelope.UsagePayload,
        input_tokens=st.integers(min_value=0, max_value=10**9),
        output_tokens=st.integers(min_value=0, max_value=10**9),
        total_tokens=st.integers(min_value=0, max_value=10**9),
        model=maybe(names),
    ),
    "x.gap": st.builds(
        envelope.GapPayload, run_id=names, first=st.integers(0, 10**6), last=st.integers(0, 10**6)
    ),
}
extension_types = st.from_regex(
    r"x\.[a-z0-9_-]{1,8}(\.[A-Za-z0-9_-]{1,10}){0,2}", fullmatch=True
).filter(lambda name: name not in EVENT_CLASSES)
envelope_fields = st.fixed_dictionaries(
    {
        "id": st.text(alphabet="0123456789ABCDEFGHJKMNPQRSTVWXYZ_evt", min_size=1, max_size=30),
        "ts": timestamps,
        "run_id": names,
        "seq": st.integers(min_value=0, max_value=2**62),
    },
    optional={
        "child_ref": maybe(names),
        "ext": st.dictionaries(
            st.sampled_from(["loom", "loom-mcp", "cogency"]), json_objects, max_size=2
        ),
        "span": st.tuples(st.integers(0, 10**9), st.integers(0, 10**9)),
        "parent_id": names,
        "root_id": names,
        "tenant": names,
    },
)


@st.composite
def events(draw: st.DrawFn) -> Event:
    fields = draw(envelope_fields)
    kind = draw(st.sampled_from([*payloads, "extension"]))
    if kind == "extension":
        return Extension(type=draw(extension_types), payload=draw(json_objects), **fields)
    return envelope.make(kind, draw(payloads[kind]), **fields)


@settings(max_examples=400, deadline=None)
@given(events())
def test_t1_round_trip_of_generated_envelopes(event: Event) -> None:
    """T1 — "Round-trip: marshal → unmarshal → equal", over every type, x.* extensions,
    and the optional envelope fields (child_id, ext, span, parent_id, root_id, tenant)."""
    wire = envelope.encode(event)
    assert envelope.decode(wire) == event
    assert envelope.encode(envelope.decode(wire)) == wire
    assert envelope.from_builtins(envelope.to_builtins(event)) == event


@settings(max_examples=100, deadline=None)
@given(st.lists(events(), min_size=1, max_size=8))
def test_batch_decoding_equals_single_decoding(batch: list[Event]) -> None:
    wire = b"\n".join(envelope.encode(e) for e in batch)
    assert envelope.decode_lines(wire) == batch


@settings(max_examples=100, deadline=None)
@given(st.lists(events(), max_size=8))
def test_batch_encoding_equals_encoding_each(batch: list[Event]) -> None:
    """A worker's write encodes a stream's events in one call (``encode_lines``): the lines
    stored (joined) and each line read back are exactly what ``encode`` makes of each event,
    newlines and other control characters in texts included."""
    each = [envelope.encode(e) for e in batch]
    lines = lines_of(batch)
    assert lines.joined == b"\n".join(each)
    assert join_lines(lines) == b"\n".join(each)
    assert list(lines) == each and len(lines) == len(batch)
    if batch:
        assert lines[-1] == each[-1] and lines[1:] == each[1:]
        assert join_lines(lines, 1) == b"\n".join(each[1:])


def test_batch_encoding_keeps_texts_with_newlines_on_one_line() -> None:
    text = envelope.make("text.delta", {"text": "a\nb\r\n\u2028c"}, id="evt_1", ts=GOOD["ts"],
                         run_id="run_1", seq=1)
    lines = lines_of([text, text])
    assert len(lines.joined.split(b"\n")) == 2
    assert [envelope.decode(line) for line in lines] == [text, text]


def test_a_sub_runs_own_stream_is_told_apart_from_one_that_holds_a_tree_of_runs() -> None:
    """What the worker hands the span exporter as it encodes: a root's stream, own events first or
    fanned-in ones first, and a sub-run's stream that begins with a grandchild's copy, but not a
    sub-run's own stream (its events are fanned into its root's)."""
    from runwire.core.events import is_sub_runs_own
    from tests.events import event

    assert not is_sub_runs_own([event("root", 1)])
    assert not is_sub_runs_own([event("root", 2, child_id="kid"), event("root", 3)])
    assert is_sub_runs_own([event("kid", 1, parent_id="root", root_id="root")])
    assert not is_sub_runs_own([event("kid", 4, child_id="grandkid"), event("kid", 5, parent_id="root")])
    assert not is_sub_runs_own([event("kid", 6, child_id="grandkid", parent_id="kid")])  # a copy, whatever its links
    assert not is_sub_runs_own([])
