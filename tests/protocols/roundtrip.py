"""Helpers for the Koder agent stream §7 T1 tests of the JSON-frame codecs: F → canonical → F."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.core.errors import ProtocolError
from runwire.protocols import egress, ingest
from runwire.protocols.base import Ingest
from runwire.protocols.framediff import same

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SAMPLES = {
    "koder": "koder/sample_run.ndjson",
    "loom": "loom/sample_run.ndjson",
    "loom-export": "loom-export/sample_run.ndjson",
    "loom-mcp": "loom-mcp/sample_run.ndjson",
    "cogency": "cogency/conversation.ndjson",
    "cogency-wire": "cogency-wire/multi_tool.txt",
}
"""One sample run per ingest format, under ``FIXTURES``."""


def fixture_lines(fmt: str, name: str) -> list[bytes]:
    """The non-blank lines of ``tests/fixtures/<fmt>/<name>``."""
    text = (FIXTURES / fmt / name).read_bytes()
    return [line for line in text.splitlines() if line.strip()]


def fixture_names(fmt: str) -> list[str]:
    return sorted(p.name for p in (FIXTURES / fmt).glob("*.ndjson"))


def ingest_all(fmt: str, lines: list[bytes], **options: Any) -> list[Event]:
    codec = ingest(fmt, **options)
    events: list[Event] = []
    for line in lines:
        events.extend(codec.feed(line))
    return events


def through_koder(events: list[Event]) -> list[Event]:
    """Each event encoded as canonical JSON and decoded again (what the bus carries)."""
    return [envelope.decode(envelope.encode(event)) for event in events]


def egress_all(fmt: str, events: list[Event], *, finish: bool = False) -> list[dict[str, Any]]:
    codec = egress(fmt)
    frames: list[Any] = []
    for event in events:
        frames.extend(codec.convert(event))
    if finish:
        frames.extend(codec.finish())
    return [msgspec.json.decode(msgspec.json.encode(frame)) for frame in frames]


def koder_sample_as(fmt: str) -> list[dict[str, Any]]:
    """The koder sample run (a foreign stream to ``fmt``) egressed as ``fmt``, ``finish()``
    included, checked to be ``fmt`` a reader accepts: each frame ingests again as one event."""
    events = ingest_all("koder", fixture_lines("koder", "sample_run.ndjson"))
    frames = egress_all(fmt, events, finish=True)
    assert len(ingest_all(fmt, [msgspec.json.encode(f) for f in frames])) == len(frames)
    return frames


def rejected(fmt: str, frame: bytes, error: type[ProtocolError]) -> tuple[ProtocolError, Ingest]:
    """What a fresh ``fmt`` ingest raised for one bad ``frame`` (it must be ``error``), and the
    codec, to show it goes on."""
    codec = ingest(fmt)
    with pytest.raises(error) as caught:
        codec.feed(frame)
    return caught.value, codec


def assert_same_frames(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Frame for frame, field for field, JSON types included (1 ≠ 1.0 ≠ true)."""
    assert len(got) == len(want), f"{len(got)} frames, expected {len(want)}"
    for number, (a, b) in enumerate(zip(got, want, strict=True), start=1):
        assert same(a, b), f"frame {number} differs:\n got {a}\nwant {b}"


def round_trip(fmt: str, lines: list[bytes]) -> None:
    """T1: every frame of ``lines`` survives F → koder JSON → F exactly."""
    source = [msgspec.json.decode(line) for line in lines]
    events = through_koder(ingest_all(fmt, lines))
    assert_same_frames(egress_all(fmt, events, finish=True), source)
