"""Codec throughput: decode+validate and encode, canonical envelope and every codec.

Run: ``.venv/bin/python bench/codec.py [--quick] [--json]``

Figures are medians of ``--repeat`` rounds, in events (or frames) per CPU-second
of this process — the machine is shared, and wall time would measure the
neighbours; runwire and the baseline run interleaved, round by round:

* canonical decode+validate, batch — :func:`runwire.core.envelope.decode_lines` on
  NDJSON batches of 1000 frames (how the bus and the replay import read);
* canonical decode+validate, per frame — :func:`runwire.core.envelope.decode`;
* baseline — stdlib ``json.loads`` per line plus hand-written validation of the
  same fields and the same rules (types, required fields, RFC 3339 pattern,
  enum values, no unknown fields), measured in the same run on the same data;
* canonical encode — :func:`runwire.core.envelope.encode` vs ``json.dumps`` of the
  equivalent dict; and a stream's events at once (``STREAM_EVENTS`` of them,
  :func:`runwire.core.lines.encode_lines`, as a worker's write encodes each stream);
* each ingest codec (frames/s through ``feed``) and each egress codec
  (events/s through ``encode``) on realistic sample runs from ``tests/fixtures``.

``--json`` prints one JSON object (keys include ``decode_per_s`` — the batch
figure — and ``baseline_decode_per_s``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_args

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runwire.core import envelope  # noqa: E402
from runwire.core.envelope import Event  # noqa: E402
from runwire.core.lines import encode_lines as lines_of  # noqa: E402
from runwire.protocols import EGRESS, INGEST, egress, ingest  # noqa: E402
from tests.protocols.roundtrip import FIXTURES, SAMPLES  # noqa: E402

BATCH = 1000
"""Frames per batch for batch decoding (a bus read of 1000 entries)."""
STREAM_EVENTS = 40
"""Events of one stream in one worker write (the worker bench: ~5,900 events over ~430 streams, raw and shaped)."""


# ------------------------------------------------------------------ data


def canonical_events(count: int) -> list[Event]:
    """A delta-heavy mix like a real run: 80% deltas, then tools, steps, lifecycle.

    Every event has its own timestamp (the worst case for the envelope's
    once-per-distinct-timestamp check)."""
    out: list[Event] = []
    start = datetime(2026, 5, 14, 19, 42, 13, tzinfo=UTC)
    for seq in range(1, count + 1):
        common = {
            "id": f"evt_01HZ7K4P{seq:018d}",
            "ts": envelope.format_ts(start + timedelta(milliseconds=seq)),  # all distinct
            "run_id": "run_01HZ7K3M",
            "seq": seq,
        }
        slot = seq % 20
        if slot < 10:
            out.append(
                envelope.make("text.delta", {"text": "I'll compare the three options"}, **common)
            )
        elif slot < 16:
            out.append(
                envelope.make("reasoning.delta", {"text": "Let me check the prices"}, **common)
            )
        elif slot == 16:
            call = {
                "call_id": f"call_{seq}",
                "tool": "browser.navigate",
                "input": {"url": "https://example.com"},
            }
            out.append(envelope.make("tool.start", call, **common))
        elif slot == 17:
            end = {
                "call_id": f"call_{seq}",
                "ok": True,
                "output": {"title": "Example"},
                "duration_ms": 1842,
            }
            out.append(envelope.make("tool.end", end, **common))
        elif slot == 18:
            out.append(
                envelope.make(
                    "step.boundary", {"step_index": seq, "step_kind": "tool-roundtrip"}, **common
                )
            )
        else:
            out.append(envelope.make("run.lifecycle", {"state": "running"}, **common))
    return out


# ------------------------------------------------------------------ baseline

_TS = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")
_ENVELOPE_KEYS = {
    "id",
    "ts",
    "type",
    "run_id",
    "seq",
    "payload",
    "child_id",
    "ext",
    "span",
    "parent_id",
    "root_id",
    "tenant",
}
_STATES = set(get_args(envelope.LifecycleState))
_KINDS = set(get_args(envelope.StepKind))


def _fail(why: str) -> None:
    raise ValueError(why)


def _text_ok(p: dict[str, Any]) -> None:
    if p.keys() != {"text"} or not isinstance(p["text"], str):
        _fail("payload.text")


def _tool_start_ok(p: dict[str, Any]) -> None:
    if not isinstance(p.get("call_id"), str) or not isinstance(p.get("tool"), str):
        _fail("payload.call_id/tool")
    if not p.keys() <= {"call_id", "tool", "input", "skill_id"}:
        _fail("payload: unknown field")


def _tool_end_ok(p: dict[str, Any]) -> None:
    if not isinstance(p.get("call_id"), str) or not isinstance(p.get("ok"), bool):
        _fail("payload.call_id/ok")
    d = p.get("duration_ms")
    if d is not None and (not isinstance(d, int) or isinstance(d, bool)):
        _fail("payload.duration_ms")
    if not p.keys() <= {"call_id", "ok", "output", "error", "duration_ms", "blob_ref"}:
        _fail("payload: unknown field")


def _step_ok(p: dict[str, Any]) -> None:
    i = p.get("step_index")
    if not isinstance(i, int) or isinstance(i, bool) or p.get("step_kind") not in _KINDS:
        _fail("payload.step")
    if not p.keys() <= {"step_index", "step_kind", "checkpoint_id"}:
        _fail("payload: unknown field")


def _lifecycle_ok(p: dict[str, Any]) -> None:
    if p.get("state") not in _STATES or not p.keys() <= {"state", "reason", "dropped_count"}:
        _fail("payload.state")


_PAYLOAD_CHECKS: dict[Any, Callable[[dict[str, Any]], None]] = {
    "text.delta": _text_ok,
    "reasoning.delta": _text_ok,
    "tool.start": _tool_start_ok,
    "tool.end": _tool_end_ok,
    "step.boundary": _step_ok,
    "run.lifecycle": _lifecycle_ok,
}


def baseline_decode(line: bytes) -> dict[str, Any]:
    """json.loads + validation of the same fields and rules the envelope enforces."""
    frame = json.loads(line)
    if not isinstance(frame, dict) or not frame.keys() <= _ENVELOPE_KEYS:
        _fail("frame")
    ident, ts, run_id, seq = frame.get("id"), frame.get("ts"), frame.get("run_id"), frame.get("seq")
    if not isinstance(ident, str) or not 0 < len(ident) <= 128:
        _fail("id")
    if not isinstance(ts, str) or len(ts) > 40 or not _TS.match(ts):
        _fail("ts")
    if not isinstance(run_id, str) or not 0 < len(run_id) <= 256:
        _fail("run_id")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        _fail("seq")
    child = frame.get("child_id")
    if child is not None and not isinstance(child, str):
        _fail("child_id")
    payload = frame.get("payload")
    if not isinstance(payload, dict):
        _fail("payload")
    check = _PAYLOAD_CHECKS.get(frame.get("type"))
    if check is None:
        _fail("type")
    else:
        check(payload)
    return frame


# ------------------------------------------------------------------ timing


def rate(work: Callable[[], int], repeat: int) -> float:
    """Median items per CPU-second of ``work`` (which returns how many items it did).

    CPU time of this process, not wall time: the codecs are single-threaded
    and do no I/O, and on a shared machine wall time measures the neighbours.
    """
    return rates({"work": work}, repeat)["work"]


def rates(works: dict[str, Callable[[], int]], repeat: int) -> dict[str, float]:
    """:func:`rate` of several works, interleaved round by round so that a
    change in machine load hits all of them alike (runwire and its baseline)."""
    figures: dict[str, list[float]] = {name: [] for name in works}
    for _ in range(repeat):
        for name, work in works.items():
            start = time.process_time()
            items = work()
            figures[name].append(items / max(time.process_time() - start, 1e-9))
    return {name: statistics.median(values) for name, values in figures.items()}


def _guarded(name: str, work: Callable[[], int], repeat: int) -> float | None:
    """:func:`rate` of one codec; a codec that fails is reported, not fatal."""
    try:
        return rate(work, repeat)
    except Exception as exc:  # report it and go on with the other codecs
        print(f"{name}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def canonical_figures(count: int, repeat: int) -> dict[str, float]:
    events = canonical_events(count)
    lines = [envelope.encode(e) for e in events]
    batches = [b"\n".join(lines[i : i + BATCH]) + b"\n" for i in range(0, len(lines), BATCH)]
    dicts = [envelope.to_builtins(e) for e in events]
    assert [e for b in batches for e in envelope.decode_lines(b)] == events
    assert [baseline_decode(line) for line in lines] == [json.loads(line) for line in lines]

    def batch_decode() -> int:
        decode_lines = envelope.decode_lines
        for batch in batches:
            decode_lines(batch)
        return len(lines)

    def single_decode() -> int:
        decode = envelope.decode
        for line in lines:
            decode(line)
        return len(lines)

    def base_decode() -> int:
        for line in lines:
            baseline_decode(line)
        return len(lines)

    def encode() -> int:
        enc = envelope.encode
        for event in events:
            enc(event)
        return len(events)

    streams = [events[i : i + STREAM_EVENTS] for i in range(0, len(events), STREAM_EVENTS)]
    assert [lines_of(stream).joined for stream in streams] == [
        b"\n".join(lines[i : i + STREAM_EVENTS]) for i in range(0, len(lines), STREAM_EVENTS)]

    def encode_streams() -> int:
        for stream in streams:
            lines_of(stream)
        return len(events)

    def base_encode() -> int:
        dumps = json.dumps
        for d in dicts:
            dumps(d, separators=(",", ":")).encode()
        return len(dicts)

    return {
        **rates(
            {
                "decode_per_s": batch_decode,
                "decode_single_per_s": single_decode,
                "baseline_decode_per_s": base_decode,
                "encode_per_s": encode,
                "encode_stream_per_s": encode_streams,
                "baseline_encode_per_s": base_encode,
            },
            repeat,
        )
    }


def ingest_figures(frames: int, repeat: int) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in INGEST:
        data = (FIXTURES / SAMPLES[name]).read_bytes()
        units = [line for line in data.splitlines(keepends=True) if line.strip()]
        if name != "cogency-wire":
            units = [line.strip() for line in units]
        copies = max(1, frames // len(units))

        def work(units: list[bytes] = units, copies: int = copies, name: str = name) -> int:
            n = 0
            for _ in range(copies):
                codec = ingest(name, run_id="bench")
                for unit in units:
                    codec.feed(unit)
                codec.close()
                n += len(units)
            return n

        out[name] = _guarded(name, work, repeat)
    return out


def egress_figures(frames: int, repeat: int) -> dict[str, float | None]:
    codec = ingest("koder")
    sample = [
        e
        for line in (FIXTURES / SAMPLES["koder"]).read_bytes().splitlines()
        for e in codec.feed(line)
    ]
    copies = max(1, frames // len(sample))
    out: dict[str, float | None] = {}
    for name in EGRESS:

        def work(name: str = name) -> int:
            for _ in range(copies):
                enc = egress(name)
                for event in sample:
                    enc.encode(event)
                enc.finish()
            return copies * len(sample)

        out[name] = _guarded(name, work, repeat)
    return out


def _figure(value: float | None) -> str:
    return "      failed" if value is None else f"{value:>12,.0f} /s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data, fewer repeats")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeat", type=int, default=None)
    args = parser.parse_args()
    count, frames, repeat = (20_000, 2_000, 3) if args.quick else (100_000, 5_000, 5)
    repeat = args.repeat or repeat
    result: dict[str, Any] = canonical_figures(count, repeat)
    result["decode_vs_baseline"] = result["decode_per_s"] / result["baseline_decode_per_s"]
    result["decode_single_vs_baseline"] = (
        result["decode_single_per_s"] / result["baseline_decode_per_s"]
    )
    result["encode_vs_baseline"] = result["encode_per_s"] / result["baseline_encode_per_s"]
    result["ingest_frames_per_s"] = ingest_figures(frames, repeat)
    result["egress_events_per_s"] = egress_figures(frames, repeat)
    result["events"] = count
    result["repeat"] = repeat
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return
    print(f"canonical envelope, {count} events, median of {repeat}")
    print(
        f"  decode+validate batch       {result['decode_per_s']:>12,.0f} /s  ({result['decode_vs_baseline']:.1f}x baseline)"
    )
    print(
        f"  decode+validate per frame   {result['decode_single_per_s']:>12,.0f} /s  ({result['decode_single_vs_baseline']:.1f}x baseline)"
    )
    print(f"  baseline json.loads+checks  {result['baseline_decode_per_s']:>12,.0f} /s")
    print(
        f"  encode                      {result['encode_per_s']:>12,.0f} /s  ({result['encode_vs_baseline']:.1f}x baseline)"
    )
    print(f"  encode, {STREAM_EVENTS} at once          {result['encode_stream_per_s']:>12,.0f} /s")
    print(f"  baseline json.dumps         {result['baseline_encode_per_s']:>12,.0f} /s")
    print("ingest codecs (frames/s through feed)")
    for name, value in result["ingest_frames_per_s"].items():
        print(f"  {name:<14} {_figure(value)}")
    print("egress codecs (events/s through encode)")
    for name, value in result["egress_events_per_s"].items():
        print(f"  {name:<14} {_figure(value)}")


if __name__ == "__main__":
    main()
