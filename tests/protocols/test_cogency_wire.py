"""``cogency-wire``: the incremental parser of the Cogency streaming protocol's LLM wire protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.core import envelope
from runwire.protocols import egress, ingest

FIXTURES = Path(__file__).parent.parent / "fixtures" / "cogency-wire"
FIXTURE_FILES = sorted(FIXTURES.glob("*.txt"))
TS = "2026-01-01T00:00:00.000Z"


def parse(chunks: list[bytes]) -> list[envelope.Event]:
    codec = ingest("cogency-wire", run_id="w", clock=lambda: TS)
    assert codec.line_based is False
    out: list[envelope.Event] = []
    for chunk in chunks:
        out.extend(codec.feed(chunk))
    out.extend(codec.close())
    return out


def summary(events: list[envelope.Event]) -> list[tuple[str, Any]]:
    """Deltas merged per run of the same type; other events as (type, payload)."""
    out: list[tuple[str, Any]] = []
    for event in events:
        if event.type in envelope.DELTA_TYPES and out and out[-1][0] == event.type:
            out[-1] = (event.type, out[-1][1] + event.payload_dict()["text"])
        elif event.type in envelope.DELTA_TYPES:
            out.append((event.type, event.payload_dict()["text"]))
        else:
            out.append((event.type, event.payload_dict()))
    return out


def test_single_tool_example() -> None:
    """The Cogency streaming protocol's "Single tool call" example: think, one call + execute, its result, then plain text."""
    events = parse([(FIXTURES / "single_tool.txt").read_bytes()])
    assert summary(events) == [
        ("reasoning.delta", "I should check what files exist first."),
        ("tool.start", {"call_id": "w.call.1", "tool": "list", "input": {"path": "."}}),
        ("x.cogency.execute", {}),
        ("tool.end", {"call_id": "w.call.1", "ok": True, "output": ["main.py", "config.json", "README.md"]}),
        ("text.delta", "I found 3 files: main.py, config.json, README.md"),
    ]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_multiple_sequential_tools_pair_results_in_order() -> None:
    events = parse([(FIXTURES / "multi_tool.txt").read_bytes()])
    starts = [e for e in events if isinstance(e, envelope.ToolStart)]
    ends = [e for e in events if isinstance(e, envelope.ToolEnd)]
    assert [s.payload.tool for s in starts] == ["list", "read"]
    assert [e.payload.call_id for e in ends] == [s.payload.call_id for s in starts]
    assert ends[1].payload.output == '{"type": "module", "main": "index.js"}'
    assert summary(events)[-1] == ("text.delta", "This is a Node.js project with Express configuration.")


def test_simple_respond() -> None:
    events = parse([(FIXTURES / "simple.txt").read_bytes()])
    assert summary(events) == [
        ("text.delta", "Python is a programming language created by Guido van Rossum."),
    ]


def test_invalid_json_in_execute_is_an_error_event_and_parsing_continues() -> None:
    """Cogency streaming protocol: "Invalid JSON is an error: Parser rejects and reports error" — an event, not a crash."""
    events = parse([(FIXTURES / "invalid_execute.txt").read_bytes()])
    kinds = [e.type for e in events]
    assert kinds == [
        "reasoning.delta", "x.cogency.error", "tool.start", "x.cogency.execute", "tool.end", "text.delta",
    ]
    error = events[1].payload_dict()["payload"]
    assert error["error"].startswith("invalid JSON in <execute>")
    assert error["block"] == '[{"name": "read", "args": {"file": '
    end = events[4]
    assert isinstance(end, envelope.ToolEnd)
    assert (end.payload.ok, end.payload.error, end.payload.call_id) == (False, "failure", "w.call.1")
    assert summary(events)[0] == ("reasoning.delta", "Let me try a call — with unicode ✓.")


def test_text_streams_before_the_closing_tag() -> None:
    """Deltas are emitted as soon as they are known, not when </think> arrives."""
    codec = ingest("cogency-wire", run_id="w", clock=lambda: TS)
    first = codec.feed(b"<think>step one")
    assert [(e.type, e.payload_dict()) for e in first] == [("reasoning.delta", {"text": "step one"})]
    second = codec.feed(b" and two")
    assert [e.payload_dict()["text"] for e in second] == [" and two"]
    assert codec.feed(b"</thi") == []  # a marker prefix is held back, nothing else
    rest = codec.feed(b"nk>done")
    assert [e.type for e in rest] == ["text.delta"]


def test_marker_split_at_every_byte() -> None:
    text = (FIXTURES / "single_tool.txt").read_bytes()
    expected = summary(parse([text]))
    for cut in range(1, len(text)):
        assert summary(parse([text[:cut], text[cut:]])) == expected, cut


def test_utf8_split_inside_a_character() -> None:
    text = "<respond>héllo ✓ wörld</respond>".encode()
    one_byte_chunks = [text[i : i + 1] for i in range(len(text))]
    assert summary(parse(one_byte_chunks)) == [("text.delta", "héllo ✓ wörld")]


def test_unterminated_execute_is_reported_on_close() -> None:
    events = parse([b'<execute>[{"name": "x"'])
    assert [e.type for e in events] == ["x.cogency.error"]
    assert "unterminated <execute>" in events[0].payload_dict()["payload"]["error"]


def test_a_lone_angle_bracket_is_text() -> None:
    assert summary(parse([b"if a <", b" b then <thin"])) == [("text.delta", "if a < b then <thin")]


def test_wire_events_render_as_cogency_events() -> None:
    """Parsed wire text converts to the cogency event stream (call/execute/result/respond)."""
    out = egress("cogency")
    frames = [f for e in parse([(FIXTURES / "single_tool.txt").read_bytes()]) for f in out.convert(e)]
    assert [f["type"] for f in frames] == ["think", "call", "execute", "result", "respond"]
    assert frames[1]["content"] == '{"name": "list", "args": {"path": "."}}'


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_chunking_yields_the_same_events(path: Path, data: st.DataObject) -> None:
    """Property: however the bytes are chunked, the events and their concatenated content are the same."""
    text = path.read_bytes()
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=20)))
    bounds = [0, *cuts, len(text)]
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert summary(parse(chunks)) == summary(parse([text]))


@settings(max_examples=150, deadline=None)
@given(
    parts=st.lists(
        st.sampled_from(["<think>", "</think>", "<respond>", "</respond>", "<execute>", "</execute>",
                         "<results>", "</results>", '[{"name": "a", "args": {}}]', "[1]", "{bad", " ", "\n",
                         "<", "x", "é", "✓", "hello world"]),
        max_size=25,
    ),
    data=st.data(),
)
def test_any_chunking_of_arbitrary_wire_text(parts: list[str], data: st.DataObject) -> None:
    """The same property over generated (often malformed) wire text: no crash, chunking irrelevant."""
    text = "".join(parts).encode()
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=12))) if text else []
    bounds = [0, *cuts, len(text)]
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert summary(parse(chunks)) == summary(parse([text]))
