"""``runwire convert``: every ingest format to every egress format, bad lines reported."""

from __future__ import annotations

import msgspec
import pytest
from click.testing import CliRunner

from runwire.core import envelope
from runwire.protocols import EGRESS, INGEST
from runwire.protocols.framediff import same
from runwire.workers.cli import main
from tests.protocols.roundtrip import FIXTURES, SAMPLES


def _run(*args: str, stdin: bytes | None = None) -> tuple[int, bytes, str]:
    result = CliRunner().invoke(main, ["convert", *args], input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout_bytes, result.stderr


def _objects(stdout: bytes) -> list[dict[str, object]]:
    frames = [msgspec.json.decode(line) for line in stdout.splitlines()]
    assert frames, "no output"
    assert all(isinstance(frame, dict) for frame in frames)
    return frames


def test_every_ingest_format_has_a_sample() -> None:
    assert set(SAMPLES) == set(INGEST)


@pytest.mark.parametrize("target", sorted(EGRESS))
@pytest.mark.parametrize("source", sorted(SAMPLES))
def test_every_ingest_format_converts_to_every_egress_format(source: str, target: str) -> None:
    """Each pair writes one JSON object a line and exits 0 on valid input."""
    code, out, err = _run("--from", source, "--to", target, str(FIXTURES / SAMPLES[source]))
    assert (code, err) == (0, "")
    frames = _objects(out)
    if target == "koder":
        events = [envelope.decode(line) for line in out.splitlines()]
        assert len(events) == len(frames)


@pytest.mark.parametrize("source", sorted(SAMPLES))
def test_auto_detection_reads_stdin(source: str) -> None:
    stdin = (FIXTURES / SAMPLES[source]).read_bytes()
    code, auto_out, _ = _run("--to", "koder", stdin=stdin)
    _, explicit_out, _ = _run("--from", source, "--to", "koder", stdin=stdin)
    assert code == 0
    strip = [
        {k: v for k, v in f.items() if k not in ("id", "ts")} for f in _objects(auto_out)
    ]  # ids and ingest-time stamps differ between runs
    assert strip == [
        {k: v for k, v in f.items() if k not in ("id", "ts")} for f in _objects(explicit_out)
    ]


@pytest.mark.parametrize("fmt", ["loom", "loom-export", "loom-mcp", "koder"])
def test_t1_through_the_command(fmt: str) -> None:
    """F → koder → F with two runs of the command reproduces the file frame for frame."""
    source = (FIXTURES / SAMPLES[fmt]).read_bytes()
    _, canonical, _ = _run("--from", fmt, "--to", "koder", stdin=source)
    code, back, err = _run("--from", "koder", "--to", fmt, stdin=canonical)
    assert (code, err) == (0, "")
    want = [msgspec.json.decode(line) for line in source.splitlines() if line.strip()]
    got = _objects(back)
    assert len(got) == len(want)
    assert all(same(a, b) for a, b in zip(got, want, strict=True))


def test_bad_lines_are_reported_with_line_number_and_code_and_the_rest_is_written() -> None:
    stdin = b"\n".join(
        [
            b'{"type":"run_start","run_id":"run-1"}',
            b"this is not json",
            b'{"type":"message_chunk","content":"kept","id":"n"}',
            b'{"type":"teleport"}',
            b"",
            b'{"type":"message_chunk","id":"n"}',
            b'{"type":"message_chunk","content":" also kept","id":"n"}',
        ]
    )
    code, out, err = _run("--from", "loom", "--to", "koder", stdin=stdin)
    assert code == 1
    lines = err.splitlines()
    assert lines[0].startswith("line 2: KAI-STREAM-PROTO-0001: not valid JSON")
    assert lines[1].startswith("line 4: KAI-STREAM-PROTO-0002: unknown loom event type 'teleport'")
    assert lines[2].startswith(
        "line 6: KAI-STREAM-PROTO-0001: message_chunk: missing required field `content`"
    )
    assert lines[2].endswith("at `$.content`")
    assert len(lines) == 3
    texts = [
        e.payload_dict() for e in map(envelope.decode, out.splitlines()) if e.type == "text.delta"
    ]
    assert texts == [{"text": "kept"}, {"text": " also kept"}]


def test_bad_canonical_frames_are_reported_too() -> None:
    stdin = (
        b'{"id":"e1","ts":"2026-01-01T00:00:00Z","type":"nope","run_id":"r","seq":1,"payload":{}}\n'
    )
    code, out, err = _run("--from", "koder", "--to", "loom", stdin=stdin)
    assert code == 1 and out == b""
    assert err.startswith("line 1: KAI-STREAM-PROTO-0002")


def test_undetectable_input_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["convert", "--to", "koder"], input=b"just words\n")
    assert result.exit_code == 2
    assert "cannot detect the input format" in result.stderr


def test_koder_to_koder_keeps_explicit_nulls_and_leaves_out_what_was_absent() -> None:
    """Koder agent stream §2: the envelope example carries ``"child_id": null``; a payload's
    explicit nulls (``reason``, ``error`` …) come back as null, fields left out stay out."""
    frames = [
        {"id": "e1", "ts": "2026-01-01T00:00:00Z", "type": "run.lifecycle", "run_id": "r",
         "child_id": None, "seq": 1, "payload": {"state": "error", "reason": None, "dropped_count": None}},
        {"id": "e2", "ts": "2026-01-01T00:00:00Z", "type": "tool.end", "run_id": "r", "seq": 2,
         "payload": {"call_id": "c", "ok": False, "output": None, "error": None}},
        {"id": "e3", "ts": "2026-01-01T00:00:00Z", "type": "child.spawn", "run_id": "r", "seq": 3,
         "child_id": None, "payload": {"child_id": "k", "prompt": None, "tools_allowed": None}},
        {"id": "e4", "ts": "2026-01-01T00:00:00Z", "type": "x.usage", "run_id": "r", "seq": 4,
         "payload": {"input_tokens": 1, "model": None}},
        {"id": "e5", "ts": "2026-01-01T00:00:00Z", "type": "run.lifecycle", "run_id": "r", "seq": 5,
         "payload": {"state": "done"}},
    ]
    stdin = b"\n".join(msgspec.json.encode(frame) for frame in frames)
    code, out, err = _run("--from", "koder", "--to", "koder", stdin=stdin)
    assert (code, err) == (0, "")
    assert _objects(out) == frames
