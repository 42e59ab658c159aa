"""Realistic canonical runs used by the egress codec tests.

Each builder returns the delivery view of one run: seq contiguous from 1,
timestamps 50 ms apart, child events carrying ``child_id``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from runwire.core import envelope
from runwire.core.envelope import Event

START = datetime(2026, 5, 14, 19, 42, 13, tzinfo=UTC)


class Run:
    """Appends events to one run with contiguous seqs."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.events: list[Event] = []

    def add(self, kind: str, payload: dict[str, Any], *, child: str | None = None) -> Run:
        seq = len(self.events) + 1
        ts = envelope.format_ts(START + timedelta(milliseconds=50 * seq))
        extra: dict[str, Any] = {}
        if child is not None:
            extra = {"child_id": child, "parent_id": self.run_id, "root_id": self.run_id}
        self.events.append(
            envelope.make(kind, payload, id=f"evt_{seq:06d}", ts=ts, run_id=self.run_id, seq=seq, **extra)
        )
        return self

    def life(self, state: str, reason: str | None = None, *, child: str | None = None) -> Run:
        payload: dict[str, Any] = {"state": state}
        if reason is not None:
            payload["reason"] = reason
        return self.add("run.lifecycle", payload, child=child)

    def think(self, *texts: str, child: str | None = None) -> Run:
        for text in texts:
            self.add("reasoning.delta", {"text": text}, child=child)
        return self

    def say(self, *texts: str, child: str | None = None) -> Run:
        for text in texts:
            self.add("text.delta", {"text": text}, child=child)
        return self

    def tool(self, call_id: str, tool: str, args: Any, *, child: str | None = None) -> Run:
        return self.add("tool.start", {"call_id": call_id, "tool": tool, "input": args}, child=child)

    def result(self, call_id: str, output: Any = None, *, error: str | None = None, child: str | None = None) -> Run:
        payload: dict[str, Any] = {"call_id": call_id, "ok": error is None, "duration_ms": 12}
        if error is None:
            payload["output"] = output
        else:
            payload["error"] = error
        return self.add("tool.end", payload, child=child)

    def step(self, index: int, kind: str = "tool-roundtrip", *, child: str | None = None) -> Run:
        return self.add("step.boundary", {"step_index": index, "step_kind": kind}, child=child)


def tool_run() -> list[Event]:
    """Reasoning, text, a good and a failing tool call, steps, usage, done."""
    r = Run("run_tools").life("running")
    r.think("Let me check ", "the files.").say("I'll look around.")
    r.tool("call_1", "fs.list", {"path": "."}).result("call_1", ["a.py", "b.py"])
    r.tool("call_2", "fs.read", {"file": "missing.py"}).result("call_2", error="KAI-TOOL-0404: not found")
    r.step(1)
    r.think("Now summarise.").say("Found ", "two files; ", "one was missing.")
    r.add("x.usage", {"input_tokens": 120, "output_tokens": 40, "total_tokens": 160, "model": "m-1"})
    r.step(2, "text-only").life("done")
    return r.events


def plan_run() -> list[Event]:
    """A plan proposal, approval wait, then a short run."""
    r = Run("run_plan").life("planning")
    r.add("plan.proposal", {"plan": {"id": "plan_1", "steps": [
        {"id": "s1", "title": "Research candidate libraries", "intent": "research", "est_tools": ["web.search"]},
        {"id": "s2", "title": "Write benchmark harness", "intent": "write"},
    ], "est_total_cost_usd": 0.07}})
    r.life("awaiting_approval", "plan needs review").life("running")
    r.say("Researching.").tool("call_w", "web.search", {"q": "msgspec vs pydantic"})
    r.result("call_w", {"hits": 3}).step(1, "plan").say("Done.").life("done")
    return r.events


