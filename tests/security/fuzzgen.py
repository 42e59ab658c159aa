"""Hypothesis strategies for the fuzz suite: canonical frames valid and hostile, and hostile lines
of every ingest format (sample frames with one field swapped for something nasty)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from hypothesis import strategies as st

from runwire.core import envelope
from runwire.core.envelope import MAX_DEPTH, MAX_FRAME_BYTES, Event

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SAMPLES = {
    "koder": ["koder/sample_run.ndjson", "koder/spec_examples.ndjson"],
    "loom": ["loom/sample_run.ndjson", "loom/spec_with_envelope.ndjson", "loom/tot_got.ndjson"],
    "loom-export": ["loom-export/sample_run.ndjson", "loom-export/tot_got.ndjson"],
    "loom-mcp": ["loom-mcp/sample_run.ndjson", "loom-mcp/spec_types.ndjson"],
    "cogency": ["cogency/conversation.ndjson", "cogency/tools_failing.ndjson"],
    "cogency-wire": ["cogency-wire/multi_tool.txt", "cogency-wire/single_tool.txt"],
}
_json = msgspec.json.Encoder()
TS = "2026-05-14T19:42:13.000Z"


def sample_lines(format_name: str) -> list[bytes]:
    lines: list[bytes] = []
    for name in SAMPLES[format_name]:
        lines += [line for line in (FIXTURES / name).read_bytes().splitlines() if line.strip()]
    return lines


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 63) - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def deep(depth: int) -> msgspec.Raw:
    return msgspec.Raw(b'{"a":' * depth + b"1" + b"}" * depth)


hostile_values = st.one_of(
    st.integers(MAX_DEPTH - 1, 30_000).map(deep),
    st.integers(1 << 63, 1 << 90),
    st.integers(-(1 << 90), -1),
    st.just(msgspec.Raw(b"1e999")),
    st.text(min_size=1, max_size=8).map(lambda s: s * 3000),
)


@st.composite
def valid_event(draw: st.DrawFn, run_id: str, seq: int) -> Event:
    """One valid canonical event of ``run_id`` with publisher seq ``seq``."""
    kind = draw(st.sampled_from(
        ["text.delta", "reasoning.delta", "tool.start", "tool.end", "step.boundary",
         "run.lifecycle", "x.usage", "x.fuzz.thing"]
    ))
    payload: dict[str, Any]
    if kind.endswith(".delta"):
        payload = {"text": draw(st.text(max_size=30))}
    elif kind == "tool.start":
        payload = {"call_id": draw(st.text(min_size=1, max_size=8)), "tool": "t", "input": draw(json_values)}
    elif kind == "tool.end":
        payload = {"call_id": "c", "ok": draw(st.booleans()), "output": draw(json_values),
                   "duration_ms": draw(st.integers(0, (1 << 63) - 1))}
    elif kind == "step.boundary":
        payload = {"step_index": draw(st.integers(0, 1 << 40)), "step_kind": "plan"}
    elif kind == "run.lifecycle":
        payload = {"state": draw(st.sampled_from(["planning", "running", "paused"]))}
    elif kind == "x.usage":
        payload = {"input_tokens": draw(st.integers(0, (1 << 63) - 1))}
    else:
        payload = {"v": draw(json_values)}
    return envelope.make(kind, payload, id=f"evt_{run_id}_{seq}", ts=TS, run_id=run_id, seq=seq)


@st.composite
def hostile_frame(draw: st.DrawFn, run_id: str) -> bytes:
    """A frame no worker may carry: broken JSON, wrong shapes, numbers and depths out of range, too big.

    Never contains a line break, so it stays one line of an NDJSON body.
    """
    how = draw(st.sampled_from(["garbage", "field", "unknown", "missing", "oversize", "type"]))
    base: dict[str, Any] = {"id": "evt_hostile", "ts": TS, "type": "tool.start", "run_id": run_id,
                            "seq": draw(st.integers(1, 1000)), "payload": {"call_id": "c", "tool": "t"}}
    if how == "garbage":
        data = draw(st.binary(min_size=1, max_size=200).filter(
            lambda b: b.strip() and b"\n" not in b and b"\r" not in b))
        return data
    if how == "field":
        where = draw(st.sampled_from(["seq", "span", "input", "ext", "step"]))
        value = draw(hostile_values)
        if where == "seq":
            if isinstance(value, int | msgspec.Raw):
                base["seq"] = value
            else:
                base["seq"] = -1
        elif where == "span":
            base["span"] = [1, value] if isinstance(value, int) else [1, 1 << 64]
        elif where == "input":
            base["payload"]["input"] = value if isinstance(value, msgspec.Raw) else deep(MAX_DEPTH + 5)
        elif where == "ext":
            base["ext"] = {"koder": deep(draw(st.integers(MAX_DEPTH, 5000)))}
        else:
            base["type"] = "step.boundary"
            base["payload"] = {"step_index": value if isinstance(value, int) else -5, "step_kind": "plan"}
    elif how == "unknown":
        base["sneaky"] = draw(json_values)
    elif how == "missing":
        del base[draw(st.sampled_from(["id", "ts", "run_id", "seq", "payload"]))]
    elif how == "oversize":
        base["payload"]["input"] = "x" * (MAX_FRAME_BYTES + draw(st.integers(0, 100)))
    else:
        base["type"] = draw(st.sampled_from(["nope", "x.", "TOOL.START", "run.lifecycle"]))
    return _json.encode(base)


@st.composite
def koder_batch(draw: st.DrawFn, run_id: str) -> tuple[list[bytes], list[Event | None]]:
    """Frames of one run in publish order, and for each the event it must become (None: refused)."""
    count = draw(st.integers(1, 25))
    frames: list[bytes] = []
    expected: list[Event | None] = []
    seq = 0
    for _ in range(count):
        if draw(st.integers(0, 3)) == 0:
            frames.append(draw(hostile_frame(run_id)))
            expected.append(None)
        else:
            seq += 1
            event = draw(valid_event(run_id, seq))
            frames.append(envelope.encode(event))
            expected.append(event)
    return frames, expected


def _swap_field(frame: Any, path: list[Any], value: Any) -> Any:
    if not path:
        return value
    head, *rest = path
    copy = dict(frame) if isinstance(frame, dict) else list(frame)
    copy[head] = _swap_field(copy[head], rest, value)
    return copy


def _paths(value: Any, prefix: list[Any]) -> list[list[Any]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, [*prefix, key])
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += _paths(child, [*prefix, index])
    return out


@st.composite
def format_line(draw: st.DrawFn, format_name: str) -> bytes:
    """A sample line of the format, as it is or with one field swapped for a hostile value."""
    line = draw(st.sampled_from(sample_lines(format_name)))
    if format_name == "cogency-wire" or draw(st.integers(0, 2)) == 0:
        return line
    frame = msgspec.json.decode(line)
    paths = _paths(frame, [])
    if not paths:
        return line
    path = draw(st.sampled_from(paths))
    return _json.encode(_swap_field(frame, path, draw(st.one_of(hostile_values, json_values))))
