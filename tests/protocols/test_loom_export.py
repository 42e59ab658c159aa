"""``loom-export`` codec: Loom streaming output §6's single-key form, Koder agent stream §7 T1, equivalence with ``loom``."""

from __future__ import annotations

import msgspec
import pytest

from runwire.core.errors import MalformedFrame, ProtocolError, UnknownEventType
from runwire.protocols.loom import LOOM_TYPES
from runwire.protocols.loom_export import EXPORT_KEYS
from tests.protocols.roundtrip import (
    assert_same_frames,
    egress_all,
    fixture_lines,
    fixture_names,
    ingest_all,
    koder_sample_as,
    rejected,
    round_trip,
    through_koder,
)


@pytest.mark.parametrize("name", fixture_names("loom-export"))
def test_t1_every_export_fixture_round_trips_exactly(name: str) -> None:
    """T1: loom-export → koder → loom-export keeps every field of every frame."""
    round_trip("loom-export", fixture_lines("loom-export", name))


def test_every_loom_type_has_its_section_6_key() -> None:
    assert set(LOOM_TYPES) <= set(EXPORT_KEYS)
    assert EXPORT_KEYS["run_start"] == "RunStart"
    assert EXPORT_KEYS["node_enter"] == "TaskStart"
    assert EXPORT_KEYS["message_chunk"] == "Messages"
    assert EXPORT_KEYS["tool_approval"] == "ToolApproval"


@pytest.mark.parametrize("name", fixture_names("loom"))
def test_same_events_as_the_type_payload_form(name: str) -> None:
    """§6: "Semantics match; only the serialization form differs" — both forms of a stream
    give the same canonical events, and each converts exactly into the other."""
    loom_lines = fixture_lines("loom", name)
    from_loom = through_koder(ingest_all("loom", loom_lines))
    export_frames = egress_all("loom-export", from_loom)
    from_export = ingest_all("loom-export", [msgspec.json.encode(f) for f in export_frames])
    assert [(e.type, e.payload_dict(), e.seq, e.run_id, e.ext) for e in from_export] == [
        (e.type, e.payload_dict(), e.seq, e.run_id, e.ext) for e in from_loom
    ]
    back = egress_all("loom", through_koder(from_export))
    assert_same_frames(back, [msgspec.json.decode(line) for line in loom_lines])


def test_single_key_frame_decodes() -> None:
    (event,) = ingest_all("loom-export", [b'{"RunStart":{"run_id":"run-1","agent":"react"}}'])
    assert event.type == "run.lifecycle" and event.run_id == "run-1"
    (reply,) = ingest_all("loom-export", [b'{"Reply":{"reply":"done"}}'])
    assert reply.type == "x.loom.reply"


@pytest.mark.parametrize(
    ("frame", "error", "field"),
    [
        (b"{}", MalformedFrame, "$"),
        (b'{"RunStart":{},"Messages":{}}', MalformedFrame, "$"),
        (b'{"Teleport":{}}', UnknownEventType, "$.Teleport"),
        (b'{"Messages":"hi"}', MalformedFrame, "$.Messages"),
        (b'{"Messages":{"type":"x","content":"hi"}}', MalformedFrame, "$.Messages.type"),
        (b'{"Messages":{"id":"n"}}', MalformedFrame, "$.Messages.content"),
        (b'{"Reply":{}}', MalformedFrame, "$.Reply.reply"),
        (b'{"type":"run_start"}', UnknownEventType, "$.type"),
    ],
)
def test_bad_frames_are_rejected_with_code_and_field(
    frame: bytes, error: type[ProtocolError], field: str
) -> None:
    caught, codec = rejected("loom-export", frame, error)
    assert caught.field == field
    assert codec.feed(b'{"Messages":{"content":"next"}}')[0].payload_dict() == {"text": "next"}


def test_foreign_stream_egresses_as_single_key_frames() -> None:
    frames = koder_sample_as("loom-export")
    assert all(len(f) == 1 and next(iter(f)) in EXPORT_KEYS.values() for f in frames)