def child_run() -> list[Event]:
    """Two children spawned and fanned in, interleaved; one fails."""
    r = Run("run_parent").life("running").say("Splitting the work.").step(1, "fan-out")
    r.add("child.spawn", {"child_id": "run_c1", "prompt": "research A", "tools_allowed": ["web.search"]})
    r.add("child.spawn", {"child_id": "run_c2", "prompt": "research B"})
    r.life("running", child="run_c1").think("child one thinks", child="run_c1")
    r.say("child two ", child="run_c2").tool("c2_call", "web.search", {"q": "B"}, child="run_c2")
    r.say("child one says", child="run_c1").step(1, "text-only", child="run_c1")
    r.result("c2_call", error="timeout", child="run_c2").life("error", "tool failed", child="run_c2")
    r.life("done", child="run_c1")
    r.say("Merging.").step(2, "fan-in")
    r.add("x.loom.node_enter", {"node": "merge"})
    r.life("done")
    return r.events


def orphan_child_run() -> list[Event]:
    """Child events without a child.spawn, still open when the parent ends."""
    r = Run("run_orphan").say("parent text").say("orphan speaks", child="run_x")
    r.think("orphan thinks", child="run_x").say("parent again").life("done")
    return r.events


def aborted_run() -> list[Event]:
    """Cancelled mid-message."""
    r = Run("run_abort").life("running").think("hmm").say("Half a sent", "ence")
    r.add("run.lifecycle", {"state": "aborted", "reason": "user cancelled", "dropped_count": 3})
    return r.events


def error_run() -> list[Event]:
    """Fails with a tool call still open and reasoning open."""
    r = Run("run_error").life("running").tool("call_x", "shell", {"cmd": "make"}).think("waiting on make")
    r.add("x.gap", {"run_id": "run_error", "first": 5, "last": 6})
    r.life("error", "LLM call failed: API rate limit exceeded")
    return r.events


def unterminated_run() -> list[Event]:
    """Stops without a terminal event (the producer died)."""
    r = Run("run_dead").life("running").say("still typing").tool("call_y", "web.search", {"q": "x"})
    r.think("thinking").step(1).say("more")
    return r.events


RUNS: dict[str, Callable[[], list[Event]]] = {
    "tools": tool_run,
    "plan": plan_run,
    "children": child_run,
    "orphan_child": orphan_child_run,
    "aborted": aborted_run,
    "error": error_run,
    "unterminated": unterminated_run,
}


def cogency_runs() -> dict[str, list[Event]]:
    """The cogency spec examples (tests/fixtures/cogency) as canonical runs."""
    from pathlib import Path

    from runwire.protocols import ingest

    out: dict[str, list[Event]] = {}
    for path in sorted((Path(__file__).parent.parent / "fixtures" / "cogency").glob("*.ndjson")):
        codec = ingest("cogency", run_id=f"run_{path.stem}", clock=lambda: "2026-01-01T00:00:00.000Z")
        out[f"cogency:{path.stem}"] = [e for line in path.read_bytes().splitlines() if line.strip()
                                       for e in codec.feed(line)]
    return out


def cogency_wire_runs() -> dict[str, list[Event]]:
    """The cogency-wire spec examples (tests/fixtures/cogency-wire), parsed in 7-byte chunks."""
    from pathlib import Path

    from runwire.protocols import ingest

    out: dict[str, list[Event]] = {}
    for path in sorted((Path(__file__).parent.parent / "fixtures" / "cogency-wire").glob("*.txt")):
        codec = ingest("cogency-wire", run_id=f"run_{path.stem}", clock=lambda: "2026-01-01T00:00:00.000Z")
        data = path.read_bytes()
        events = [e for i in range(0, len(data), 7) for e in codec.feed(data[i : i + 7])]
        out[f"cogency-wire:{path.stem}"] = events + codec.close()
    return out


FOREIGN_FORMATS = ("koder", "loom", "loom-export", "loom-mcp")


def foreign_runs() -> dict[str, list[Event]]:
    """The other ingest formats' fixtures (tests/fixtures/<format>) as canonical streams.

    Frames a codec rejects on purpose (malformed-input fixtures) are left out;
    seqs are renumbered per stream as a delivery stream would be.
    """
    from pathlib import Path

    from runwire.core.errors import ProtocolError
    from runwire.protocols import ingest

    out: dict[str, list[Event]] = {}
    root = Path(__file__).parent.parent / "fixtures"
    for fmt in FOREIGN_FORMATS:
        for path in sorted((root / fmt).glob("*.ndjson")):
            codec = ingest(fmt, run_id=f"run_{path.stem}")
            events: list[Event] = []
            for line in path.read_bytes().splitlines():
                if not line.strip():
                    continue
                try:
                    events.extend(codec.feed(line))
                except ProtocolError:
                    continue
            events.extend(codec.close())
            out[f"{fmt}:{path.stem}"] = [
                envelope.replace(e, seq=i, run_id=events[0].run_id) for i, e in enumerate(events, 1)
            ]
    return out


def all_runs() -> dict[str, list[Event]]:
    return {
        **{name: build() for name, build in RUNS.items()},
        **cogency_runs(),
        **cogency_wire_runs(),
        **foreign_runs(),
    }


def stream(codec: str, events: list[Event]) -> list[Any]:
    """Every frame a client reading from the start gets, ``finish()`` included."""
    from runwire.protocols import egress

    encoder = egress(codec)
    frames = [frame for event in events for frame in encoder.convert(event)]
    return frames + encoder.finish()


def types(frames: list[dict[str, Any]]) -> list[str]:
    """The ``type`` of each frame (both strict formats name their frames so)."""
    return [f["type"] for f in frames]


def joined(codec: str, events: list[Event], n: int) -> list[Any]:
    """What a client joining after event ``n`` gets: preamble, then events n+1.., then ``finish()``.

    The encoder is primed with events 1..n (converted and discarded), as the
    edge's per-stream encoder would have been.
    """
    from runwire.protocols import egress

    encoder = egress(codec)
    for event in events[:n]:
        encoder.convert(event)
    frames = list(encoder.preamble())
    for event in events[n:]:
        frames.extend(encoder.convert(event))
    return frames + encoder.finish()


def random_run(seed: int, length: int = 40) -> list[Event]:
    """A pseudo-random but reproducible run: any mix of lanes, deltas, tools, steps and endings.

    Includes the awkward cases: results for calls never started, child events
    without a spawn, events after a child ended, events after the run ended.
    """
    import random

    rng = random.Random(seed)
    r = Run(f"run_rand{seed}")
    lanes: list[str | None] = [None, None, "run_k1", "run_k2", "run_k3"]
    pending: list[tuple[str, str | None]] = []
    for i in range(length):
        lane = rng.choice(lanes)
        roll = rng.random()
        if roll < 0.25:
            r.think(rng.choice(["a", "bb ", "", "ccc"]), child=lane)
        elif roll < 0.5:
            r.say(rng.choice(["x", "yy ", "", "zzz"]), child=lane)
        elif roll < 0.6:
            call = f"k{seed}_{i}"
            pending.append((call, lane))
            r.tool(call, rng.choice(["web.search", "fs.read"]), rng.choice([{"q": i}, None, [1, 2], "s"]), child=lane)
        elif roll < 0.68:
            call, call_lane = pending.pop(rng.randrange(len(pending))) if pending else (f"ghost{i}", lane)
            r.result(call, {"n": i}, error=rng.choice([None, "boom"]), child=call_lane)
        elif roll < 0.75:
            r.step(i, rng.choice(["tool-roundtrip", "text-only"]), child=lane)
        elif roll < 0.8:
            r.add("child.spawn", {"child_id": rng.choice(["run_k1", "run_k2", "run_k3"]), "prompt": "go"}, child=lane)
        elif roll < 0.85 and lane is not None:
            r.life(rng.choice(["done", "error", "aborted", "running"]), child=lane)
        elif roll < 0.9:
            if rng.random() < 0.5:
                r.add("x.usage", {"input_tokens": i, "output_tokens": 1, "total_tokens": i + 1}, child=lane)
            else:
                r.add("x.test.thing", {"i": i}, child=lane)
        elif roll < 0.93:
            r.add("plan.proposal", {"plan": {"id": f"p{i}", "steps": [{"id": "s", "title": "t"}]}})
        else:
            r.life(rng.choice(["running", "paused", "planning"]))
    ending = rng.choice(["done", "aborted", "error", None])
    if ending is not None:
        r.life(ending, rng.choice([None, "because"]))
        if rng.random() < 0.3:
            r.say("after the end")
    return r.events
